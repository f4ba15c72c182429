//! `[destination.iceberg] catalog = "rest"`: the table in a real Iceberg REST catalog (Iceberg's
//! own test server, `RESTCatalogServer`), read back through the same catalog by PyIceberg and by
//! Spark with Iceberg's runtime, at the current snapshot and by snapshot id; another writer's
//! commits between loads and during two loads at once kept; commits whose replies are lost, and
//! a load killed at every step, settled with every record once.

use ferry_tests::clusters::{IcebergRest, MiniDfs};
use ferry_tests::proxy::{FaultProxy, Faults};
use ferry_tests::{Pipeline, STAGES, input_digest};

fn same(got: &serde_json::Value, want: &serde_json::Value, what: &str) {
    ferry_tests::same_digest(got, want, what)
}

fn drained(p: &Pipeline, what: &str) {
    p.drained_within(30, what)
}

fn ferry_ok(p: &Pipeline, args: &[&str]) -> String {
    let out = p.command("ferry").args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "ferry {args:?}: {text}");
    text
}

/// What PyIceberg reads of the table through the REST catalog at `uri`: its snapshots (id,
/// operation, Ferry's marker), properties and live data files; with `append`, first appends
/// those ids as another writer and sets a property of its own.
fn through_pyiceberg(uri: &str, append: &[&str]) -> serde_json::Value {
    const SCRIPT: &str = r#"
import sys, json, os, datetime
import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog
t = RestCatalog("ferry", uri=sys.argv[1]).load_table("default.events")
ids = json.loads(sys.argv[2])
if ids:
    ts = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.timezone.utc)
    rows = {"event_id": ids, "ts": [ts] * len(ids), "host": ["other"] * len(ids), "kind": ["k"] * len(ids),
            "user_id": [7] * len(ids), "payload": ["from pyiceberg"] * len(ids), "score": [None] * len(ids),
            "dt": [ts.date()] * len(ids)}
    t.append(pa.Table.from_pydict(rows, schema=t.schema().as_arrow()))
    with t.transaction() as tx:
        tx.set_properties({"owner.note": "kept"})
    t = RestCatalog("ferry", uri=sys.argv[1]).load_table("default.events")
snaps = [{"id": s.snapshot_id, "operation": s.summary.operation.value,
          "chunks": s.summary.additional_properties.get("ferry.chunks")} for s in t.snapshots()]
