//! `ferry-extract`: stage finished source files as chunks on the staging store.

use ferry_common::cli::{self, StageCli};
use ferry_extract::{ExtractError, Extractor};
use ferry_ledger::FileState;
use ferry_runtime::observe::Observer;
use ferry_runtime::runner::{self, open_stage};

fn main() {
    let args = cli::parse_stage("ferry-extract", ferry_ledger::version());
    cli::init_logging(args.common.log_format);
    cli::exit_with(ferry_runtime::observe::block_on(args.stage.watch, run(args)))
}

async fn run(args: StageCli) -> Result<i32, ExtractError> {
    let (cfg, ledger) = open_stage(&args.common, &args.stage).await?;
    let x = Extractor::new(cfg, ledger.clone())?;
    let stores = x.stores();
    if let Some(probe) = &stores.probe {
        let wait = (!args.stage.once).then_some(args.stage.start_wait);
        runner::stores_answer_at_start(&stores.names, probe, wait, ledger.options().outage_probe_max).await?;
    }
    let observer = Observer::start("extract", &args.stage, &ledger).await?;
    let x = x.with_health(observer.health());
    let started = std::time::Instant::now();
    let p = ferry_extract::run(&x, args.stage.once, args.stage.poll, args.stage.progress_interval).await?;
    // 3 means what it means for every stage: something of this stage (a source file) is
    // quarantined in the ledger, whichever run set it aside.
    let quarantined_total = match ledger.status().await {
        Ok(s) => s.files.iter().filter(|(s, _)| *s == FileState::Quarantined).map(|f| f.1).sum::<i64>(),
        // A --watch service stopping while the ledger is away still stops cleanly.
        Err(e) if !args.stage.once && e.is_transient() => {
            tracing::warn!(error = %e, "could not read the closing counts from the ledger");
            0
        }
        Err(e) => return Err(e.into()),
    };
    let secs = started.elapsed().as_secs_f64();
    if cli::json_logs() {
        tracing::info!(
            target: "ferry::summary",
            stage = "extract", files = p.chunked, chunks = p.chunks, records = p.records, bytes = p.bytes, seconds = secs,
            quarantined = p.quarantined, quarantined_in_ledger = quarantined_total, unfinished = p.unfinished, skipped = p.skipped,
            reused = p.reused, arrived_again = p.arrived_again, "summary"
        );
    } else {
        eprintln!(
            "extract: {} files chunked into {} chunks ({} records, {} bytes) in {secs:.1}s; {} quarantined ({quarantined_total} in ledger), {} not finished yet, {} already done{}",
            p.chunked,
            p.chunks,
            p.records,
            p.bytes,
            p.quarantined,
            p.unfinished,
            p.skipped,
            if p.reused > 0 { format!("; {} chunks staged by an interrupted run kept", p.reused) } else { String::new() }
        );
        if p.arrived_again > 0 {
            eprintln!(
                "extract: {} file(s) held bytes taken in before under the same name; not taken in again (versions = keep), listed by `ferry status`",
                p.arrived_again
            );
        }
    }
    let code = if let Some(why) = p.stalled() {
        tracing::error!(stage = "extract", "no progress: {why}");
        cli::exit::NO_PROGRESS
    } else if quarantined_total > 0 {
        cli::exit::QUARANTINED
    } else {
        cli::exit::OK
    };
    observer.finish(&ledger, code).await;
    Ok(code)
}
