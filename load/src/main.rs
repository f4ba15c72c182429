//! `ferry-load`: publish landed chunks into the table, exactly once.

use std::sync::Arc;

use clap::Parser;
use ferry_common::cli::{self, CommonArgs, StageArgs};
use ferry_common::ledger::{Stage, worker_name};
use ferry_common::runner::{self, RunOptions};
use ferry_load::Load;

/// Publish each landed chunk into the Hive-partitioned table as
/// <table>/<k=v>/part-<chunk>.parquet by atomic rename, record it in the ledger, and keep the
/// table's manifest and Hive DDL under <table>/_ferry/. Re-running publishes nothing twice.
#[derive(Parser, Debug)]
#[command(name = "ferry-load", version, about)]
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
    let concurrency = args.stage.concurrency.unwrap_or(cfg.load.concurrency);
    let l = Arc::new(Load::new(cfg, ledger.clone()).map_err(|e| ferry_common::Error::Other(e.to_string()))?);
    l.gc().await.map_err(|e| ferry_common::Error::Other(e.to_string()))?;
    let opts = RunOptions {
        stage: Stage::Load,
        concurrency,
        once: args.stage.once,
        poll: args.stage.poll,
        grace: args.stage.grace,
        worker: worker_name("load"),
    };
    let summary = runner::run(&ledger, &opts, move |lease| Box::pin(l.clone().chunk(lease))).await?;
    Ok(summary.exit_code())
}
