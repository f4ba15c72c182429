//! A fault-injecting TCP proxy on loopback, for putting real network faults between a Ferry
//! binary and a real server (a NameNode, an S3 endpoint):
//!
//! - **reset**: a real RST (`SO_LINGER` 0, then close) to both sides, either at a random point
//!   of a connection or right after a client request that contains a given byte pattern has
//!   been forwarded (the server does the work, the client never hears back: seed 001's
//!   ambiguous `complete()`);
//! - **hang**: the connection is accepted and then nothing, ever (no bytes forwarded either
//!   way; a TLS handshake never completes: seed 000);
//! - **silence**: right after a client request that contains a given byte pattern has been
//!   forwarded, the connection goes quiet both ways and stays open (the server acted on the
//!   request; its reply never comes): a NameNode that swallows one named RPC's answer;
//! - **trickle**: the server's bytes reach the client one small piece at a time.
//!
//! Every decision is counted, so a test can print and check what it injected.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to new connections (and, for `reset_on`, to requests).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Probability that a new connection is accepted and then left hanging.
    pub hang: f64,
    /// These connections (0 = the first the proxy accepts) hang, whatever the odds say.
    pub hang_connections: Vec<u64>,
    /// These connections are reset as soon as the client sends its first bytes (in the middle
    /// of a TLS handshake), whatever the odds say.
    pub reset_connections: Vec<u64>,
    /// Probability that a new connection trickles the server's bytes (64 B every 200 ms).
    pub trickle: f64,
    /// Probability that a new connection is reset after a random number of client bytes in
    /// `0..reset_within`.
    pub reset: f64,
    pub reset_within: u64,
    /// Reset right after forwarding a client read that contains this pattern, with this
    /// probability (counted once per matching read).
    pub reset_on: Option<(Vec<u8>, f64)>,
    /// More request rules: when a client read contains the pattern, with the probability, the
    /// connection goes on forwarding the client's bytes (not the server's) for 150 ms, then is
    /// reset (true) or goes silent (false): the server had the request, its reply is lost. The
    /// first rule that fires wins.
    pub on_request: Vec<(Vec<u8>, f64, bool)>,
    /// Random resets count the bytes of both directions (a reset can land in a reply too),
    /// not only the client's.
    pub reset_both_ways: bool,
    /// Faults only start after this many connections (let a warm-up through).
    pub after_connections: u64,
    /// The first connection whose client sends more than this many bytes stops forwarding
    /// there and hangs (mid-request, both ways); every later connection passes. Counted as a
    /// hang. For hedging: one upload stalls, its hedge on a new connection does not.
    pub stall_once_after: Option<u64>,
}

#[derive(Debug, Default)]
pub struct Counters {
    pub connections: AtomicU64,
    /// Connections open right now (forwarded, hung or not yet decided).
    pub open: std::sync::atomic::AtomicI64,
    pub resets: AtomicU64,
    pub pattern_resets: AtomicU64,
    pub hangs: AtomicU64,
    pub trickles: AtomicU64,
    /// Requests whose reply was swallowed (see `Faults::on_request`).
    pub silences: AtomicU64,
}

struct State {
    target: SocketAddr,
    faults: Mutex<Faults>,
    enabled: AtomicBool,
    counters: Counters,
    rng: Mutex<rand::rngs::StdRng>,
    /// Hung connections are kept open here until the proxy goes.
    hung: Mutex<Vec<TcpStream>>,
    stalled_once: AtomicBool,
    /// Bumped by [`FaultProxy::cut_all`]: every forwarded connection open then is reset.
    cut: tokio::sync::watch::Sender<u64>,
}

pub struct FaultProxy {
    pub addr: SocketAddr,
    state: Arc<State>,
    _rt: tokio::runtime::Runtime,
}