files = [f.file.file_path for f in t.scan().plan_files()]
print(json.dumps({"snapshots": snaps, "properties": t.properties, "files": files, "format_version": t.metadata.format_version}))
sys.stdout.flush()
os._exit(0)
"#;
    let list = serde_json::to_string(append).unwrap();
    let out = std::process::Command::new("python3").args(["-c", SCRIPT, uri, &list]).output().unwrap();
    assert!(out.status.success(), "pyiceberg: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The chunks Ferry's snapshots name (`ferry.chunks`), each once across them all.
fn chunks_in(facts: &serde_json::Value) -> std::collections::BTreeSet<String> {
    let mut chunks = std::collections::BTreeSet::new();
    for s in facts["snapshots"].as_array().unwrap() {
        if s["operation"] != "append" {
            continue;
        }
        for c in s["chunks"].as_str().unwrap_or_default().split(',').filter(|c| !c.is_empty()) {
            let (chunk, _) = c.split_once('@').unwrap();
            assert!(chunks.insert(chunk.to_string()), "chunk {chunk} appended in two snapshots: {facts}");
        }
    }
    chunks
}

/// Two batches into a table of the REST catalog, another writer's append between them: PyIceberg
/// and Spark, through the catalog, read every record once at the current snapshot and the first
/// batch's by id; the other writer's rows and property are kept; a rerun with other bytes is one
/// overwrite; verify agrees; a vacuum expires Ferry's old snapshots through the catalog.
#[test]
fn a_table_in_a_rest_catalog_is_read_once_by_pyiceberg_and_spark() {
    let rest = IcebergRest::start();
    let p = Pipeline::new("16KiB", "30s", "0s").table_format("iceberg").rest_catalog(&rest.url);
    p.add_jsonl_batch("a", 3, 400, 1);
    drained(&p, "the first batch");
    let first = input_digest("jsonl", &p.path("in"));
    same(&p.table_digest(), &first, "PyIceberg, after the first batch");
    let facts = through_pyiceberg(&rest.url, &[]);
    assert_eq!(facts["format_version"], 2);
    assert!(facts["properties"]["schema.name-mapping.default"].is_string(), "{}", facts["properties"]);
    let after_first = facts["snapshots"].as_array().unwrap().last().unwrap()["id"].as_i64().unwrap();

    let facts = through_pyiceberg(&rest.url, &["theirs-1", "theirs-2", "theirs-3"]);
    let before = facts["snapshots"].as_array().unwrap().len();
    p.add_jsonl_batch("b", 2, 300, 2);
    drained(&p, "the second batch");
    let ours = input_digest("jsonl", &p.path("in"));
    let facts = through_pyiceberg(&rest.url, &[]);
    assert!(facts["snapshots"].as_array().unwrap().len() > before, "Ferry committed after the other writer: {facts}");
    assert_eq!(facts["properties"]["owner.note"], "kept", "{}", facts["properties"]);
    assert_eq!(chunks_in(&facts).len() as i64, p.count("SELECT COUNT(*) FROM chunks"), "every chunk in one snapshot: {facts}");
    let got = p.table_digest();
    assert_eq!(got["rows"].as_i64().unwrap(), ours["rows"].as_i64().unwrap() + 3, "Ferry's rows and the other writer's 3: {got}");
    assert_eq!(got["rows"], got["distinct"], "{got}");
    same(&ferry_tests::iceberg_digest(&rest.url, "default.events", Some(after_first)), &first, "PyIceberg, the first batch's snapshot");
    let spark = ferry_tests::spark_iceberg_digests(&rest.url, "default.events", &[None, Some(after_first)]);
    assert_eq!(spark[0]["rows"], got["rows"], "Spark, current: {}", spark[0]);
    assert_eq!(spark[0]["digest"], got["digest"], "Spark and PyIceberg read the same: {}", spark[0]);
    same(&spark[1], &first, "Spark, the first batch's snapshot");
    // The ledger's files are the live files of Ferry's chunks.
    let files = facts["files"].as_array().unwrap();
    assert_eq!(files.len() as i64, p.count("SELECT COUNT(*) FROM published") + 1, "Ferry's files and the other writer's one");
    let verify = ferry_ok(&p, &["verify"]);
    assert!(verify.contains("1 of other writers"), "{verify}");

    // A rerun with other bytes: the chunk's new file in, its old one out, in one overwrite.
    let chunk = p.sql("SELECT MIN(id) FROM chunks");
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replace("max_bad_records = 5", "max_bad_records = 5\ncompression = \"snappy\"")).unwrap();
    ferry_ok(&p, &["rerun", "--chunk", chunk.trim(), "--from", "transform"]);
    drained(&p, "the rerun");
    let again = p.table_digest();
    assert_eq!(again["digest"], got["digest"], "the rerun changed no row: {again}");
    let facts = through_pyiceberg(&rest.url, &[]);
    let last = facts["snapshots"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["operation"], "overwrite", "{last}");
    ferry_ok(&p, &["verify"]);

    // `ferry vacuum` expires Ferry's snapshots but the current one through the catalog
    // (remove-snapshots); the other writer's stays, and every record is read as before.
    let out = ferry_ok(&p, &["vacuum", "--retain", "0s", "--allow-short-retention"]);
    let facts = through_pyiceberg(&rest.url, &[]);
    let snaps = facts["snapshots"].as_array().unwrap();
    assert_eq!(snaps.iter().filter(|s| s["chunks"].is_string()).count(), 1, "only the current snapshot of Ferry's: {out} {facts}");
    assert_eq!(snaps.iter().filter(|s| s["chunks"].is_null()).count(), 1, "the other writer's snapshot stays: {facts}");
    assert!(out.contains("deleted file://"), "the rerun's replaced part and the expired metadata went: {out}");
    assert_eq!(p.table_digest()["digest"], got["digest"], "the vacuum changed no row");
    let spark = ferry_tests::spark_iceberg_digests(&rest.url, "default.events", &[None]);
    assert_eq!(spark[0]["digest"], got["digest"], "Spark reads the vacuumed table: {}", spark[0]);
    ferry_ok(&p, &["verify"]);
}

