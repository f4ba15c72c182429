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

use ferry_common::cli::{CommonArgs, StageArgs, exit};
use ferry_common::config::Config;
use ferry_common::error::{Classified, ErrorClass};
use futures::FutureExt;
use tokio::task::JoinSet;

use crate::{Error, FailOutcome, Lease, Ledger, LedgerOptions, Result, Stage, TaskState, Work};

/// What every stage binary does first: load the config (flags and env win), connect to the
/// ledger and migrate it.
pub async fn open_stage(common: &CommonArgs, args: &StageArgs) -> Result<(Config, Ledger)> {
    let mut cfg = Config::load(&args.config)?;
    if let Some(url) = &common.ledger {
        cfg.ledger.url = url.clone();
    }
    let ledger = Ledger::connect(&cfg.ledger.url, LedgerOptions::from_config(&cfg.ledger)).await?;
    Ok((cfg, ledger))
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub stage: Stage,
    pub concurrency: usize,
    /// `--once`: exit when nothing is claimable and nothing is in flight. Otherwise poll.
    pub once: bool,
    pub poll: Duration,
    /// How long in-flight chunks may finish after SIGTERM before their leases are released.
    pub grace: Duration,
    pub worker: String,
}

/// A stage's start-up cleanup of abandoned temp files, best effort: a store that is down
/// right now must not stop the stage; the next start collects what this one could not.
pub async fn cleanup<E: std::fmt::Display>(gc: impl Future<Output = std::result::Result<(), E>>) {
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
    /// Tasks of this stage left quarantined in the ledger (not only by this run).
    pub quarantined_total: i64,
    /// Tasks of this stage still waiting (e.g. for a retry's backoff).
    pub pending: i64,
}

impl Summary {
    pub fn line(&self, stage: Stage, elapsed: Duration) -> String {
        format!(
            "{stage}: {} chunks done, {} records, {} bytes in {:.1}s; {} retried, {} quarantined ({} in ledger), {} leases lost, {} released, {} pending",
            self.done,
            self.records,
            self.bytes,
            elapsed.as_secs_f64(),
            self.retries,
            self.quarantined,
            self.quarantined_total,
            self.lost,
            self.released,
            self.pending
        )
    }

    /// The process exit code for this run (see `ferry_common::cli::exit`).
    pub fn exit_code(&self) -> i32 {
        if self.quarantined_total > 0 { exit::QUARANTINED } else { exit::OK }
    }
}

pub type TaskFuture<E> = Pin<Box<dyn Future<Output = std::result::Result<Work, E>> + Send>>;

enum Ended {
    Done(Work),
    Failed(FailOutcome),
    Lost,
    Released,
}

/// What a chunk stage's binary does after setting itself up: run under the flags of
/// [`StageArgs`] and turn the summary into the process exit code.
pub async fn serve<E, F>(ledger: &Ledger, args: &StageArgs, stage: Stage, concurrency: usize, work: F, after: AfterCommit) -> Result<i32>
where
    E: Classified,
    F: Fn(Lease) -> TaskFuture<E> + Send + Sync + 'static,
{
    let opts = RunOptions {
        stage,
        concurrency: args.concurrency.unwrap_or(concurrency),
        once: args.once,
        poll: args.poll,
        grace: args.grace,
        worker: crate::worker_name(stage.as_str()),
    };
    Ok(run(ledger, &opts, work, after).await?.exit_code())
}

/// Called after a chunk's completion is committed: the place to delete what only the
/// finished stage needed (the spool file copy shipped), which must outlive the commit.
pub type AfterCommit = Arc<dyn Fn(&Lease) + Send + Sync>;

