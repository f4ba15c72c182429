//! `ferry-load`: publish landed chunks into the table, exactly once.

use std::sync::Arc;

use ferry_common::cli::{self, StageCli};
use ferry_ledger::Stage;
use ferry_load::{LoadError, Loader};
use ferry_runtime::runner::{self, StoreProbe, Stores, open_stage};

fn main() {
    let args = cli::parse_stage("ferry-load", ferry_ledger::version());
    cli::init_logging(args.common.log_format);
    cli::exit_with(ferry_runtime::observe::block_on(args.stage.watch, run(args)))
}

async fn run(args: StageCli) -> Result<i32, LoadError> {
    let (cfg, ledger) = open_stage(&args.common, &args.stage).await?;
    // The store whose outage pauses this stage (its errors name it), and the ledger.
    let stores = vec![("destination", cfg.destination.url.clone()), ("ledger", "the work ledger".to_string())];
    let concurrency = cfg.load_concurrency();
    let s = Arc::new(Loader::new(cfg, ledger.clone()).map_err(|e| args.stage.config_error(e))?);
    // The store's own probe tells its outage from a chunk's failure.
    let probe = StoreProbe(Arc::new(s.destination().clone().prober("destination")));
    // gc touches only what crashed writers left long ago (older than a copy deadline plus two
    // leases), never what this run publishes: it runs side by side with the chunks.
    let gc = tokio::spawn({
        let s = s.clone();
        async move { runner::cleanup(s.gc()).await }
    });
    // What the table's format keeps up to date while chunks go in (the Hive layout's DDL).
    let upkeep = tokio::spawn({
        let table = s.table().clone();
        async move { table.upkeep().await }
    });
    let table = s.table().clone();
    let work = move |lease| Box::pin(s.clone().chunk(lease)) as runner::TaskFuture<_>;
    let served =
        runner::serve(&ledger, &args.stage, Stage::Load, concurrency, Stores { names: stores, probe: Some(probe) }, work, None).await;
    // The table's metadata as the ledger has it now (the Hive layout's DDL), before the stage
    // exits, however serving ended. Its failure is the exit status only when serving went well
    // (it is logged either way).
    let finished = table.finish().await;
    let _ = upkeep.await;
    if let Err(e) = &finished {
        tracing::error!(error = %e, "the table's metadata could not be rewritten; the next run that publishes rewrites it");
    }
    let _ = gc.await;
    let code = served?;
    finished?;
    Ok(code)
}
