//! The loop every chunk stage runs: claim up to `concurrency` tasks, work on each under a
//! heartbeat, record the outcome, and stop cleanly on SIGTERM / SIGINT.
//!
//! One slow or failing chunk never holds back the others: each runs in its own task, and a
//! free slot is refilled as soon as any task ends. A chunk whose work panics fails that
//! attempt with the panic's message (and is retried like any transient failure); the stage
//! goes on.

use std::future::Future;
use std::io::IsTerminal;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use ferry_common::cli::{CommonArgs, StageArgs, exit};
use ferry_common::error::{Classified, ErrorClass};
use futures::FutureExt;
use tokio::task::JoinSet;

use crate::breaker::{Breakers, Verdict, probe_schedule};
use crate::observe::{self, Health, Observer, emit};
use ferry_ledger::{Error, FailOutcome, Lease, Ledger, LedgerOptions, Result, Stage, TaskState, Work};

/// What every stage binary does first: load the config (flags and env win), connect to the
/// ledger and migrate it. Under `--watch` a ledger that cannot be reached (a host that boots
/// while the network or Postgres is still down, a partition) is waited for, probed with
/// capped, jittered backoff up to `ledger.outage_probe_max`: a service heals by itself instead
/// of exiting. Anything else (a bad URL, a refused login, a certificate that does not verify,
/// an incompatible schema) ends it.
///
/// Boxed here, as [`serve`] is: see [`Boxed`].
pub fn open_stage<'a>(common: &'a CommonArgs, args: &'a StageArgs) -> Boxed<'a, Result<(Config, Ledger)>> {
    Box::pin(open_stage_inner(common, args))
}

