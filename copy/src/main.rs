//! `ferry-copy`: spool -> destination, one verified chunk at a time.

use std::sync::Arc;

use clap::Parser;
use ferry_common::cli::{self, CommonArgs, StageArgs};
use ferry_common::ledger::{Stage, worker_name};
use ferry_common::runner::{self, RunOptions};
use ferry_copy::Copy;

/// Move each transformed chunk from the local spool to the destination (cluster A): upload to
/// a temp name under a deadline and a no-progress watchdog, verify size and hash, rename into
/// place. A reset or a hung connection redoes one chunk, with backoff; the others keep going.
#[derive(Parser, Debug)]
#[command(name = "ferry-copy", version, about)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    stage: StageArgs,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    cli::init_logging(args.common.log_format);
    cli::exit_with(run(args).await)
}

async fn run(args: Args) -> ferry_common::Result<i32> {
    let (cfg, ledger) = cli::open_stage(&args.common, &args.stage).await?;
    let concurrency = args.stage.concurrency.unwrap_or(cfg.copy.concurrency);
    let c = Arc::new(Copy::new(cfg, ledger.clone()).map_err(|e| ferry_common::Error::Other(e.to_string()))?);
    c.gc().await.map_err(|e| ferry_common::Error::Other(e.to_string()))?;
    let opts = RunOptions {
        stage: Stage::Copy,
        concurrency,
        once: args.stage.once,
        poll: args.stage.poll,
        grace: args.stage.grace,
        worker: worker_name("copy"),
    };
    let work = c.clone();
    let after = c.clone();
    let summary = runner::run_with(
        &ledger,
        &opts,
        move |lease| Box::pin(work.clone().chunk(lease)),
        Arc::new(move |lease| after.remove_spool(lease)),
    )
    .await?;
    Ok(summary.exit_code())
}
