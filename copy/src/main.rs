//! `ferry-copy`: spool -> destination, one verified chunk at a time.

use std::sync::Arc;

use ferry_common::cli::{self, StageCli};
use ferry_copy::{Copier, CopyError};
use ferry_ledger::Stage;
use ferry_runtime::runner::{self, StoreProbe, Stores, open_stage};

fn main() {
    let args = cli::parse_stage("ferry-copy", ferry_ledger::version());
    cli::init_logging(args.common.log_format);
    cli::exit_with(ferry_runtime::observe::block_on(args.stage.watch, run(args)))
}

async fn run(args: StageCli) -> Result<i32, CopyError> {
    let (cfg, ledger) = open_stage(&args.common, &args.stage).await?;
    // The store whose outage pauses this stage (its errors name it), and the ledger.
    let stores = vec![("destination", cfg.destination.url.clone()), ("ledger", "the work ledger".to_string())];
    let concurrency = cfg.copy_concurrency();
    let c = Arc::new(Copier::new(cfg, ledger.clone()).map_err(|e| args.stage.config_error(e))?);
    // The store's own probe tells its outage from a chunk's failure.
    let probe = StoreProbe(Arc::new(c.destination().clone().prober("destination")));
    runner::cleanup(c.gc()).await;
    let (work, after) = (c.clone(), c.clone());
    let code = runner::serve(
        &ledger,
        &args.stage,
        Stage::Copy,
        concurrency,
        Stores { names: stores, probe: Some(probe) },
        move |lease| Box::pin(work.clone().chunk(lease)),
        Some(Arc::new(move |lease| after.remove_spool(lease))),
    )
    .await?;
    if c.hedges() > 0 {
        tracing::info!(started = c.hedges(), won = c.hedges_won(), "hedged uploads");
    }
    // Aborts of cut-off uploads still running in the background finish before the exit.
    let left = ferry_storage::background_settled(std::time::Duration::from_secs(30)).await;
    if left > 0 {
        tracing::warn!(left, "background cleanups did not finish; gc will");
    }
    Ok(code)
}