impl FaultProxy {
    /// A proxy to `target` on 127.0.0.1:<free port>, with faults off until [`FaultProxy::set`].
    pub fn start(target: SocketAddr, seed: u64) -> FaultProxy {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            target,
            faults: Mutex::new(Faults::default()),
            enabled: AtomicBool::new(false),
            counters: Counters::default(),
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
            hung: Mutex::new(Vec::new()),
            stalled_once: AtomicBool::new(false),
            cut: tokio::sync::watch::channel(0).0,
        });
        let st = state.clone();
        rt.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                let st = st.clone();
                tokio::spawn(async move { handle(st, client).await });
            }
        });
        FaultProxy { addr, state, _rt: rt }
    }

    pub fn set(&self, faults: Faults) {
        *self.state.faults.lock().unwrap() = faults;
        self.state.enabled.store(true, Ordering::SeqCst);
    }

    /// Resets every connection being forwarded now, as a server that goes away does (kept-alive
    /// connections included); new ones meet the faults set.
    pub fn cut_all(&self) {
        self.state.cut.send_modify(|n| *n += 1);
    }

    /// Stops injecting faults (connections already hung stay hung).
    pub fn clear(&self) {
        self.state.enabled.store(false, Ordering::SeqCst);
    }

    pub fn counters(&self) -> &Counters {
        &self.state.counters
    }

    /// Faults injected so far (resets of both kinds, hangs, trickles).
    pub fn injected(&self) -> u64 {
        let c = &self.state.counters;
        c.resets.load(Ordering::SeqCst)
            + c.pattern_resets.load(Ordering::SeqCst)
            + c.hangs.load(Ordering::SeqCst)
            + c.trickles.load(Ordering::SeqCst)
            + c.silences.load(Ordering::SeqCst)
    }

    pub fn summary(&self) -> String {
        let c = &self.state.counters;
        format!(
            "{} connections: {} random resets, {} request resets, {} silenced replies, {} hangs, {} trickles",
            c.connections.load(Ordering::SeqCst),
            c.resets.load(Ordering::SeqCst),
            c.pattern_resets.load(Ordering::SeqCst),
            c.silences.load(Ordering::SeqCst),
            c.hangs.load(Ordering::SeqCst),
            c.trickles.load(Ordering::SeqCst)
        )
    }
}

enum Plan {
    Pass,
    Hang,
    Trickle,
    ResetAfter(u64),
}

async fn handle(st: Arc<State>, client: TcpStream) {
    st.counters.open.fetch_add(1, Ordering::SeqCst);
    forward(&st, client).await;
    st.counters.open.fetch_sub(1, Ordering::SeqCst);
}