/// Load through a proxy in front of the catalog that, for some commits, forwards the request
/// and then resets the connection or swallows the reply (the catalog applied the commit, Ferry
/// never hears it): each is settled by reading the table, and every record is in once. Then load
/// killed at each step in turn (the commit's send and its answer among them): no record twice at
/// any point, every record once at the end.
#[test]
fn lost_commit_replies_and_kills_at_every_step_leave_every_record_once() {
    let rest = IcebergRest::start();
    let proxy = FaultProxy::start(rest.addr, 4917);
    let via = format!("http://{}", proxy.addr);
    let p = Pipeline::new("16KiB", "5s", "0s").table_format("iceberg").rest_catalog(&via);
    p.raise_attempt_cap(40);
    p.add_jsonl_batch("a", 1, 100, 3);
    drained(&p, "the first batch");
    // Commits whose reply is lost (the catalog applied them), and connections reset in the
    // middle of a request or never answered (some commits never reach the catalog).
    proxy.set(Faults {
        on_request: vec![(b"add-snapshot".to_vec(), 0.3, true), (b"add-snapshot".to_vec(), 0.3, false)],
        reset: 0.3,
        reset_within: 4096,
        hang: 0.15,
        ..Faults::default()
    });
    p.add_jsonl_batch("b", 4, 400, 4);
    drained(&p, "commits through lost replies");
    let c = proxy.counters();
    let hit = c.pattern_resets.load(std::sync::atomic::Ordering::SeqCst) + c.silences.load(std::sync::atomic::Ordering::SeqCst);
    assert!(hit > 0, "the proxy swallowed some commits' replies: {}", proxy.summary());
    assert!(c.resets.load(std::sync::atomic::Ordering::SeqCst) > 0, "the proxy cut some requests: {}", proxy.summary());
    proxy.set(Faults::default());
    let want = input_digest("jsonl", &p.path("in"));
    same(&p.table_digest(), &want, "after lost replies");
    let facts = through_pyiceberg(&rest.url, &[]);
    assert_eq!(chunks_in(&facts).len() as i64, p.count("SELECT COUNT(*) FROM chunks"), "every chunk in one snapshot: {facts}");
    ferry_ok(&p, &["verify"]);

    // Killed at every step: a batch staged, then load run again and again, the n-th run killed
    // at its n-th step (FERRY_TEST_CRASH_AT=n), each from what the runs before it left (a
    // catalog is not rolled back), until a run ends on its own; then the pipeline to its end.
    p.add_jsonl_batch("c", 1, 150, 5);
    p.stages_ok(&STAGES[..3]);
    let want = input_digest("jsonl", &p.path("in"));
    let mut killed = 0;
    let mut reader = ferry_tests::Digester::new();
    for at in 1..2000 {
        let o = ferry_tests::output_within(
            p.command("ferry-load").arg("--once").env("FERRY_TEST_CRASH_AT", at.to_string()),
            std::time::Duration::from_secs(120),
        );
        if !String::from_utf8_lossy(&o.stderr).contains("FERRY_TEST_CRASH_AT: killed") {
            assert!(
                o.status.success(),
                "load run to its end: {}; tasks not done: {}",
                String::from_utf8_lossy(&o.stderr),
                p.sql(
                    "SELECT group_concat(stage || ' ' || state || ': ' || COALESCE(last_error, ''), '; ') FROM tasks WHERE state <> 'done'"
                )
            );
            break;
        }
        killed += 1;
        // The killed run's lease ends now, its retry is due at once, and its attempt is not
        // counted (hundreds of kills would reach any cap).
        p.ledger_script(
            "UPDATE tasks SET lease_expires_at = 0 WHERE state = 'running'; \
             UPDATE tasks SET scheduled_at = 0, attempt = 0 WHERE state IN ('retryable', 'running')",
        );
        // What the table holds after each kill: each record at most once, whatever is in.
        let d = reader.iceberg(&rest.url, "default.events", None);
        assert_eq!(d["rows"], d["distinct"], "killed at step {at}: a record twice: {d}");
    }
    assert!(killed >= 10, "load was killed at only {killed} steps");
    drained(&p, "after the kills");
    same(&reader.iceberg(&rest.url, "default.events", None), &want, "after load was killed at every step");
    ferry_ok(&p, &["verify"]);
    eprintln!("lost replies: {}; load killed at {killed} steps", proxy.summary());
}

