//! Transfers that always end: a total deadline and a no-progress watchdog for writes, a
//! per-piece deadline for reads.

use std::io::Read;
use std::time::Duration;

use crate::error::{Error, Result};

/// Bytes moved by a transfer, shared with its watchdog; also carries cancellation, and
/// whether the transfer is waiting on a bounded metadata call right now.
#[derive(Debug, Clone, Default)]
pub struct Progress(std::sync::Arc<ProgressState>);

#[derive(Debug, Default)]
pub struct ProgressState {
    bytes: std::sync::atomic::AtomicU64,
    cancelled: std::sync::atomic::AtomicBool,
    /// Bounded calls in flight (a NameNode `complete()`, a single PUT under its request
    /// timeout): each has its own deadline, so the no-progress watchdog does not count them.
    in_calls: std::sync::atomic::AtomicUsize,
    /// Room in a budget of bytes in memory (`copy.bytes_in_flight`) taken for this transfer
    /// before it started. A backend that sends pieces which the store keeps after they were
    /// handed over (an HDFS writer keeps its packets, slices of them, until the DataNodes
    /// acknowledge them) ties the room to the pieces ([`Progress::piece`]) and lets go of its
    /// own hold when the last piece is read ([`Progress::let_go_of_room`]): the room comes back
    /// when the store has every byte, not when the transfer ends, so a close that waits on the
    /// NameNode holds none. Taken once, before the first byte: never waited for while pieces
    /// are held, so transfers cannot wait on each other's room.
    room: std::sync::Mutex<Option<std::sync::Arc<tokio::sync::OwnedSemaphorePermit>>>,
}

/// A piece of a file read for an upload, holding its transfer's room until the last slice of
/// it is dropped.
struct Held {
    bytes: Vec<u8>,
    _room: std::sync::Arc<tokio::sync::OwnedSemaphorePermit>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Progress {
    /// A transfer holding `room` (see [`ProgressState::room`]).
    pub fn holding(room: tokio::sync::OwnedSemaphorePermit) -> Progress {
        Progress(std::sync::Arc::new(ProgressState { room: std::sync::Mutex::new(Some(std::sync::Arc::new(room))), ..Default::default() }))
    }

    /// `buf` as bytes that keep the transfer's room (if it holds any) until the last slice of
    /// them is dropped.
    pub fn piece(&self, buf: Vec<u8>) -> bytes::Bytes {
        match self.0.room.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            None => bytes::Bytes::from(buf),
            Some(r) => bytes::Bytes::from_owner(Held { bytes: buf, _room: r }),
        }
    }