async fn open_stage_inner(common: &CommonArgs, args: &StageArgs) -> Result<(Config, Ledger)> {
    let mut cfg = Config::load(&args.config)?;
    if let Some(url) = &common.ledger {
        cfg.ledger.url = url.clone();
    }
    let mut delays = probe_schedule(Duration::from_secs(1), cfg.ledger.outage_probe_max.0);
    let deadline = Instant::now() + args.start_wait;
    loop {
        let opened = async {
            let ledger = Ledger::connect(&cfg.ledger.url, LedgerOptions::from_config(&cfg.ledger))
                .await?
                .with_pipeline(&cfg.pipeline)
                .with_node(&cfg.spool.node);
            ledger.register_pipeline(&cfg.table.name).await?;
            Ok::<_, Error>(ledger)
        };
        match opened.await {
            Err(e) if !args.once && e.is_unreachable() && !e.is_tls() => {
                let now = Instant::now();
                if now >= deadline {
                    let url = ferry_common::config::redact_url(&cfg.ledger.url);
                    return Err(unusable_at_start("ledger", &url, &ferry_common::error::with_causes(&e), false));
                }
                let d = delays.next().unwrap_or(Duration::from_secs(1)).min(deadline - now);
                tracing::error!(error = %e, retry_in = ?d, "ledger unreachable at start; waiting for it");
                wait_at_start(d, "the ledger").await;
            }
            r => return r.map(|ledger| (cfg, ledger)),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub stage: Stage,
    pub concurrency: usize,
    /// `--once`: exit when nothing is claimable and nothing is in flight. Otherwise poll.
    pub once: bool,
    pub poll: Duration,
    /// Between polls, how often `--watch` asks the ledger whether a claim would find a task
    /// (a read, see [`Ledger::due`]); zero: only every `poll`.
    pub handoff: Duration,
    /// How long in-flight chunks may finish after SIGTERM before their leases are released.
    pub grace: Duration,
    pub worker: String,
    /// `--watch` logs a progress line this often.
    pub progress_interval: Duration,
    /// Told when chunks finish and when there is nothing to do (`/healthz`, the watchdog).
    pub health: Arc<Health>,
    /// The stores the stage's chunks go to, by the name their errors give (`destination`)
    /// with what the outage record calls them (`destination s3://bucket/prefix`).
    pub stores: Vec<(&'static str, String)>,
    /// The longest wait between probes of a store that is down.
    pub outage_probe_max: Duration,
    /// The stores' own probes (see [`StoreProbe`]); none: outages are told by chunks alone.
    pub probe: Option<StoreProbe>,
}

/// The stores a stage's chunks go to: by the name their errors give (`destination`), with
/// what the outage record calls them (`destination s3://bucket/prefix`), and their probes.
pub struct Stores {
    pub names: Vec<(&'static str, String)>,
    pub probe: Option<StoreProbe>,
}

/// A cheap call of a store's own, by the name its errors give (`destination`): Ok when the
/// store answered, the error when it did not. None for a store without one (the ledger). It
/// tells a store that is down from a chunk that fails on its own, and heals outage records
/// that no process of this stage will close (one that exited while the store was down).
#[derive(Clone)]
pub struct StoreProbe(pub Arc<dyn Fn(&'static str) -> Option<ProbeFuture> + Send + Sync>);

/// A probe's outcome: `Ok(None)` the store answered, `Ok(Some(refusal))` it answered with a
/// refusal a later call cannot change (up, and unusable with these settings), `Err` no answer.
pub type ProbeFuture = Pin<Box<dyn Future<Output = std::result::Result<Option<String>, String>> + Send>>;

impl StoreProbe {
    /// Asks `store`, bounded by [`PROBE_BOUND`]; None when it has no probe.
    async fn ask(&self, store: &'static str) -> Option<std::result::Result<Option<String>, String>> {
        let call = (self.0)(store)?;
        Some(match tokio::time::timeout(PROBE_BOUND, call).await {
            Ok(r) => r,
            Err(_) => Err(format!("the probe did not end within {PROBE_BOUND:?}")),
        })
    }
}

/// The stores a stage works on must answer at start: each is probed once, and under
/// `--watch` (`wait` is Some) again with capped and jittered backoff for at most `wait`. A
/// store that refuses us (a login, a permission, Kerberos settings that cannot work) ends the
/// stage at once with exit 2, `--once` too: every chunk would fail the same way. Under
/// `--watch` a store that does not answer within `wait` ends it with an error that says which
/// store and the likely fix: exit 2 when the error points at the configuration (a name that
/// does not resolve, a certificate, credentials, Kerberos), 1 otherwise (a refused port, no
/// answer), which a supervisor restarts. A `--once` run goes on without an answer: its chunks
/// meet the outage and its exit code says so. A store that answered at start and goes away
/// later is an outage, waited out by the runner.
pub async fn stores_answer_at_start(
    stores: &[(&'static str, String)],
    probe: &StoreProbe,
    wait: Option<Duration>,
    cap: Duration,
) -> Result<()> {
    let Some(wait) = wait else {
        for (store, url) in stores {
            if let Some(Ok(Some(refusal))) = probe.ask(store).await {
                return Err(unusable_at_start(store, url, &refusal, true));
            }
        }
        return Ok(());
    };
    let deadline = Instant::now() + wait;
    for (store, url) in stores {
        let mut delays = probe_schedule(Duration::from_secs(1), cap);
        let mut tries = 0u32;
        loop {
            tries += 1;
            let failed = match probe.ask(store).await {
                None | Some(Ok(None)) => break,
                Some(Ok(Some(refusal))) => return Err(unusable_at_start(store, url, &refusal, true)),
                Some(Err(e)) => e,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(unusable_at_start(store, url, &format!("{failed} ({tries} probe(s) in {wait:?})"), false));
            }
            // The last probe at the deadline itself.
            let d = delays.next().unwrap_or(Duration::from_secs(1)).min(deadline - now);
            tracing::error!(store = %format!("{store} {url}"), error = %failed, retry_in = ?d, "store unreachable at start; waiting for it (--start-wait)");
            wait_at_start(d, store).await;
        }
    }
    Ok(())
}

/// Waits `d` before the next probe at start. systemd's start timeout (a Type=notify unit is not
/// READY yet) is extended to cover it; a shutdown signal meanwhile is a clean stop (exit 0):
/// nothing was claimed yet.
async fn wait_at_start(d: Duration, what: &str) {
    observe::sd_notify(&format!("EXTEND_TIMEOUT_USEC={}", (d + PROBE_BOUND).as_micros()));
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shutdown_signal() => {
            tracing::info!("shutdown requested before {what} answered");
            std::process::exit(exit::OK);
        }
    }
}

/// The error a stage ends with when `store` cannot be used at start.
fn unusable_at_start(store: &str, url: &str, error: &str, refused: bool) -> Error {
    let cause = ferry_common::error::likely_cause(error);
    let what = if refused { "refused us at start" } else { "did not answer at start" };
    let fix = cause.map(|c| format!("; likely fix: {}", c.fix())).unwrap_or_default();
    let message = format!("{store} {url} {what}: {error}{fix}");
    if refused || cause.is_some_and(|c| c.is_config()) {
        Error::Config(ferry_common::error::ConfigError::new(format!("{store}.url"), message))
    } else {
        Error::Unreachable(message)
    }
}

impl std::fmt::Debug for StoreProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreProbe")
    }
}

/// The longest a probe may take: the store's own deadlines bound it first.
const PROBE_BOUND: Duration = Duration::from_secs(60);

/// Under `--watch`, how often outage records of this stage's stores are looked at (and the
/// stores probed): an outage a process that exited left open is closed within this.
const HEAL_EVERY: Duration = Duration::from_secs(60);

impl RunOptions {
    /// Options with the defaults of the binaries' flags.
    pub fn new(stage: Stage, concurrency: usize, once: bool, worker: String) -> RunOptions {
        RunOptions {
            stage,
            concurrency,
            once,
            poll: Duration::from_secs(2),
            handoff: Duration::from_millis(500),
            grace: Duration::from_secs(30),
            worker,
            progress_interval: Duration::from_secs(60),
            health: Health::new(Duration::from_secs(900)),
            stores: Vec::new(),
            outage_probe_max: Duration::from_secs(60),
            probe: None,
        }
    }

    /// What `store`'s probe says: Ok when it answered (a refusal included: it is up), its
    /// error when not; None when it has no probe.
    async fn probe(&self, store: &'static str) -> Option<std::result::Result<(), String>> {
        Some(self.probe.as_ref()?.ask(store).await?.map(|_refusal| ()))
    }

    /// How the outage record names `store`.
    fn label(&self, store: &str) -> String {
        self.stores.iter().find(|(s, _)| *s == store).map_or_else(|| store.to_string(), |(s, url)| format!("{s} {url}"))
    }
}

/// A stage's start-up cleanup of abandoned temp files, best effort: a store that is down
/// right now must not stop the stage; the next start collects what this one could not.
pub async fn cleanup<T, E: std::fmt::Display>(gc: impl Future<Output = std::result::Result<T, E>>) {
    if let Err(e) = gc.await {
        tracing::warn!(error = %e, "cleanup of abandoned temp files failed; continuing");
    }
}

/// What one run did, for the summary line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub done: u64,
    pub records: i64,
    pub bytes: i64,
    pub retries: u64,
    pub quarantined: u64,
    pub lost: u64,
    pub released: u64,
    /// Bytes sent twice: retried requests, lost hedges, what failed attempts sent.
    pub redone_bytes: i64,
    /// Tasks of this stage left quarantined in the ledger (not only by this run).
    pub quarantined_total: i64,
    /// Tasks of this stage still waiting (e.g. for a retry's backoff).
    pub pending: i64,
    /// Why nothing got through, when a store was down or every attempt failed.
    pub stalled: Option<String>,
}

impl Summary {
    pub fn line(&self, stage: Stage, elapsed: Duration) -> String {
        format!(
            "{stage}: {} chunks done, {} records, {} bytes in {:.1}s; {} retried, {} quarantined ({} in ledger), {} leases lost, {} released, {} pending, {} bytes redone",
            self.done,
            self.records,
            self.bytes,
            elapsed.as_secs_f64(),
            self.retries,
            self.quarantined,
            self.quarantined_total,
            self.lost,
            self.released,
            self.pending,
            self.redone_bytes
        ) + &self.stalled.as_ref().filter(|_| self.done == 0).map(|why| format!("; no progress: {why}")).unwrap_or_default()
    }

    /// The process exit code for this run (see `ferry_common::cli::exit`): no progress
    /// because of failures first (it needs someone soonest), then quarantined work.
    pub fn exit_code(&self) -> i32 {
        if self.done == 0 && self.stalled.is_some() {
            exit::NO_PROGRESS
        } else if self.quarantined_total > 0 {
            exit::QUARANTINED
        } else {
            exit::OK
        }
    }
}

pub type TaskFuture<E> = Pin<Box<dyn Future<Output = std::result::Result<Work, E>> + Send>>;

/// What the loop keeps of a chunk's failure: the answers of [`Classified`], taken as the work
/// ends. The loop itself then has no type parameter, so it is compiled once, in this crate,
/// instead of once per stage binary (it was most of each binary's build).
struct Failure {
    class: ErrorClass,
    message: String,
    store: Option<&'static str>,
    waits: Option<Duration>,
}

/// A stage's work per chunk, with its error type erased into a [`Failure`].
type ChunkWork = Arc<dyn Fn(Lease) -> TaskFuture<Failure> + Send + Sync>;

/// The only code generic over a stage's work and error: wraps them for the loop.
fn erase<E, F>(work: F) -> ChunkWork
where
    E: Classified,
    F: Fn(Lease) -> TaskFuture<E> + Send + Sync + 'static,
{
    Arc::new(move |lease| {
        let fut = work(lease);
        Box::pin(
            async move { fut.await.map_err(|e| Failure { class: e.class(), message: e.to_string(), store: e.store(), waits: e.waits() }) },
        )
    })
}

enum Ended {
    Done(Work),
    /// The outcome, the task, the error and the bytes redone.
    Failed(FailOutcome, i64, String, i64),
    Lost,
    Released,
}

impl Ended {
    /// The `outcome` label of the chunk metrics.
    fn outcome(&self) -> &'static str {
        match self {
            Ended::Done(_) => "done",
            Ended::Failed(FailOutcome::Retry { .. }, ..) => "retried",
            Ended::Failed(FailOutcome::Quarantined, ..) => "quarantined",
            Ended::Lost => "lost",
            Ended::Released => "released",
        }
    }
}

/// What a chunk stage's binary does after setting itself up: run under the flags of
/// [`StageArgs`] and turn the summary into the process exit code.
pub async fn serve<E, F>(
    ledger: &Ledger,
    args: &StageArgs,
    stage: Stage,
    concurrency: usize,
    stores: Stores,
    work: F,
    after: Option<AfterCommit>,
) -> Result<i32>
where
    E: Classified,
    F: Fn(Lease) -> TaskFuture<E> + Send + Sync + 'static,
{
    serve_erased(ledger, args, stage, concurrency, stores, erase(work), after).await
}

/// A future boxed in the crate that defines it. An `async fn`'s state machine is compiled in
/// every crate that awaits it, like a generic: awaited from each stage binary, the loop, the
/// ledger and sqlx underneath were compiled five times over, and were most of each binary's
/// build. Boxed here, they are compiled once, in this crate.
pub type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

fn serve_erased<'a>(
    ledger: &'a Ledger,
    args: &'a StageArgs,
    stage: Stage,
    concurrency: usize,
    stores: Stores,
    work: ChunkWork,
    after: Option<AfterCommit>,
) -> Boxed<'a, Result<i32>> {
    Box::pin(serve_inner(ledger, args, stage, concurrency, stores, work, after))
}

async fn serve_inner(
    ledger: &Ledger,
    args: &StageArgs,
    stage: Stage,
    concurrency: usize,
    stores: Stores,
    work: ChunkWork,
    after: Option<AfterCommit>,
) -> Result<i32> {
    if let Some(probe) = &stores.probe {
        let wait = (!args.once).then_some(args.start_wait);
        stores_answer_at_start(&stores.names, probe, wait, ledger.options().outage_probe_max).await?;
    }
    let observer = Observer::start(stage.as_str(), args, ledger).await?;
    let opts = RunOptions {
        stage,
        concurrency: args.concurrency.unwrap_or(concurrency),
        once: args.once,
        poll: args.poll,
        handoff: args.handoff,
        grace: args.grace,
        worker: ferry_ledger::worker_name(stage.as_str()),
        progress_interval: args.progress_interval,
        health: observer.health(),
        stores: stores.names,
        outage_probe_max: ledger.options().outage_probe_max,
        probe: stores.probe,
    };
    let code = run_inner(ledger, &opts, work, after).await?.exit_code();
    observer.finish(ledger, code).await;
    Ok(code)
}

/// Called after a chunk's completion is committed and made durable: the place to delete what
/// only the finished stage needed (the spool files copy shipped). Durable first, because a
/// commit may still sit in the page cache (or in a Postgres WAL buffer under
/// `synchronous_commit = off`): after a power loss the chunk would be redone and find its
/// input gone. A stage without such a hook passes `None` and pays for no sync.
pub type AfterCommit = Arc<dyn Fn(&Lease) + Send + Sync>;

/// The runner's claims while the ledger is down (a Postgres restart, a lost link): none until
/// the next try, with capped, jittered backoff; a `--watch` service never ends because of it.
/// The ledger itself logs the outage and keeps its span ([`Ledger::take_ledger_outages`]).
struct LedgerLink {
    backoff: Option<crate::breaker::ProbeSchedule>,
    retry_at: Option<Instant>,
    cap: Duration,
    last_error: Option<String>,
}

impl LedgerLink {
    fn new(cap: Duration) -> LedgerLink {
        LedgerLink { backoff: None, retry_at: None, cap, last_error: None }
    }

    fn ready(&self) -> bool {
        self.retry_at.is_none_or(|t| Instant::now() >= t)
    }

    /// A claim failed with a transient error (after the call's own retries).
    fn failed(&mut self, stage: Stage, e: &Error) {
        let cap = self.cap;
        let backoff = self.backoff.get_or_insert_with(|| {
            emit::store_down(stage, "ledger").set(1.0);
            probe_schedule(Duration::from_secs(1), cap)
        });
        let wait = backoff.next().unwrap_or(Duration::from_secs(1));
        tracing::warn!(%stage, error = %e, retry_in = ?wait, "cannot claim: the ledger does not answer");
        self.last_error = Some(e.to_string());
        self.retry_at = Some(Instant::now() + wait);
    }

    /// A claim went through: record the ledger's outages that are over, now that they can be.
    async fn answered(&mut self, ledger: &Ledger, stage: Stage) {
        self.retry_at = None;
        self.last_error = None;
        if self.backoff.take().is_some() {
            emit::store_down(stage, "ledger").set(0.0);
        }
        for o in ledger.take_ledger_outages() {
            let until = o.until_ms.unwrap_or_else(|| ledger.now_ms());
            let record = ledger.outage_recorded("ledger", stage, o.since_ms, until, o.failures, &o.last_error);
            best_effort("record the ledger's outage", record).await;
        }
    }
}

/// Runs a stage until `--once` finds nothing left, or until a shutdown signal; `after` runs
/// after each committed completion.
///
/// `--once` gives each chunk at most one attempt per run: a chunk that failed in this run and
/// comes due again (its backoff shorter than an attempt) is left for the next run, so one
/// run never spends a chunk's whole attempt budget.
pub async fn run<E, F>(ledger: &Ledger, opts: &RunOptions, work: F, after: Option<AfterCommit>) -> Result<Summary>
where
    E: Classified,
    F: Fn(Lease) -> TaskFuture<E> + Send + Sync + 'static,
{
    run_erased(ledger, opts, erase(work), after).await
}

fn run_erased<'a>(ledger: &'a Ledger, opts: &'a RunOptions, work: ChunkWork, after: Option<AfterCommit>) -> Boxed<'a, Result<Summary>> {
    Box::pin(run_inner(ledger, opts, work, after))
}

async fn run_inner(ledger: &Ledger, opts: &RunOptions, work: ChunkWork, after: Option<AfterCommit>) -> Result<Summary> {
    let started = Instant::now();
    let stage = opts.stage;
    let mode = if opts.once { "once" } else { "watch" };
    tracing::info!(%stage, worker = %opts.worker, concurrency = opts.concurrency, mode, "stage starting");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!(%stage, "shutdown requested: no new claims; finishing in-flight chunks");
        observe::sd_notify("STOPPING=1");
        let _ = stop_tx.send(true);
    });
    let mut progress = Progress::new(stage, ledger.clone()).await;
    let breakers = Arc::new(std::sync::Mutex::new(Breakers::new(opts.outage_probe_max)));
    let shared = Arc::new(opts.clone());
    let mut summary = Summary::default();
    let mut set: JoinSet<Result<(Ended, Duration)>> = JoinSet::new();
    let mut stop = stop_rx.clone();
    let mut report = tokio::time::interval(opts.progress_interval.max(Duration::from_millis(100)));
    report.tick().await;
    let mut link = LedgerLink::new(opts.outage_probe_max);
    // Outages an earlier run left open (it exited while the store was down, or could not
    // write the close): closed now if the store answers. Under `--watch`, again every minute.
    heal_recorded_outages(ledger, opts).await;
    let mut heal = tokio::time::interval(HEAL_EVERY);
    heal.tick().await;
    // `--once`: the tasks that failed in this run, and whether one of them came due again.
    let mut failed_here = std::collections::HashSet::new();
    let mut claims_over = false;
    let mut last_error: Option<String> = None;
    // When the last claim ran: between polls a claim runs only when the ledger says one would
    // find a task, so an idle stage reads an index a few times a second and writes nothing.
    let mut last_claim: Option<Instant> = None;
    let handoff = !opts.once && !opts.handoff.is_zero();
    loop {
        let stopping = *stop.borrow();
        let mut claimed = 0;
        // A store down on its own probe's word is probed by it when due, not by a chunk.
        let due = breakers.lock().unwrap_or_else(|e| e.into_inner()).probes_due();
        for store in due {
            probe_down_store(ledger, opts, &breakers, store).await;
        }
        // While a store is down: no claims, then one probe at a time.
        let free =
            breakers.lock().unwrap_or_else(|e| e.into_inner()).claim_limit(set.len(), opts.concurrency - set.len().min(opts.concurrency));
        let poll_due = last_claim.is_none_or(|t| t.elapsed() >= opts.poll);
        if !stopping && !claims_over && free > 0 && link.ready() && (!handoff || poll_due || ledger.due(stage).await.unwrap_or(true)) {
            last_claim = Some(Instant::now());
            match ledger.claim(stage, &opts.worker, free as i64).await {
                Ok(leases) => {
                    link.answered(ledger, stage).await;
                    for lease in leases {
                        if opts.once && failed_here.contains(&lease.task_id) {
                            // Its backoff is over before this run is: it waits for the next run.
                            claims_over = true;
                            if let Err(e) = ledger.release(&lease, Work::default()).await {
                                tracing::warn!(chunk = %lease.chunk_id, error = %e, "could not give back a chunk for the next run");
                            }
                            continue;
                        }
                        claimed += 1;
                        let one =
                            run_one(ledger.clone(), lease, work.clone(), after.clone(), stop_rx.clone(), shared.clone(), breakers.clone());
                        set.spawn(async move {
                            let t0 = Instant::now();
                            one.await.map(|ended| (ended, t0.elapsed()))
                        });
                    }
                }
                Err(e) if e.is_transient() && !opts.once => link.failed(stage, &e),
                Err(e) => return Err(e),
            }
        }
        let down = breakers.lock().unwrap_or_else(|e| e.into_inner()).any_down() || link.backoff.is_some();
        // Nothing due, or waiting out an outage between probes: idle, which is healthy.
        opts.health.set_idle(set.is_empty() && claimed == 0);
        if set.is_empty() && (stopping || (opts.once && claimed == 0)) {
            break;
        }
        if claimed > 0 && set.len() < opts.concurrency && !down {
            continue; // more may be claimable right away
        }
        // The next probe, while it is still ahead (a due probe is claimed above, or waits for
        // the one in flight: never a wake-up in the past, which would spin).
        let wake = breakers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_probe()
            .into_iter()
            .chain(link.retry_at)
            .filter(|t| *t > Instant::now())
            .min()
            .map(tokio::time::Instant::from_std);
        progress.refresh_total(&summary).await;
        tokio::select! {
            joined = set.join_next(), if !set.is_empty() => {
                if let Some(joined) = joined {
                    let (ended, took) = joined.map_err(|e| Error::Internal(format!("{stage} task failed: {e}")))??;
                    if let Ended::Failed(_, id, msg, _) = &ended {
                        failed_here.insert(*id);
                        last_error = Some(msg.clone());
                    }
                    tally(&mut summary, stage, ended, took);
                    opts.health.progressed();
                    progress.show(&summary);
                }
            }
            _ = tokio::time::sleep(if handoff { opts.handoff.min(opts.poll) } else { opts.poll }), if set.len() < opts.concurrency && !opts.once && wake.is_none() && (!down || set.is_empty()) => {}
            _ = tokio::time::sleep_until(wake.unwrap_or_else(tokio::time::Instant::now)), if wake.is_some() && !opts.once => {}
            _ = stop.changed(), if !stopping => {}
            _ = report.tick(), if !opts.once => progress.log(&summary, set.len()),
            _ = heal.tick(), if !opts.once => heal_recorded_outages(ledger, opts).await,
        }
    }
    progress.finish();
    let downs = breakers.lock().unwrap_or_else(|e| e.into_inner()).down_stores();
    summary.stalled = if let Some(store) = downs.first() {
        Some(format!("{} is down", opts.label(store)))
    } else if let Some(error) = &link.last_error {
        Some(format!("the ledger is unreachable: {error}"))
    } else {
        last_error.filter(|_| summary.retries > 0).map(|e| format!("every attempt failed; the last: {e}"))
    };
    // The closing counts; on the way out (a shutdown, a ledger that just went away) they must
    // not hold the process: they are only for the summary line.
    let bound = ledger.options().call_timeout.min(Duration::from_secs(10));
    let counts = tokio::time::timeout(bound, async { Ok::<_, Error>((ledger.pending(stage).await?, ledger.status().await?)) }).await;
    match counts {
        Ok(Ok((pending, status))) => {
            summary.pending = pending;
            summary.quarantined_total = status.tasks(Some(stage), TaskState::Quarantined);
        }
        Ok(Err(e)) if opts.once && !e.is_transient() => return Err(e),
        _ => tracing::warn!(%stage, "could not read the closing counts from the ledger"),
    }
    let elapsed = started.elapsed();
    if ferry_common::cli::json_logs() {
        let s = &summary;
        tracing::info!(
            target: "ferry::summary",
            %stage, done = s.done, records = s.records, bytes = s.bytes, seconds = elapsed.as_secs_f64(),
            retried = s.retries, quarantined = s.quarantined, quarantined_in_ledger = s.quarantined_total,
            leases_lost = s.lost, released = s.released, pending = s.pending, no_progress = s.stalled.as_deref().filter(|_| s.done == 0),
            "summary"
        );
    } else {
        eprintln!("{}", summary.line(stage, elapsed));
    }
    tracing::info!(%stage, "stage stopped");
    Ok(summary)
}

