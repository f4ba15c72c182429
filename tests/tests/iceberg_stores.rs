//! Iceberg tables (catalog in the ledger) on the cluster stores, loaded through a fault proxy:
//! HDFS (a MiniDFS cluster), read back where it is by Spark with Iceberg's runtime through
//! Hadoop's own HDFS client; S3 (the test server over TLS), read back where it is by PyIceberg.

use ferry_tests::clusters::MiniDfs;
use ferry_tests::proxy::{FaultProxy, Faults};
use ferry_tests::{Pipeline, input_digest};

fn same(got: &serde_json::Value, want: &serde_json::Value, what: &str) {
    ferry_tests::same_digest(got, want, what)
}

fn drained(p: &Pipeline, what: &str) {
    p.drained_within(40, what)
}

/// The table on HDFS, load through a proxy that resets connections right after a `rename2` (a
/// part's move, a metadata file's or manifest's put-if-absent) or a `complete` went out and
/// swallows some replies: writes whose outcome load cannot know. Every record is in once, read
/// by Spark where the table is, current snapshot and the first batch's by id.
#[test]
fn an_iceberg_table_on_hdfs_through_lost_replies_holds_every_record_once() {
    let a = MiniDfs::start("A");
    let proxy = FaultProxy::start(a.addr, 3911);
    let dest = format!(
        "[destination]\nurl = \"{}/wh\"\ntable_format = \"iceberg\"\n[destination.store]\ncall_timeout = \"3s\"\nread_stall = \"10s\"\n",
        a.url
    );
    let p = Pipeline::with_stores("16KiB", "5s", "0s", None, Some(dest));
    // Every stage reaches A through the proxy: the table's URLs (which the metadata holds) are
    // the proxy's, and Spark reads through it too once the faults stop.
    p.stage_env("ferry-copy", "FERRY_DESTINATION_URL", &format!("hdfs://{}/wh", proxy.addr));
    p.stage_env("ferry-load", "FERRY_DESTINATION_URL", &format!("hdfs://{}/wh", proxy.addr));
    p.stage_env("ferry", "FERRY_DESTINATION_URL", &format!("hdfs://{}/wh", proxy.addr));
    p.raise_attempt_cap(40);
    p.add_jsonl_batch("a", 2, 300, 11);
    drained(&p, "the first batch");
    let first = input_digest("jsonl", &p.path("in"));
    let snaps = ferry_tests::spark_iceberg_sql(
        &p.ledger_url(),
        &["SELECT snapshot_id FROM ferry.default.events.snapshots ORDER BY committed_at DESC LIMIT 1"],
    );
    let after_first: i64 = snaps[0][0][0].parse().unwrap();
    proxy.set(Faults {
        on_request: vec![(b"rename2".to_vec(), 0.25, true), (b"rename2".to_vec(), 0.15, false), (b"complete".to_vec(), 0.1, false)],
        ..Faults::default()
    });
    p.add_jsonl_batch("b", 3, 300, 12);
    drained(&p, "HDFS through faults");
    let c = proxy.counters();
    let hit = c.pattern_resets.load(std::sync::atomic::Ordering::SeqCst) + c.silences.load(std::sync::atomic::Ordering::SeqCst);
    assert!(hit > 0, "the proxy cut some of the writes' requests");
    p.assert_attempts_within(40);
    proxy.set(Faults::default());
    let all = input_digest("jsonl", &p.path("in"));
    let spark = ferry_tests::spark_iceberg_digests(&p.ledger_url(), "default.events", &[None, Some(after_first)]);
    same(&spark[0], &all, "Spark, on HDFS");
    same(&spark[1], &first, "Spark, on HDFS, the first batch's snapshot");
    let verify = p.command("ferry").arg("verify").output().unwrap();
    assert!(verify.status.success(), "verify: {}", String::from_utf8_lossy(&verify.stderr));
}

/// The table on S3, load through a proxy that resets a third of its connections at a random
/// byte of either direction (a reset in a reply to a PUT is a write that landed with its answer
/// lost). Every record is in once, read where it is by PyIceberg through the catalog in the
/// ledger, at the current snapshot and at the first batch's.
#[test]
fn an_iceberg_table_on_s3_through_resets_holds_every_record_once() {
    use ferry_tests::clusters::S3Server;
    let s3 = S3Server::from_env();
    let proxy = FaultProxy::start(s3.addr, 3912);
    let prefix = format!("iceberg-{}", std::process::id());
    let dest = s3.destination_toml(&prefix, &format!("https://{}", proxy.addr), 2, "12s").replacen(
        "[destination.store]",
        "table_format = \"iceberg\"\n[destination.store]",
        1,
    );
    let p = Pipeline::with_stores("16KiB", "5s", "0s", None, Some(dest));
    p.raise_attempt_cap(40);
    p.add_jsonl_batch("a", 2, 300, 21);
    drained(&p, "the first batch");
    let first = input_digest("jsonl", &p.path("in"));
    let url = p.ledger_url();
    let after_first = current_snapshot(&url);
    proxy.set(Faults { reset: 0.35, reset_within: 24 << 10, reset_both_ways: true, ..Faults::default() });
    let resets = || proxy.counters().resets.load(std::sync::atomic::Ordering::SeqCst);
    for round in 0..8u64 {
        p.add_jsonl_batch(&format!("more{round}"), 1, 200, 30 + round);
        drained(&p, "S3 through resets");
        if resets() > 0 {
            break;
        }
    }
    assert!(resets() > 0, "the proxy reset some of the stages' connections");
    p.assert_attempts_within(40);
    proxy.set(Faults::default());
    same(&p.table_digest(), &input_digest("jsonl", &p.path("in")), "PyIceberg, on S3");
    same(&ferry_tests::iceberg_digest(&url, "default.events", Some(after_first)), &first, "PyIceberg, on S3, the first batch's snapshot");
    let verify = p.command("ferry").arg("verify").output().unwrap();
    assert!(verify.status.success(), "verify: {}", String::from_utf8_lossy(&verify.stderr));
}

/// The id of the table's current snapshot, as PyIceberg reads the table's metadata.
fn current_snapshot(ledger_url: &str) -> i64 {
    const SCRIPT: &str = r#"
import sys, os
from pyiceberg.catalog.sql import SqlCatalog
e = os.environ
s3 = {"s3.endpoint": e["FERRY_TEST_S3_ENDPOINT"], "s3.access-key-id": e["FERRY_TEST_S3_ACCESS_KEY"],
      "s3.secret-access-key": e["FERRY_TEST_S3_SECRET_KEY"], "s3.region": "us-east-1"}
t = SqlCatalog("ferry", uri=sys.argv[1], init_catalog_tables="false", **s3).load_table("default.events")
print(t.current_snapshot().snapshot_id)
sys.stdout.flush()
os._exit(0)
"#;
    let out = ferry_tests::pyiceberg_python().args(["-c", SCRIPT, &ferry_tests::sqlalchemy_url(ledger_url)]).output().unwrap();
    assert!(out.status.success(), "pyiceberg: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}
