//! `ferry-transform`: staged chunks -> Parquet on the local spool.

use std::sync::Arc;

use clap::Parser;
use ferry_common::cli::{self, CommonArgs, StageArgs};
use ferry_common::ledger::{Stage, worker_name};
use ferry_common::runner::{self, RunOptions};
use ferry_transform::Transform;

/// Decode staged chunks (Avro, JSON lines, CSV) into the table's columns, apply the
/// [transform] plan, and write Parquet to the local spool for ferry-copy. Bad records go to
/// the ledger's `rejects` table; a chunk with too many is quarantined, the others flow on.
#[derive(Parser, Debug)]
#[command(name = "ferry-transform", version, about)]
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
    let concurrency = args.stage.concurrency.unwrap_or(cfg.transform.concurrency);
    let t = Arc::new(Transform::new(cfg, ledger.clone()).map_err(|e| ferry_common::Error::Config {
        file: args.stage.config.display().to_string(),
        message: e.to_string(),
    })?);
    t.gc().await.map_err(|e| ferry_common::Error::Other(e.to_string()))?;
    let opts = RunOptions {
        stage: Stage::Transform,
        concurrency,
        once: args.stage.once,
        poll: args.stage.poll,
        grace: args.stage.grace,
        worker: worker_name("transform"),
    };
    let summary = runner::run(&ledger, &opts, move |lease| Box::pin(t.clone().chunk(lease))).await?;
    Ok(summary.exit_code())
}