/// What a stage shows of its progress: a bar on a terminal (done / known work, rate, ETA, like
/// rclone's -P), a log line every `--progress-interval` under `--watch`.
pub(crate) struct Progress {
    stage: Stage,
    ledger: Ledger,
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
    refreshed: Option<Instant>,
    last_log: (Instant, u64, i64, i64),
}

impl Progress {
    pub(crate) async fn new(stage: Stage, ledger: Ledger) -> Progress {
        let bar = progress_bar(&format!("{stage}"), "chunks");
        let now = Instant::now();
        let mut p = Progress { stage, ledger, bar, started: now, refreshed: None, last_log: (now, 0, 0, 0) };
        p.refresh_total(&Summary::default()).await;
        p
    }

    /// The bar's total: chunks done by this run plus what the ledger still has for the stage
    /// (read at most every two seconds).
    async fn refresh_total(&mut self, s: &Summary) {
        let Some(bar) = &self.bar else { return };
        if self.refreshed.is_some_and(|t| t.elapsed() < Duration::from_secs(2)) {
            return;
        }
        self.refreshed = Some(Instant::now());
        if let Ok(pending) = self.ledger.pending(self.stage).await {
            bar.set_length(s.done + pending.max(0) as u64);
        }
    }

    fn show(&self, s: &Summary) {
        if let Some(b) = &self.bar {
            b.set_position(s.done);
            let rate = s.bytes as f64 / self.started.elapsed().as_secs_f64().max(0.001);
            b.set_message(format!("{}/s, {} retried, {} quarantined", human_bytes(rate), s.retries, s.quarantined));
        }
    }

