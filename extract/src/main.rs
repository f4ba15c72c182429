//! `ferry-extract`: stage finished source files as chunks on the staging store.

use clap::Parser;
use ferry_common::cli::{self, CommonArgs, StageArgs};
use ferry_extract::{ExtractError, Extractor};
use ferry_ledger::runner::open_stage;

/// Take finished files from the source, split them at record boundaries into chunks, and
/// stage the chunks (cluster B) for ferry-transform. Every file and chunk is recorded in the
/// ledger; a file is never ingested twice, and a changed file is a new version.
#[derive(Parser, Debug)]
#[command(name = "ferry-extract", version, about)]
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

async fn run(args: Args) -> Result<i32, ExtractError> {
    let (cfg, ledger) = open_stage(&args.common, &args.stage).await?;
    let x = Extractor::new(cfg, ledger)?;
    let started = std::time::Instant::now();
    let p = ferry_extract::run(&x, args.stage.once, args.stage.poll).await?;
    eprintln!(
        "extract: {} files chunked into {} chunks ({} records, {} bytes) in {:.1}s; {} quarantined, {} not finished yet, {} already done",
        p.chunked,
        p.chunks,
        p.records,
        p.bytes,
        started.elapsed().as_secs_f64(),
        p.quarantined,
        p.unfinished,
        p.skipped
    );
    Ok(if p.quarantined > 0 { cli::exit::QUARANTINED } else { cli::exit::OK })
}