/// Runs a stage until `--once` finds nothing left, or until a shutdown signal; `after` runs
/// after each committed completion.
pub async fn run<E, F>(ledger: &Ledger, opts: &RunOptions, work: F, after: AfterCommit) -> Result<Summary>
where
    E: Classified,
    F: Fn(Lease) -> TaskFuture<E> + Send + Sync + 'static,
{
    let work = Arc::new(work);
    let started = Instant::now();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::warn!("shutdown requested: no new claims; finishing in-flight chunks");
        let _ = stop_tx.send(true);
    });
    let bar = progress_bar(opts.stage);
    let mut summary = Summary::default();
    let mut set: JoinSet<Result<Ended>> = JoinSet::new();
    let mut stop = stop_rx.clone();
    loop {
        let stopping = *stop.borrow();
        let mut claimed = 0;
        if !stopping && set.len() < opts.concurrency {
            let free = (opts.concurrency - set.len()) as i64;
            for lease in ledger.claim(opts.stage, &opts.worker, free).await? {
                claimed += 1;
                set.spawn(run_one(ledger.clone(), lease, work.clone(), after.clone(), stop_rx.clone(), opts.grace));
            }
        }
        if set.is_empty() && (stopping || (opts.once && claimed == 0)) {
            break;
        }
        if claimed > 0 && set.len() < opts.concurrency {
            continue; // more may be claimable right away
        }
        tokio::select! {
            joined = set.join_next(), if !set.is_empty() => {
                if let Some(joined) = joined {
                    let ended = joined.map_err(|e| Error::Internal(format!("{} task failed: {e}", opts.stage)))??;
                    tally(&mut summary, ended);
                    if let Some(b) = &bar {
                        b.set_message(format!("{} done, {} retried, {} quarantined", summary.done, summary.retries, summary.quarantined));
                        b.tick();
                    }
                }
            }
            _ = tokio::time::sleep(opts.poll), if set.len() < opts.concurrency && !opts.once => {}
            _ = stop.changed(), if !stopping => {}
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    summary.pending = ledger.pending(opts.stage).await?;
    summary.quarantined_total = ledger.status().await?.tasks(Some(opts.stage), TaskState::Quarantined);
    eprintln!("{}", summary.line(opts.stage, started.elapsed()));
    Ok(summary)
}

fn tally(s: &mut Summary, ended: Ended) {
    match ended {
        Ended::Done(w) => {
            s.done += 1;
            s.records += w.records;
            s.bytes += w.bytes;
        }
        Ended::Failed(FailOutcome::Retry { .. }) => s.retries += 1,
        Ended::Failed(FailOutcome::Quarantined) => s.quarantined += 1,
        Ended::Lost => s.lost += 1,
        Ended::Released => s.released += 1,
    }
}

/// Works on one lease: heartbeats while the work runs, then records the outcome. A lost lease
/// abandons the work (someone else owns the chunk now); a shutdown past `grace` releases it.
async fn run_one<E, F>(
    ledger: Ledger,
    lease: Lease,
    work: Arc<F>,
    after: AfterCommit,
    mut stop: tokio::sync::watch::Receiver<bool>,
    grace: Duration,
) -> Result<Ended>
where
    E: Classified,
    F: Fn(Lease) -> TaskFuture<E> + Send + Sync + 'static,
{
    let beat = (ledger.options().lease / 3).max(Duration::from_millis(50));
    // A panic in the chunk's work is this chunk's failure, not the stage's end.
    let fut = std::panic::AssertUnwindSafe(work(lease.clone())).catch_unwind();
    tokio::pin!(fut);
    let mut ticker = tokio::time::interval(beat);
    ticker.tick().await;
    let mut deadline: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let result = loop {
        tokio::select! {
            r = &mut fut => break r,
            _ = ticker.tick() => {
                match ledger.heartbeat(&lease).await {
                    Ok(()) => {}
                    Err(e @ Error::LeaseLost { .. }) => {
                        tracing::warn!(chunk = %lease.chunk_id, error = %e, "abandoning chunk");
                        return Ok(Ended::Lost);
                    }
                    Err(e) => tracing::warn!(chunk = %lease.chunk_id, error = %e, "heartbeat failed; will retry"),
                }
            }
            _ = stop.changed(), if deadline.is_none() => {
                deadline = Some(Box::pin(tokio::time::sleep(grace)));
            }
            _ = async { deadline.as_mut().unwrap().await }, if deadline.is_some() => {
                tracing::warn!(chunk = %lease.chunk_id, "grace period over; releasing the chunk");
                return match ledger.release(&lease).await {
                    Ok(()) => Ok(Ended::Released),
                    Err(Error::LeaseLost { .. }) => Ok(Ended::Lost),
                    Err(e) => Err(e),
                };
            }
        }
    };
    let failed = match result {
        Ok(Ok(w)) => Ok(w),
        Ok(Err(e)) => Err((e.class(), e.to_string())),
        Err(panic) => {
            Err((ErrorClass::Transient, format!("{} of chunk {} panicked: {}", lease.stage, lease.chunk_id, panic_message(&panic))))
        }
    };
    let outcome = match failed {
        Ok(w) => ledger.complete(&lease, w).await.map(|_| {
            after(&lease);
            Ended::Done(w)
        }),
        Err((class, msg)) => {
            match class {
                ErrorClass::Transient => {
                    tracing::warn!(chunk = %lease.chunk_id, attempt = lease.attempt, error = %msg, "chunk failed; will retry")
                }
                ErrorClass::Permanent => tracing::error!(chunk = %lease.chunk_id, error = %msg, "chunk quarantined"),
            }
            ledger.fail(&lease, class, &msg, Work::default()).await.map(Ended::Failed)
        }
    };
    match outcome {
        Err(e @ Error::LeaseLost { .. }) => {
            tracing::warn!(chunk = %lease.chunk_id, error = %e, "result discarded");
            Ok(Ended::Lost)
        }
        other => other,
    }
}

/// The text a panic was raised with.
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

fn progress_bar(stage: Stage) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new_spinner();
    b.set_prefix(stage.to_string());
    b.set_style(indicatif::ProgressStyle::with_template("{spinner} {prefix}: {msg} [{elapsed}]").ok()?);
    b.enable_steady_tick(Duration::from_millis(200));
    Some(b)
}
