//! `ferry-transform`: staged chunks -> Parquet on the local spool.

use std::sync::Arc;

use ferry_common::cli::{self, StageCli};
use ferry_ledger::Stage;
use ferry_runtime::runner::{self, StoreProbe, Stores, open_stage};
use ferry_transform::{TransformError, Transformer};

fn main() {
    let args = cli::parse_stage("ferry-transform", ferry_ledger::version());
    cli::init_logging(args.common.log_format);
    cli::exit_with(ferry_runtime::observe::block_on(args.stage.watch, run(args)))
}

async fn run(args: StageCli) -> Result<i32, TransformError> {
    let (cfg, ledger) = open_stage(&args.common, &args.stage).await?;
    // The store whose outage pauses this stage (its errors name it), and the ledger.
    let stores = vec![("staging", cfg.staging.url.clone()), ("ledger", "the work ledger".to_string())];
    let concurrency = cfg.transform.concurrency;
    let s = Arc::new(Transformer::new(cfg, ledger.clone()).map_err(|e| args.stage.config_error(e))?);
    // The store's own probe tells its outage from a chunk's failure.
    let probe = StoreProbe(Arc::new(s.staging().clone().prober("staging")));
    runner::cleanup(s.gc()).await;
    let work = move |lease| Box::pin(s.clone().chunk(lease)) as runner::TaskFuture<_>;
    Ok(runner::serve(&ledger, &args.stage, Stage::Transform, concurrency, Stores { names: stores, probe: Some(probe) }, work, None).await?)
}