async fn forward(st: &Arc<State>, client: TcpStream) {
    let n = st.counters.connections.fetch_add(1, Ordering::SeqCst);
    let faults = st.faults.lock().unwrap().clone();
    let on = st.enabled.load(Ordering::SeqCst) && n >= faults.after_connections;
    let plan = if !on {
        Plan::Pass
    } else {
        let mut rng = st.rng.lock().unwrap();
        let x: f64 = rng.random();
        if faults.reset_connections.contains(&n) {
            Plan::ResetAfter(0)
        } else if x < faults.hang || faults.hang_connections.contains(&n) {
            Plan::Hang
        } else if x < faults.hang + faults.trickle {
            Plan::Trickle
        } else if x < faults.hang + faults.trickle + faults.reset {
            Plan::ResetAfter(rng.random_range(0..faults.reset_within.max(1)))
        } else {
            Plan::Pass
        }
    };
    if let Plan::Hang = plan {
        st.counters.hangs.fetch_add(1, Ordering::SeqCst);
        st.hung.lock().unwrap().push(client);
        return;
    }
    let Ok(mut server) = TcpStream::connect(st.target).await else {
        let _ = client.set_zero_linger();
        return;
    };
    let mut client = client;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let trickle = matches!(plan, Plan::Trickle);
    if trickle {
        st.counters.trickles.fetch_add(1, Ordering::SeqCst);
    }
    let reset_after = if let Plan::ResetAfter(k) = plan { Some(k) } else { None };
    let mut rules: Vec<(Vec<u8>, f64, bool)> = Vec::new();
    if on {
        rules.extend(faults.reset_on.iter().map(|(pat, p)| (pat.clone(), *p, true)));
        rules.extend(faults.on_request.iter().cloned());
    }
    let both_ways = faults.reset_both_ways;
    let mut received = 0u64;
    let stall_after = if on { faults.stall_once_after } else { None };
    let (mut cbuf, mut sbuf) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    let (mut c_open, mut s_open, mut sent) = (true, true, 0u64);
    let mut cut = st.cut.subscribe();
    // A request rule fired: when, and whether to reset (else go silent).
    let mut doomed: Option<(tokio::time::Instant, bool)> = None;
    while c_open || s_open {
        tokio::select! {
            _ = cut.changed() => return rst(client, server),
            r = client.read(&mut cbuf), if c_open => match r {
                Ok(0) | Err(_) => {
                    c_open = false;
                    let _ = server.shutdown().await;
                }
                Ok(k) => {
                    let seen = if both_ways { sent + received } else { sent };
                    if let Some(limit) = reset_after
                        && seen + k as u64 > limit {
                            let _ = server.write_all(&cbuf[..(limit - seen) as usize]).await;
                            st.counters.resets.fetch_add(1, Ordering::SeqCst);
                            return rst(client, server);
                        }
                    if let Some(limit) = stall_after
                        && sent + k as u64 > limit && !st.stalled_once.swap(true, Ordering::SeqCst) {
                            st.counters.hangs.fetch_add(1, Ordering::SeqCst);
                            let mut hung = st.hung.lock().unwrap();
                            hung.push(client);
                            hung.push(server);
                            return;
                        }
                    if server.write_all(&cbuf[..k]).await.is_err() {
                        return rst(client, server);
                    }
                    sent += k as u64;
                    if doomed.is_none() {
                        for (pat, p, reset) in &rules {
                            let hit = cbuf[..k].windows(pat.len()).any(|w| w == pat.as_slice());
                            if hit && st.rng.lock().unwrap().random::<f64>() < *p {
                                // The server gets the rest of the request (a body may follow
                                // its head in a later read) and acts on it; its reply never
                                // arrives.
                                doomed = Some((tokio::time::Instant::now() + Duration::from_millis(150), *reset));
                                break;
                            }
                        }
                    }
                }
            },
            _ = tokio::time::sleep_until(doomed.map_or_else(tokio::time::Instant::now, |d| d.0)), if doomed.is_some() => {
                if doomed.is_some_and(|d| d.1) {
                    st.counters.pattern_resets.fetch_add(1, Ordering::SeqCst);
                    return rst(client, server);
                }
                st.counters.silences.fetch_add(1, Ordering::SeqCst);
                let mut hung = st.hung.lock().unwrap();
                hung.push(client);
                hung.push(server);
                return;
            },
            r = server.read(&mut sbuf), if s_open => match r {
                Ok(0) | Err(_) => {
                    s_open = false;
                    let _ = client.shutdown().await;
                }
                Ok(_) if doomed.is_some() => {} // the reply of a doomed request: lost
                Ok(k) => {
                    if both_ways
                        && let Some(limit) = reset_after
                        && sent + received + k as u64 > limit
                    {
                        let _ = client.write_all(&sbuf[..(limit - sent - received) as usize]).await;
                        st.counters.resets.fetch_add(1, Ordering::SeqCst);
                        return rst(client, server);
                    }
                    received += k as u64;
                    if trickle {
                        for piece in sbuf[..k].chunks(64) {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            if client.write_all(piece).await.is_err() {
                                return rst(client, server);
                            }
                        }
                    } else if client.write_all(&sbuf[..k]).await.is_err() {
                        return rst(client, server);
                    }
                }
            },
        }
    }
}

/// Closes both sockets with `SO_LINGER` 0: each peer gets a real RST ("connection reset by peer").
fn rst(client: TcpStream, server: TcpStream) {
    let _ = client.set_zero_linger();
    let _ = server.set_zero_linger();
}