    fn log(&mut self, s: &Summary, in_flight: usize) {
        let (at, done, records, bytes) = self.last_log;
        let secs = at.elapsed().as_secs_f64().max(0.001);
        tracing::info!(
            stage = %self.stage,
            done = s.done,
            records = s.records,
            bytes = s.bytes,
            chunks_per_s = format!("{:.2}", (s.done - done) as f64 / secs),
            records_per_s = format!("{:.0}", (s.records - records) as f64 / secs),
            bytes_per_s = %human_bytes((s.bytes - bytes) as f64 / secs),
            in_flight,
            retried = s.retries,
            quarantined = s.quarantined,
            "progress"
        );
        self.last_log = (Instant::now(), s.done, s.records, s.bytes);
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// 1234567 -> "1.2 MB".
pub fn human_bytes(n: f64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < units.len() {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 { format!("{v:.0} {}", units[i]) } else { format!("{v:.1} {}", units[i]) }
}

fn tally(s: &mut Summary, stage: Stage, ended: Ended, took: Duration) {
    let outcome = ended.outcome();
    emit::chunks(stage, outcome).increment(1);
    emit::attempt_seconds(stage, outcome).record(took.as_secs_f64());
    if let Ended::Done(w) = &ended {
        emit::records(stage).increment(w.records.max(0) as u64);
        emit::bytes(stage).increment(w.bytes.max(0) as u64);
    }
    let redone = match &ended {
        Ended::Done(w) => w.redone_bytes,
        Ended::Failed(.., redone) => *redone,
        _ => 0,
    };
    if redone > 0 {
        emit::bytes_redone(stage).increment(redone as u64);
        s.redone_bytes += redone;
    }
    match ended {
        Ended::Done(w) => {
            s.done += 1;
            s.records += w.records;
            s.bytes += w.bytes;
        }
        Ended::Failed(FailOutcome::Retry { .. }, ..) => s.retries += 1,
        Ended::Failed(FailOutcome::Quarantined, ..) => s.quarantined += 1,
        Ended::Lost => s.lost += 1,
        Ended::Released => s.released += 1,
    }
}

/// Works on one lease: heartbeats while the work runs, then records the outcome. A lost lease
/// abandons the work (someone else owns the chunk now); a shutdown past `grace` releases it.
///
/// The heartbeat runs in a task of its own: it never waits on the work it guards (a pool
/// connection the work holds, a paused process catching up), and the work never waits on it.
async fn run_one(
    ledger: Ledger,
    lease: Lease,
    work: ChunkWork,
    after: Option<AfterCommit>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    opts: Arc<RunOptions>,
    breakers: Arc<std::sync::Mutex<Breakers>>,
) -> Result<Ended> {
    let (lost_tx, mut lost) = tokio::sync::oneshot::channel::<Error>();
    let _heartbeat = AbortOnDrop(tokio::spawn(heartbeat(ledger.clone(), lease.clone(), lost_tx)));
    // A panic in the chunk's work is this chunk's failure, not the stage's end.
    // Boxed, so that a release can drop it first: its uploads add what they sent to the tally.
    let mut fut = Box::pin(std::panic::AssertUnwindSafe(work(lease.clone())).catch_unwind());
    let mut deadline: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let result = loop {
        tokio::select! {
            r = &mut fut => break r,
            Ok(e) = &mut lost => {
                tracing::warn!(chunk = %lease.chunk_id, error = %e, "abandoning chunk");
                return Ok(Ended::Lost);
            }
            _ = stop.changed(), if deadline.is_none() => {
                deadline = Some(Box::pin(tokio::time::sleep(opts.grace)));
            }
            _ = async { deadline.as_mut().unwrap().await }, if deadline.is_some() => {
                tracing::warn!(chunk = %lease.chunk_id, "grace period over; releasing the chunk");
                drop(fut);
                let sent = Work { bytes: lease.tally.moved_bytes(), records: 0, redone_bytes: lease.tally.redone_bytes() };
                // Bounded: the process is on its way out. A release that does not get through
                // leaves the lease to expire, and the chunk is redone by whoever claims it.
                return match tokio::time::timeout(RELEASE_BOUND, ledger.release(&lease, sent)).await {
                    Ok(Ok(())) => Ok(Ended::Released),
                    Ok(Err(e)) => {
                        tracing::warn!(chunk = %lease.chunk_id, error = %e, "could not release the chunk; its lease will expire");
                        Ok(Ended::Lost)
                    }
                    Err(_) => {
                        tracing::warn!(chunk = %lease.chunk_id, "the release did not get through in time; the lease will expire");
                        Ok(Ended::Lost)
                    }
                };
            }
        }
    };
    let waits = match &result {
        Ok(Err(e)) => e.waits,
        _ => None,
    };
    let failed = match result {
        Ok(Ok(w)) => Ok(w),
        Ok(Err(e)) => Err((e.class, e.message, e.store)),
        Err(panic) => {
            Err((ErrorClass::Transient, format!("{} of chunk {} panicked: {}", lease.stage, lease.chunk_id, panic_message(&panic)), None))
        }
    };
    let stage = lease.stage;
    // What an attempt that did not finish had sent: recorded, so redone work is counted.
    let unfinished = Work { bytes: lease.tally.moved_bytes(), records: 0, redone_bytes: lease.tally.redone_bytes() };
    let record = Recorder { ledger: &ledger, lease: &lease, stop: stop.clone(), once: opts.once, cap: opts.outage_probe_max };
    let outcome = match failed {
        // A wait, not a failure: looked at again later; the attempt is not counted and the
        // breaker is not told (the store answered).
        Err((_, msg, _)) if waits.is_some() => {
            let at = ledger.now_ms() + waits.unwrap_or_default().as_millis() as i64;
            tracing::info!(chunk = %lease.chunk_id, %stage, reason = %msg, "waiting");
            record
                .retrying("wait", || ledger.wait(&lease, &msg, unfinished, at))
                .await
                .map(|o| Ended::Failed(o, lease.task_id, msg.clone(), unfinished.redone_bytes))
        }
        Ok(mut w) => {
            w.redone_bytes = w.redone_bytes.max(lease.tally.redone_bytes());
            let back = breakers.lock().unwrap_or_else(|e| e.into_inner()).succeeded();
            stores_back(&ledger, &opts, back).await;
            let done = record.retrying("complete", || ledger.complete(&lease, w)).await;
            if done.is_ok()
                && let Some(after) = &after
            {
                // Durable before destructive; if the sync fails, what the hook would delete
                // stays for gc, whose sweeps sync first too.
                match ledger.make_durable().await {
                    Ok(()) => after(&lease),
                    Err(e) => {
                        tracing::warn!(chunk = %lease.chunk_id, error = %e, "cannot make the completion durable; its leftovers stay for gc")
                    }
                }
            }
            done.map(|()| Ended::Done(w))
        }
        Err((ErrorClass::Transient, msg, Some(store))) => {
            let task = (lease.task_id, lease.epoch);
            // Asked only while the store is thought up: down, its own schedule probes it.
            let up = !breakers.lock().unwrap_or_else(|e| e.into_inner()).is_down(store);
            let answers = if up { opts.probe(store).await } else { None };
            let verdict = {
                let mut b = breakers.lock().unwrap_or_else(|e| e.into_inner());
                match &answers {
                    Some(r) => b.failed_probed(store, task, r.is_ok()),
                    None => b.failed(store, task),
                }
            };
            let at_ms = |at: Instant| ledger.now_ms() + at.saturating_duration_since(Instant::now()).as_millis() as i64;
            match verdict {
                Verdict::Counted => record.failed(ErrorClass::Transient, &msg, unfinished).await,
                Verdict::Tripped { refund, retry_at } => {
                    let label = opts.label(store);
                    tracing::error!(%stage, store = %label, error = %msg, "store is down: every chunk fails on it and none gets through; claims stop, probes follow, attempts are not counted");
                    emit::store_outages(stage, store).increment(1);
                    emit::store_down(stage, store).set(1.0);
                    best_effort("record the outage", ledger.outage_open(&label, stage, &msg)).await;
                    best_effort("give back the attempts spent on the outage", ledger.refund_attempts(&refund)).await;
                    record
                        .retrying("fail", || ledger.fail_uncounted(&lease, &msg, unfinished, at_ms(retry_at)))
                        .await
                        .map(|o| Ended::Failed(o, lease.task_id, msg.clone(), unfinished.redone_bytes))
                }
                Verdict::StillDown { retry_at, probes, probe } => {
                    let label = opts.label(store);
                    if probe {
                        tracing::warn!(%stage, store = %label, probes, error = %msg, "store still down");
                        best_effort("count the probe", ledger.outage_probe(&label, stage, &msg)).await;
                    } else {
                        tracing::info!(%stage, store = %label, chunk = %lease.chunk_id, error = %msg, "failed while the store is down; retried at its next probe");
                    }
                    record
                        .retrying("fail", || ledger.fail_uncounted(&lease, &msg, unfinished, at_ms(retry_at)))
                        .await
                        .map(|o| Ended::Failed(o, lease.task_id, msg.clone(), unfinished.redone_bytes))
                }
            }
        }
        Err((class, msg, _)) => {
            if class == ErrorClass::Permanent {
                // The store answered (with a refusal): it is not down.
                let back = breakers.lock().unwrap_or_else(|e| e.into_inner()).succeeded();
                stores_back(&ledger, &opts, back).await;
            }
            record.failed(class, &msg, unfinished).await
        }
    };
    match outcome {
        Err(e @ Error::LeaseLost { .. }) => {
            tracing::warn!(chunk = %lease.chunk_id, error = %e, "result discarded: the chunk's lease was taken over");
            Ok(Ended::Lost)
        }
        other => other,
    }
}

/// How long a shutting-down stage waits for a release to be recorded.
const RELEASE_BOUND: Duration = Duration::from_secs(5);

/// Extends the lease every third of its length until the lease is lost (reported once on
/// `lost`) or the task is aborted. A failed beat is retried at the next tick: the lease has
/// two more before it expires.
async fn heartbeat(ledger: Ledger, lease: Lease, lost: tokio::sync::oneshot::Sender<Error>) {
    let beat = (ledger.options().lease / 3).max(Duration::from_millis(50));
    let mut ticker = tokio::time::interval(beat);
    // A paused process wakes to one beat, not a burst of the ones it missed.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        match ledger.heartbeat(&lease).await {
            Ok(()) => {}
            Err(e @ Error::LeaseLost { .. }) => {
                let _ = lost.send(e);
                return;
            }
            Err(e) => tracing::warn!(chunk = %lease.chunk_id, error = %e, "heartbeat failed; will retry"),
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Stores found up again (by a chunk or a probe): their outage records are closed, for every
/// stage (the store answers; a stage that still finds it down opens a new one).
async fn stores_back(ledger: &Ledger, opts: &RunOptions, back: Vec<(&'static str, Duration)>) {
    let stage = opts.stage;
    for (store, down_for) in back {
        let label = opts.label(store);
        tracing::info!(%stage, store = %label, down_for = ?down_for, "store is back; claiming again");
        emit::store_down(stage, store).set(0.0);
        best_effort("close the outage record", ledger.outage_close(&label)).await;
        // Chunks that found it down wait for their next probe time: due now instead.
        best_effort("wake the chunks that waited for the store", ledger.wake_after_outage(stage)).await;
    }
}

/// Probes a store that is down on its probe's word; closes the outage when it answers.
async fn probe_down_store(ledger: &Ledger, opts: &RunOptions, breakers: &std::sync::Mutex<Breakers>, store: &'static str) {
    let Some(answer) = opts.probe(store).await else { return };
    match answer {
        Ok(()) => {
            let back = breakers.lock().unwrap_or_else(|e| e.into_inner()).probe_answered(store);
            stores_back(ledger, opts, back.map(|d| (store, d)).into_iter().collect()).await;
        }
        Err(e) => {
            let probes = breakers.lock().unwrap_or_else(|e| e.into_inner()).probe_failed(store);
            let label = opts.label(store);
            tracing::warn!(stage = %opts.stage, store = %label, probes, error = %e, "store still down");
            best_effort("count the probe", ledger.outage_probe(&label, opts.stage, &e)).await;
        }
    }
}

/// Open outage records of this stage's stores, whoever opened them: each store that answers
/// its probe now has them closed. A `--once` run that exited while the store was down, or a
/// close that failed while the ledger was away, would otherwise leave the record (and the
/// alert on it) open for ever.
async fn heal_recorded_outages(ledger: &Ledger, opts: &RunOptions) {
    if opts.probe.is_none() {
        return;
    }
    let open = match ledger.open_outages().await {
        Ok(o) => o,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the open outages now");
            return;
        }
    };
    let mut seen = std::collections::HashSet::new();
    for (store, _) in &opts.stores {
        let label = opts.label(store);
        if !open.iter().any(|o| o.store == label) || !seen.insert(label.clone()) {
            continue;
        }
        match opts.probe(store).await {
            Some(Ok(())) => {
                tracing::info!(stage = %opts.stage, store = %label, "store answers: closing the outage an earlier run left open");
                best_effort("close the outage record", ledger.outage_close(&label)).await;
            }
            Some(Err(e)) => tracing::info!(stage = %opts.stage, store = %label, error = %e, "store still down (outage left open)"),
            None => {}
        }
    }
}

/// A ledger write that only says how things went (an outage record, a refund): its failure
/// is logged, and never costs the chunk or the stage.
async fn best_effort<T>(what: &str, call: impl Future<Output = Result<T>>) {
    if let Err(e) = call.await {
        tracing::warn!(error = %e, "could not {what} in the ledger; going on");
    }
}

/// Records a chunk's outcome. Under `--watch` a ledger that is down (after the call's own
/// retries) is waited out with capped, jittered backoff: the chunk's result is kept until the
/// ledger answers, or until a shutdown, when the lease is left to expire and the chunk is redone.
struct Recorder<'a> {
    ledger: &'a Ledger,
    lease: &'a Lease,
    stop: tokio::sync::watch::Receiver<bool>,
    once: bool,
    cap: Duration,
}

impl Recorder<'_> {
    async fn retrying<T, Fut>(&self, op: &str, f: impl Fn() -> Fut) -> Result<T>
    where
        Fut: Future<Output = Result<T>>,
    {
        let mut delays = probe_schedule(Duration::from_secs(1), self.cap);
        loop {
            match f().await {
                Err(e) if e.is_transient() && !self.once && !*self.stop.borrow() => {
                    let d = delays.next().unwrap_or(Duration::from_secs(1));
                    tracing::warn!(chunk = %self.lease.chunk_id, error = %e, retry_in = ?d, "ledger unreachable: cannot record the chunk's {op} yet; keeping it");
                    tokio::time::sleep(d).await;
                }
                other => return other,
            }
        }
    }

    /// Records a failed attempt; logs what the ledger made of it (a zombie whose lease was
    /// taken over has quarantined nothing, and says so instead).
    async fn failed(&self, class: ErrorClass, msg: &str, work: Work) -> Result<Ended> {
        let lease = self.lease;
        let outcome = self.retrying("failure", || self.ledger.fail(lease, class, msg, work)).await?;
        match outcome {
            FailOutcome::Retry { .. } => {
                tracing::warn!(chunk = %lease.chunk_id, stage = %lease.stage, attempt = lease.attempt, error = %msg, "chunk failed; will retry")
            }
            FailOutcome::Quarantined => {
                let file = self.ledger.chunk(&lease.chunk_id).await.map(|c| c.file_uri).unwrap_or_else(|_| "?".into());
                tracing::error!(
                    chunk = %lease.chunk_id, stage = %lease.stage, source_file = ?file, attempts = lease.attempt, reason = %msg,
                    "chunk quarantined; after fixing the cause: ferry requeue --chunk {}", lease.chunk_id
                );
            }
        }
        Ok(Ended::Failed(outcome, lease.task_id, msg.to_string(), work.redone_bytes))
    }
}

/// The text a panic was raised with.
pub fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// SIGTERM or SIGINT came: the flag, and the stage's waiters to wake.
struct Shutdown {
    requested: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

static SHUTDOWN: std::sync::OnceLock<Shutdown> = std::sync::OnceLock::new();

/// Listens for SIGTERM and SIGINT from now on (the first call; later ones only return the
/// state). A stage's runtime calls it before anything else (`observe::block_on`): from then on
/// either signal is a request to stop, which the stage answers where it looks (at start, between
/// passes, before a claim), never the default death half-way through start-up. Call it inside
/// the runtime.
fn listen_for_shutdown() -> &'static Shutdown {
    let mut first = false;
    let state = SHUTDOWN.get_or_init(|| {
        first = true;
        Shutdown { requested: std::sync::atomic::AtomicBool::new(false), notify: tokio::sync::Notify::new() }
    });
    if first {
        use tokio::signal::unix::{SignalKind, signal};
        // Installed here, synchronously: a signal from now on is caught, even before the task
        // below first runs.
        let (term, int) = (signal(SignalKind::terminate()).ok(), signal(SignalKind::interrupt()).ok());
        tokio::spawn(async move {
            let recv = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = recv(term) => {}
                _ = recv(int) => {}
            }
            state.requested.store(true, std::sync::atomic::Ordering::SeqCst);
            state.notify.notify_waiters();
        });
    }
    state
}

/// Starts listening for the stop signals now (see [`shutdown_signal`]).
pub(crate) fn catch_stop_signals() {
    listen_for_shutdown();
}

/// Resolves once SIGTERM or SIGINT came, also when it came before this was called (a stage
/// told to stop while it was starting stops at its first look). Call it inside the runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    let state = listen_for_shutdown();
    async move {
        loop {
            let notified = state.notify.notified();
            tokio::pin!(notified);
            // Registered before the flag is read: a signal between the two still wakes us.
            notified.as_mut().enable();
            if state.requested.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

/// A progress bar on stderr when it is a terminal: `prefix [=====>   ] 12/40 unit  msg  ETA 1m`.
pub fn progress_bar(prefix: &str, unit: &str) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new(0);
    b.set_prefix(prefix.to_string());
    let style = format!("{{prefix}} [{{bar:30}}] {{pos}}/{{len}} {unit}  {{msg}}  ETA {{eta}} [{{elapsed}}]");
    b.set_style(indicatif::ProgressStyle::with_template(&style).ok()?.progress_chars("=> "));
    b.enable_steady_tick(Duration::from_millis(500));
    Some(b)
}
