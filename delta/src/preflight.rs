//! What `ferry doctor` checks of a Delta table before any load: that the destination store
//! refuses a second create of one object (a Delta commit is a put-if-absent), and that the
//! table's log reads and asks nothing of writers that Ferry does not give (a feature, other
//! partition columns), so a table another engine set up is refused by name before any chunk
//! fails on it.

use ferry_runtime::config::Config;
use ferry_storage::Store;
use ferry_table::{Preflight, StepFailed};

use crate::DeltaLog;

/// Runs the checks into `p` (the first failure ends them).
pub async fn preflight(cfg: &Config, p: &mut Preflight) -> Result<(), StepFailed> {
    let store = match Store::open(&cfg.destination.url, &cfg.destination.store) {
        Ok(store) => store,
        Err(e) => return p.fail("open", ferry_common::error::with_causes(&e)),
    };
    let name = &cfg.table.name;
    put_if_absent(p, &store, name).await?;
    let snapshot = p.step("read the Delta log", DeltaLog::new(store.clone(), name).snapshot()).await?;
    if snapshot.version < 0 {
        p.note("no table yet: the first load creates it".into());
        return Ok(());
    }
    p.note(format!("version {}, {} active file(s)", snapshot.version, snapshot.files.len()));
    if let Some(why) = snapshot.unwritable(&store.url(name)) {
        return p.fail("table features", why);
    }
    let partitioned = snapshot.partition_columns();
    if partitioned != cfg.table.partition_by {
        return p.fail(
            "partition columns",
            format!("the table is partitioned by {partitioned:?}, [table] partition_by says {:?}", cfg.table.partition_by),
        );
    }
    p.steps.push(format!(
        "table features: none Ferry does not write{}",
        if snapshot.append_only() { "; append-only (a corrected file or a rerun that replaces rows is refused)" } else { "" }
    ));
    Ok(())
}

/// A Delta commit is a put-if-absent: two writers (two loads, Ferry and another engine) that
/// create the same log version must not both succeed. A store that lets a second create replace
/// the first (an S3-compatible server that ignores `If-None-Match`) would lose commits without a
/// word, so it is refused here by name: a probe object under the table's `_ferry/` is created
/// twice; the second create must be refused and the first one's bytes kept. The probe is removed.
async fn put_if_absent(p: &mut Preflight, store: &Store, table: &str) -> Result<(), StepFailed> {
    let nonce = format!("{}-{}", std::process::id(), chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default());
    let probe = format!("{table}/_ferry/put-if-absent-probe-{nonce}");
    let first = p.step("put-if-absent: a new object", store.create_new(&probe, b"first".to_vec())).await;
    let second = match first {
        Ok(true) => p.step("put-if-absent: the same object again", store.create_new(&probe, b"second".to_vec())).await,
        Ok(false) => Ok(true),
        Err(e) => Err(e),
    };
    let kept = match second {
        Ok(_) => p.step("read the probe back", store.read(&probe)).await,
        Err(e) => Err(e),
    };
    if let Err(e) = store.delete(&probe).await {
        p.steps.push(format!("remove the probe: {} is left ({e}); delete it by hand", store.url(&probe)));
    }
    let (first, second, kept) = (first?, second?, kept?);
    if !first || second || kept != b"first" {
        return p.fail(
            "put-if-absent",
            format!(
                "{} let a second create of the same object replace the first (it does not honour If-None-Match): a Delta \
                 table there would lose commits; use a store that does, or destination.table_format = \"hive\"",
                store.url("")
            ),
        );
    }
    p.note("a second create is refused, as a Delta commit needs".into());
    Ok(())
}