/// The table on HDFS, its catalog the REST server (which writes the metadata files there through
/// Hadoop's client): Spark reads every record once through the catalog, current and by id.
#[test]
fn a_rest_catalog_table_on_hdfs_is_read_once_by_spark() {
    let a = MiniDfs::start("A");
    let rest = IcebergRest::start();
    let dest = format!("[destination]\nurl = \"{}/wh\"\ntable_format = \"iceberg\"\n", a.url);
    let p = Pipeline::with_stores("16KiB", "30s", "0s", None, Some(dest)).rest_catalog(&rest.url);
    p.add_jsonl_batch("a", 2, 300, 21);
    drained(&p, "the first batch");
    let first = input_digest("jsonl", &p.path("in"));
    let snaps = ferry_tests::spark_iceberg_sql(
        &rest.url,
        &["SELECT snapshot_id FROM ferry.default.events.snapshots ORDER BY committed_at DESC LIMIT 1"],
    );
    let after_first: i64 = snaps[0][0][0].parse().unwrap();
    p.add_jsonl_batch("b", 2, 300, 22);
    drained(&p, "the second batch");
    let all = input_digest("jsonl", &p.path("in"));
    let spark = ferry_tests::spark_iceberg_digests(&rest.url, "default.events", &[None, Some(after_first)]);
    same(&spark[0], &all, "Spark, on HDFS through the REST catalog");
    same(&spark[1], &first, "Spark, the first batch's snapshot");
    let loc = ferry_tests::spark_iceberg_sql(&rest.url, &["SELECT file FROM ferry.default.events.metadata_log_entries"]);
    assert!(loc[0].iter().all(|r| r[0].starts_with("hdfs://")), "the catalog wrote the metadata on HDFS: {loc:?}");
    ferry_ok(&p, &["verify"]);
}

/// Two loads at once (two hosts) and PyIceberg appending through the same REST catalog
/// meanwhile: a commit planned on a snapshot another writer moved past fails its requirement on
/// main (409) and is planned again, so Ferry's records are all in once and the other writer's
/// appends are kept.
#[test]
fn two_loads_and_another_writer_at_once_through_a_rest_catalog() {
    let rest = IcebergRest::start();
    let p = Pipeline::new("16KiB", "30s", "0s").table_format("iceberg").rest_catalog(&rest.url);
    p.add_jsonl_batch("a", 1, 100, 51);
    drained(&p, "the first batch");
    p.add_jsonl_batch("b", 4, 400, 52);
    p.stages_ok(&STAGES[..3]);
    let loads: Vec<std::process::Child> =
        (0..2).map(|_| p.command("ferry-load").arg("--once").stderr(std::process::Stdio::piped()).spawn().unwrap()).collect();
    let appender = ferry_tests::spawn_iceberg_appender(&rest.url, 6);
    for l in loads {
        let o = l.wait_with_output().unwrap();
        assert!(o.status.success(), "load: {}", String::from_utf8_lossy(&o.stderr));
    }
    let o = appender.wait_with_output().unwrap();
    assert!(o.status.success(), "appender: {}", String::from_utf8_lossy(&o.stderr));
    drained(&p, "after the two loads");
    let ours = input_digest("jsonl", &p.path("in"));
    let got = p.table_digest();
    assert_eq!(got["rows"].as_i64().unwrap(), ours["rows"].as_i64().unwrap() + 30, "Ferry's rows and the other writer's 30: {got}");
    assert_eq!(got["rows"], got["distinct"], "{got}");
    let facts = through_pyiceberg(&rest.url, &[]);
    assert_eq!(chunks_in(&facts).len() as i64, p.count("SELECT COUNT(*) FROM chunks"), "every chunk in one snapshot: {facts}");
    ferry_ok(&p, &["verify"]);
}