    /// The transfer has read its last piece: its room stays only as long as those pieces do.
    pub fn let_go_of_room(&self) {
        self.0.room.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    pub fn add(&self, n: u64) {
        self.0.bytes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn bytes(&self) -> u64 {
        self.0.bytes.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn cancel(&self) {
        self.0.cancelled.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn cancelled(&self) -> bool {
        self.0.cancelled.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Marks a wait on a call that has a deadline of its own, until the guard drops: time spent
    /// there is not a stall (a silent `complete()` is settled by its own timeout, not killed
    /// as "no progress" before the settle can run).
    pub fn in_call(&self) -> InCall {
        self.0.in_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        InCall(self.clone())
    }
    fn waiting_on_call(&self) -> bool {
        self.0.in_calls.load(std::sync::atomic::Ordering::Relaxed) > 0
    }
}

/// See [`Progress::in_call`].
pub struct InCall(Progress);

impl Drop for InCall {
    fn drop(&mut self) {
        self.0.0.in_calls.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Runs `fut` under a total `deadline` and a no-progress watchdog: if `progress` does not move
/// for `stall` (outside bounded calls, see [`Progress::in_call`]), the transfer is abandoned.
/// Either way the error is transient.
pub async fn watched<T>(
    what: &str,
    deadline: Duration,
    stall: Duration,
    progress: Progress,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let watchdog = {
        let progress = progress.clone();
        async move {
            let mut last = progress.bytes();
            let tick = (stall / 4).max(Duration::from_millis(10));
            let mut idle = Duration::ZERO;
            loop {
                tokio::time::sleep(tick).await;
                let now = progress.bytes();
                if now == last && !progress.waiting_on_call() {
                    idle += tick
                } else {
                    idle = Duration::ZERO
                }
                last = now;
                if idle >= stall {
                    return now;
                }
            }
        }
    };
    // Dropped before it ends (a hedge lost, a lease was lost): tell the transfer to stop too.
    struct CancelOnDrop(Progress, bool);
    impl Drop for CancelOnDrop {
        fn drop(&mut self) {
            if !self.1 {
                self.0.cancel();
            }
        }
    }
    let mut guard = CancelOnDrop(progress.clone(), false);
    let res = tokio::select! {
        r = tokio::time::timeout(deadline, fut) => match r {
            Ok(r) => r,
            Err(_) => Err(Error::Stalled { what: what.to_string(), reason: format!("did not finish within its deadline of {deadline:?}") }),
        },
        moved = watchdog => Err(Error::Stalled {
            what: what.to_string(),
            reason: format!("no progress for {stall:?} after {moved} bytes"),
        }),
    };
    if res.is_err() {
        progress.cancel();
    }
    guard.1 = true;
    res
}

/// Feeds every piece of `s` to `f`, waiting at most `stall` for each one (a read's
/// no-progress watchdog); returns the bytes seen.
pub(crate) async fn drain(
    what: &str,
    stall: Duration,
    mut s: futures::stream::BoxStream<'static, Result<bytes::Bytes>>,
    mut f: impl FnMut(&[u8]),
) -> Result<u64> {
    use futures::StreamExt;
    let mut n = 0u64;
    loop {
        match tokio::time::timeout(stall, s.next()).await {
            Err(_) => return Err(Error::Stalled { what: what.to_string(), reason: format!("no bytes for {stall:?}") }),
            Ok(None) => return Ok(n),
            Ok(Some(b)) => {
                let b = b?;
                n += b.len() as u64;
                f(&b);
            }
        }
    }
}

/// Size and blake3 of a stream, read under [`drain`]'s watchdog.
pub(crate) async fn drain_hash(
    what: &str,
    stall: Duration,
    s: futures::stream::BoxStream<'static, Result<bytes::Bytes>>,
) -> Result<(u64, String)> {
    let mut h = blake3::Hasher::new();
    let n = drain(what, stall, s, |b| {
        h.update(b);
    })
    .await?;
    Ok((n, h.finalize().to_hex().to_string()))
}

/// The error of a blocking read whose stream sent nothing for `stall`.
fn no_bytes(what: &str, stall: Duration) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what}: no bytes for {stall:?}"))
}

/// A blocking [`Read`] over an async byte stream, for callers on a blocking thread (the
/// splitter, the decoders). Every wait for the next piece runs under `stall`, so a server that
/// stops sending ends the read instead of hanging it.
pub(crate) struct StreamReader {
    stream: futures::stream::BoxStream<'static, Result<bytes::Bytes>>,
    buf: bytes::Bytes,
    handle: tokio::runtime::Handle,
    stall: Duration,
    what: String,
}

impl StreamReader {
    pub(crate) fn new(
        what: String,
        stall: Duration,
        stream: futures::stream::BoxStream<'static, Result<bytes::Bytes>>,
    ) -> Result<StreamReader> {
        let handle =
            tokio::runtime::Handle::try_current().map_err(|_| Error::Other(format!("{what}: blocking read outside the runtime")))?;
        Ok(StreamReader { stream, buf: bytes::Bytes::new(), handle, stall, what })
    }
}

impl Read for StreamReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        use futures::StreamExt;
        while self.buf.is_empty() {
            let next = self.handle.block_on(tokio::time::timeout(self.stall, self.stream.next()));
            match next {
                Err(_) => {
                    return Err(no_bytes(&self.what, self.stall));
                }
                Ok(None) => return Ok(0),
                Ok(Some(Err(e))) => return Err(std::io::Error::other(e.to_string())),
                Ok(Some(Ok(b))) => self.buf = b,
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        bytes::Buf::advance(&mut self.buf, n);
        Ok(n)
    }
}

/// What the read-ahead task hands its reader: a piece (holding its room in the budget until
/// the reader has used it), the stream's error, or its end. A channel that closes without an
/// `End` is an error, never a short file.
enum Ahead {
    Piece(bytes::Bytes, tokio::sync::OwnedSemaphorePermit),
    Failed(std::io::Error),
    End,
}

/// A blocking [`Read`] that a task on the runtime keeps up to `ahead` bytes in front of: the
/// network's waits (the first packet, each next block, a slow DataNode) overlap the reader's
/// work instead of stopping it, and a reader that has not started yet (a chunk waiting for a
/// core) finds its first bytes there. Every wait for the next piece runs under `stall`, as in
/// [`StreamReader`]; the task ends when the reader is dropped.
pub(crate) struct ReadAhead {
    rx: tokio::sync::mpsc::UnboundedReceiver<Ahead>,
    buf: bytes::Bytes,
    _room: Option<tokio::sync::OwnedSemaphorePermit>,
    handle: tokio::runtime::Handle,
    what: String,
    done: bool,
}

impl ReadAhead {
    /// Starts the task on the current runtime; `ahead` is rounded to KiB (at least one).
    pub(crate) fn spawn(
        what: String,
        stall: Duration,
        ahead: usize,
        mut stream: futures::stream::BoxStream<'static, Result<bytes::Bytes>>,
    ) -> Result<ReadAhead> {
        use futures::StreamExt;
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::Other(format!("{what}: read outside the runtime")))?;
        let room_kib = u32::try_from(ahead >> 10).unwrap_or(u32::MAX).max(1);
        let room = std::sync::Arc::new(tokio::sync::Semaphore::new(room_kib as usize));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let name = what.clone();
        handle.spawn(async move {
            loop {
                let next = tokio::select! {
                    _ = tx.closed() => return,
                    n = tokio::time::timeout(stall, stream.next()) => n,
                };
                let msg = match next {
                    Err(_) => Ahead::Failed(no_bytes(&name, stall)),
                    Ok(None) => Ahead::End,
                    Ok(Some(Err(e))) => Ahead::Failed(std::io::Error::other(e.to_string())),
                    Ok(Some(Ok(b))) => {
                        // A piece larger than the whole budget takes all of it, and waits for it.
                        let kib = u32::try_from(b.len().div_ceil(1024)).unwrap_or(u32::MAX).clamp(1, room_kib);
                        let permit = tokio::select! {
                            _ = tx.closed() => return,
                            p = room.clone().acquire_many_owned(kib) => p.expect("the budget is never closed"),
                        };
                        Ahead::Piece(b, permit)
                    }
                };
                let last = !matches!(msg, Ahead::Piece(..));
                if tx.send(msg).is_err() || last {
                    return;
                }
            }
        });
        Ok(ReadAhead { rx, buf: bytes::Bytes::new(), _room: None, handle, what, done: false })
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.buf.is_empty() {
            // The piece used up gives its room back before the next is waited for.
            self._room = None;
            if self.done {
                return Ok(0);
            }
            match self.handle.block_on(self.rx.recv()) {
                Some(Ahead::Piece(b, room)) => {
                    self.buf = b;
                    self._room = Some(room);
                }
                Some(Ahead::Failed(e)) => return Err(e),
                Some(Ahead::End) => self.done = true,
                None => return Err(std::io::Error::other(format!("{}: the read-ahead task ended before the file did", self.what))),
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        bytes::Buf::advance(&mut self.buf, n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn watchdog_ends_a_stalled_transfer() {
        let p = Progress::default();
        let stalled = std::future::pending::<Result<()>>();
        let e = watched("copy x", Duration::from_secs(600), Duration::from_secs(30), p.clone(), stalled).await.unwrap_err();
        assert!(matches!(e, Error::Stalled { .. }) && e.to_string().contains("no progress for 30s"), "{e}");
        assert!(e.is_transient());
        assert!(p.cancelled(), "the transfer is told to stop");
    }

    #[tokio::test(start_paused = true)]
    async fn a_bounded_call_is_not_a_stall() {
        let p = Progress::default();
        // 40 s inside a call with its own deadline (a silent complete() being settled), with a
        // 10 s watchdog: not killed; then 10 s of silence outside any call: killed.
        let settle = {
            let p = p.clone();
            async move {
                p.add(1);
                {
                    let _waiting = p.in_call();
                    tokio::time::sleep(Duration::from_secs(40)).await;
                }
                p.add(1);
                std::future::pending::<()>().await;
                Ok(())
            }
        };
        let t = tokio::time::Instant::now();
        let e = watched::<()>("copy z", Duration::from_secs(600), Duration::from_secs(10), p, settle).await.unwrap_err();
        assert!(e.to_string().contains("no progress for 10s after 2 bytes"), "{e}");
        assert!(t.elapsed() >= Duration::from_secs(50), "{:?}", t.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_ends_a_slow_but_moving_transfer() {
        let p = Progress::default();
        let trickle = {
            let p = p.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    p.add(1);
                }
                #[allow(unreachable_code)]
                Ok(())
            }
        };
        let e = watched::<()>("copy y", Duration::from_secs(60), Duration::from_secs(30), p, trickle).await.unwrap_err();
        assert!(e.to_string().contains("deadline"), "{e}");
    }

    /// A stream of `pieces` that counts how many pieces were taken from it.
    fn counted(
        pieces: Vec<Vec<u8>>,
    ) -> (futures::stream::BoxStream<'static, Result<bytes::Bytes>>, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use futures::StreamExt;
        let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let t = taken.clone();
        let s = futures::stream::iter(pieces)
            .map(move |p| {
                t.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(bytes::Bytes::from(p))
            })
            .boxed();
        (s, taken)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_ahead_gives_every_byte_in_order_and_stays_within_its_budget() {
        // Pieces of odd sizes, one larger than the whole budget (it goes alone).
        let pieces: Vec<Vec<u8>> =
            (0..40usize).map(|i| (0..(if i == 7 { 20_000 } else { 1 + i * 300 })).map(|j| (i * 7 + j) as u8).collect()).collect();
        let want: Vec<u8> = pieces.concat();
        let (s, taken) = counted(pieces);
        let mut r = ReadAhead::spawn("read of t".into(), Duration::from_secs(5), 8 << 10, s).unwrap();
        // Nobody reads yet: the task fetches up to its budget (8 KiB) and waits there.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let early = taken.load(std::sync::atomic::Ordering::SeqCst);
        assert!((1..=7).contains(&early), "fetched {early} pieces before any read");
        let got = tokio::task::spawn_blocking(move || {
            let mut v = Vec::new();
            r.read_to_end(&mut v).map(|_| v)
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(got, want);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_ahead_passes_on_the_streams_error_and_a_stall() {
        use futures::StreamExt;
        let failing = futures::stream::iter(vec![Ok(bytes::Bytes::from_static(b"abc")), Err(Error::Other("reset by peer".into()))]).boxed();
        let mut r = ReadAhead::spawn("read of f".into(), Duration::from_secs(5), 1 << 20, failing).unwrap();
        let e = tokio::task::spawn_blocking(move || r.read_to_end(&mut Vec::new())).await.unwrap().unwrap_err();
        assert!(e.to_string().contains("reset by peer"), "{e}");

        let stalled = futures::stream::iter(vec![Ok(bytes::Bytes::from_static(b"abc"))]).chain(futures::stream::pending()).boxed();
        let mut r = ReadAhead::spawn("read of s".into(), Duration::from_millis(300), 1 << 20, stalled).unwrap();
        let e = tokio::task::spawn_blocking(move || r.read_to_end(&mut Vec::new())).await.unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("read of s: no bytes for"), "{e}");
    }

    #[test]
    fn a_transfers_room_comes_back_when_its_last_piece_is_dropped() {
        let room = std::sync::Arc::new(tokio::sync::Semaphore::new(8));
        let p = Progress::holding(room.clone().try_acquire_many_owned(8).unwrap());
        let mut first = p.piece(vec![7u8; 5 << 10]);
        let second = p.piece(vec![8u8; 1 << 10]);
        // A slice handed on (a packet waiting for its acknowledgement) keeps it all.
        let packet = first.split_to(1024);
        drop(first);
        p.let_go_of_room();
        assert_eq!(room.available_permits(), 0, "given back while pieces are still held");
        drop(second);
        assert_eq!(room.available_permits(), 0, "given back while a slice is still held");
        drop(packet);
        assert_eq!(room.available_permits(), 8);
        // Without a hold of its own the transfer's room goes with its last piece; a transfer
        // that never lets go keeps it to its end.
        let p = Progress::holding(room.clone().try_acquire_many_owned(8).unwrap());
        drop(p.piece(vec![0u8; 10]));
        assert_eq!(room.available_permits(), 0);
        drop(p);
        assert_eq!(room.available_permits(), 8);
        assert_eq!(Progress::default().piece(vec![1, 2, 3]).as_ref(), &[1, 2, 3]);
    }
}
