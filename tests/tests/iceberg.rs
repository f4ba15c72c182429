//! `[destination] table_format = "iceberg"` with the catalog in the ledger: the table read back
//! by PyIceberg (an independent implementation of the Iceberg spec) through its SqlCatalog,
//! given only the ledger's URL, at the current snapshot and by snapshot id; another writer's
//! snapshots, rows and properties kept; the ledger's record and the catalog committed as one.

use ferry_tests::{Pipeline, STAGES, input_digest, postgres::Postgres, sqlalchemy_url};

fn iceberg_pipeline() -> Pipeline {
    Pipeline::new("16KiB", "30s", "0s").table_format("iceberg")
}

fn drained(p: &Pipeline) {
    drained_with(p, &|q| p.sql(q));
}

/// Runs the stages until every task is done (at most six rounds), the ledger read by `sql`.
fn drained_with(p: &Pipeline, sql: &dyn Fn(&str) -> String) {
    for _ in 0..6 {
        for s in STAGES {
            p.stage_round(s);
        }
        if sql("SELECT COUNT(*) FROM tasks WHERE state <> 'done'").trim() == "0" {
            return;
        }
    }
    panic!("tasks left: {}", sql("SELECT stage || ': ' || COALESCE(last_error, '') FROM tasks WHERE state <> 'done'"));
}

fn same(got: &serde_json::Value, want: &serde_json::Value, what: &str) {
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{what}: {k} ({got} vs {want})");
    }
    assert_eq!(got["bad_dt"], 0, "{what}: rows in the wrong partition ({got})");
}

/// What PyIceberg sees of the table: its snapshots (id, parent, operation, Ferry's marker),
/// properties, and the live data files' paths.
fn table_facts(p: &Pipeline) -> serde_json::Value {
    const SCRIPT: &str = r#"
import sys, json, os
from pyiceberg.catalog.sql import SqlCatalog
t = SqlCatalog("ferry", uri=sys.argv[1], init_catalog_tables="false").load_table("default.events")
snaps = [{"id": s.snapshot_id, "parent": s.parent_snapshot_id, "operation": s.summary.operation.value,
          "chunks": s.summary.additional_properties.get("ferry.chunks")} for s in t.snapshots()]
files = [f.file.file_path for f in t.scan().plan_files()]
print(json.dumps({"snapshots": snaps, "properties": t.properties, "files": files,
                  "spec": str(t.spec()), "format_version": t.metadata.format_version}))
sys.stdout.flush()
os._exit(0)
"#;
    let out = std::process::Command::new("python3").args(["-c", SCRIPT, &sqlalchemy_url(&p.ledger_url())]).output().unwrap();
    assert!(out.status.success(), "pyiceberg: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Appends rows through PyIceberg (another writer of the table, committing through the same
/// catalog rows), and sets a property of its own.
fn another_writer_appends(p: &Pipeline, ids: &[&str]) {
    const SCRIPT: &str = r#"
import sys, json, os, datetime
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
t = SqlCatalog("ferry", uri=sys.argv[1], init_catalog_tables="false").load_table("default.events")
ids = json.loads(sys.argv[2])
ts = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.timezone.utc)
schema = t.schema().as_arrow()
rows = {"event_id": ids, "ts": [ts] * len(ids), "host": ["other"] * len(ids), "kind": ["k"] * len(ids),
        "user_id": [7] * len(ids), "payload": ["from pyiceberg"] * len(ids), "score": [None] * len(ids),
        "dt": [ts.date()] * len(ids)}
t.append(pa.Table.from_pydict(rows, schema=schema))
with t.transaction() as tx:
    tx.set_properties({"owner.note": "kept"})
sys.stdout.flush()
os._exit(0)
"#;
    let list = serde_json::to_string(ids).unwrap();
    let out = std::process::Command::new("python3").args(["-c", SCRIPT, &sqlalchemy_url(&p.ledger_url()), &list]).output().unwrap();
    assert!(out.status.success(), "pyiceberg append: {}", String::from_utf8_lossy(&out.stderr));
}

fn ferry_ok(p: &Pipeline, args: &[&str]) -> String {
    let out = p.command("ferry").args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "ferry {args:?}: {text}");
    text
}

fn snapshots(facts: &serde_json::Value) -> Vec<serde_json::Value> {
    facts["snapshots"].as_array().unwrap().clone()
}

/// Two batches loaded, read back whole at each snapshot; the ledger read by `sql`.
fn every_record_once_at_every_snapshot(p: &Pipeline, sql: &dyn Fn(&str) -> String) {
    let count = |q: &str| -> i64 { sql(q).trim().parse().unwrap_or_else(|_| panic!("{q}: {}", sql(q))) };
    p.add_jsonl_batch("a", 3, 400, 1);
    drained_with(p, sql);
    let first = input_digest("jsonl", &p.path("in"));
    same(&p.table_digest(), &first, "after the first batch");
    let facts = table_facts(p);
    assert_eq!(facts["format_version"], 2);
    let after_first = snapshots(&facts).last().unwrap()["id"].as_i64().unwrap();

    p.add_jsonl_batch("b", 2, 300, 2);
    drained_with(p, sql);
    let all = input_digest("jsonl", &p.path("in"));
    same(&p.table_digest(), &all, "after the second batch");
    same(&ferry_tests::iceberg_digest(&p.ledger_url(), "default.events", Some(after_first)), &first, "at the first batch's last snapshot");

    // Every snapshot is Ferry's append naming the chunks it brought, each chunk once; the
    // ledger's published files are the live ones; every snapshot holds each record at most once.
    let facts = table_facts(p);
    let snaps = snapshots(&facts);
    let mut chunks = std::collections::BTreeSet::new();
    let mut reader = ferry_tests::Digester::new();
    for (i, s) in snaps.iter().enumerate() {
        assert_eq!(s["operation"], "append", "{s}");
        if i > 0 {
            assert_eq!(s["parent"], snaps[i - 1]["id"], "snapshots form one line: {snaps:?}");
        }
        for c in s["chunks"].as_str().unwrap().split(',') {
            let (chunk, epoch) = c.split_once('@').unwrap();
            assert!(epoch.parse::<i64>().unwrap() >= 1, "{c}");
            assert!(chunks.insert(chunk.to_string()), "chunk {chunk} in two snapshots: {snaps:?}");
        }
        let d = reader.iceberg(&p.ledger_url(), "default.events", s["id"].as_i64());
        assert_eq!(d["rows"], d["distinct"], "snapshot {s} holds a record twice: {d}");
    }
    assert_eq!(chunks.len() as i64, count("SELECT COUNT(*) FROM chunks"), "every chunk in one snapshot");
    let files = facts["files"].as_array().unwrap();
    assert_eq!(files.len() as i64, count("SELECT COUNT(*) FROM published"));
    for f in files {
        let rel = f.as_str().unwrap().split("/wh/").nth(1).unwrap();
        assert_eq!(count(&format!("SELECT COUNT(*) FROM published WHERE path = '{rel}'")), 1, "{rel} recorded");
    }
    assert!(facts["spec"].as_str().unwrap().contains("identity"), "{}", facts["spec"]);
    // Each file is recorded with the id of the snapshot that brought it (what `ferry status`
    // shows): one of the table's snapshots, each of which brought the chunks recorded with it.
    assert_eq!(count("SELECT COUNT(*) FROM published WHERE table_version IS NULL"), 0);
    for s in &snaps {
        let id = s["id"].as_i64().unwrap();
        for c in s["chunks"].as_str().unwrap().split(',') {
            let chunk = c.split_once('@').unwrap().0;
            assert_eq!(
                count(&format!("SELECT COUNT(*) FROM published WHERE chunk_id = '{chunk}' AND table_version <> {id}")),
                0,
                "chunk {chunk} recorded with another snapshot than {id}"
            );
        }
    }
    let verify = ferry_ok(p, &["verify"]);
    assert!(verify.contains("Iceberg table events"), "{verify}");
    // `ferry status` names, per partition, the snapshot that last brought a file of it.
    let status = ferry_ok(p, &["status"]);
    let ids: Vec<i64> = snaps.iter().map(|s| s["id"].as_i64().unwrap()).collect();
    let shown: Vec<i64> = status.split("(snapshot ").skip(1).map(|r| r.split(')').next().unwrap().parse().unwrap()).collect();
    assert!(!shown.is_empty() && shown.iter().all(|id| ids.contains(id)), "{status}");
    // Spark with Iceberg's runtime reads the same, through the JdbcCatalog on the ledger: the
    // current snapshot, and the first batch's last one by id.
    let spark = ferry_tests::spark_iceberg_digests(&p.ledger_url(), "default.events", &[None, Some(after_first)]);
    same(&spark[0], &all, "Spark, current snapshot");
    same(&spark[1], &first, "Spark, the first batch's last snapshot");
}

#[test]
fn every_record_is_in_the_iceberg_table_once_at_every_snapshot() {
    let p = iceberg_pipeline();
    every_record_once_at_every_snapshot(&p, &|q| p.sql(q));
    // The catalog row is the JDBC catalog's: PyIceberg found it by the ledger's URL alone.
    let row = p.sql("SELECT catalog_name || ' ' || table_namespace || ' ' || table_name || ' ' || (previous_metadata_location IS NOT NULL) FROM iceberg_tables");
    assert_eq!(row.trim(), "ferry default events 1");
}

#[test]
fn every_record_is_in_the_iceberg_table_once_with_the_catalog_in_postgres() {
    let pg = Postgres::start(false);
    let p = iceberg_pipeline();
    p.use_ledger(&pg.url());
    every_record_once_at_every_snapshot(&p, &|q| pg.sql(q));
}

#[test]
fn another_writers_snapshots_rows_and_properties_are_kept() {
    let p = iceberg_pipeline();
    p.add_jsonl_batch("a", 2, 300, 1);
    drained(&p);
    another_writer_appends(&p, &["theirs-1", "theirs-2", "theirs-3"]);
    let before = snapshots(&table_facts(&p)).len();
    p.add_jsonl_batch("b", 2, 300, 2);
    drained(&p);
    let facts = table_facts(&p);
    assert_eq!(facts["properties"]["owner.note"], "kept", "{}", facts["properties"]);
    let snaps = snapshots(&facts);
    assert!(snaps.len() > before, "Ferry committed after the other writer: {snaps:?}");
    let got = p.table_digest();
    let ours = input_digest("jsonl", &p.path("in"));
    assert_eq!(got["rows"].as_i64().unwrap(), ours["rows"].as_i64().unwrap() + 3, "Ferry's rows and the other writer's 3: {got}");
    assert_eq!(got["rows"], got["distinct"]);
    // A rerun of a chunk (the same bytes) commits nothing new and keeps the other writer's rows.
    let chunk = p.sql("SELECT MIN(id) FROM chunks");
    ferry_ok(&p, &["rerun", "--chunk", chunk.trim(), "--from", "transform"]);
    drained(&p);
    let again = p.table_digest();
    assert_eq!(again["rows"], got["rows"], "{again}");
    assert_eq!(again["digest"], got["digest"]);
    // A rerun with other bytes (another Parquet codec): the chunk's new file in, its old one
    // deleted in the same snapshot (an overwrite), the other writer's rows untouched.
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replace("max_bad_records = 5", "max_bad_records = 5\ncompression = \"snappy\"")).unwrap();
    let old: Vec<String> = table_facts(&p)["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    let mine: Vec<&String> = old.iter().filter(|f| f.contains(&format!("part-{}-", chunk.trim()))).collect();
    assert!(!mine.is_empty(), "the chunk's files: {old:?}");
    ferry_ok(&p, &["rerun", "--chunk", chunk.trim(), "--from", "transform"]);
    drained(&p);
    let facts = table_facts(&p);
    let files: Vec<&str> = facts["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert!(mine.iter().all(|f| !files.contains(&f.as_str())), "the chunk's old files are out: {files:?}");
    assert_eq!(files.len(), old.len(), "{files:?}");
    assert_eq!(snapshots(&facts).last().unwrap()["operation"], "overwrite");
    let after = p.table_digest();
    assert_eq!(after["rows"], got["rows"], "{after}");
    assert_eq!(after["digest"], got["digest"]);
    // `ferry verify` counts the other writer's file as theirs, not a problem.
    let verify = ferry_ok(&p, &["verify"]);
    assert!(verify.contains("1 of other writers"), "{verify}");
}

/// Load killed (SIGKILL, `FERRY_TEST_CRASH_AT`) at every step of its run in turn (each ledger
/// call begun or answered, each store change begun or ended: the parts' moves, the manifests,
/// the manifest list, the metadata file, the catalog's transaction), from the same state each
/// time, then the pipeline run to its end: PyIceberg reads every record exactly once every
/// time, and gc leaves no temp file.
#[test]
fn load_killed_at_every_step_then_rerun_leaves_every_record_once() {
    let p = iceberg_pipeline();
    p.add_jsonl_batch("a", 1, 200, 9);
    p.stages_ok(&STAGES[..3]);
    let want = input_digest("jsonl", &p.path("in"));
    let state = ["ledger.db", "ledger.db-wal", "ledger.db-shm", "wh", "spool", "staging"];
    let saved = p.path("saved");
    p.save(&state, &saved);
    let mut killed = 0;
    let mut reader = ferry_tests::Digester::new();
    for at in 1..2000 {
        p.restore(&state, &saved);
        let o = ferry_tests::output_within(
            p.command("ferry-load").arg("--once").env("FERRY_TEST_CRASH_AT", at.to_string()),
            std::time::Duration::from_secs(120),
        );
        if !String::from_utf8_lossy(&o.stderr).contains("FERRY_TEST_CRASH_AT: killed") {
            assert!(o.status.success(), "load run to its end: {}", String::from_utf8_lossy(&o.stderr));
            break;
        }
        killed += 1;
        // The killed run's lease ends now instead of after the lease; retries are due at once.
        p.ledger_script("UPDATE tasks SET lease_expires_at = 0 WHERE state = 'running'");
        for round in 0..6 {
            p.stage_round("ferry-load");
            if p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'") == 0 {
                break;
            }
            assert!(
                round < 5,
                "killed at step {at}: not drained: {}",
                p.sql("SELECT group_concat(last_error, '; ') FROM tasks WHERE state <> 'done'")
            );
            p.ledger_script("UPDATE tasks SET scheduled_at = 0 WHERE state = 'retryable'; UPDATE tasks SET lease_expires_at = 0 WHERE state = 'running'");
        }
        same(&reader.iceberg(&p.ledger_url(), "default.events", None), &want, &format!("load killed at step {at}"));
        ferry_ok(&p, &["verify"]);
        ferry_ok(&p, &["gc", "--older-than", "0s"]);
        let temps: Vec<_> = ferry_tests::temp_files(p.dir.path()).into_iter().filter(|f| !f.starts_with(&saved)).collect();
        assert!(temps.is_empty(), "killed at step {at}: temp files left: {temps:?}");
    }
    assert!(killed >= 10, "load was killed at only {killed} steps");
    eprintln!("load killed at {killed} steps");
}

/// Two loads at once (two hosts) and another writer appending through PyIceberg meanwhile,
/// all committing through the catalog's row: every commit planned on a stale row loses and
/// plans again, so Ferry's records are all in once and the other writer's appends are kept.
#[test]
fn two_loads_and_another_writer_at_once_leave_every_record_once() {
    let p = iceberg_pipeline();
    p.add_jsonl_batch("a", 1, 100, 1);
    drained(&p);
    p.add_jsonl_batch("b", 4, 400, 2);
    p.stages_ok(&STAGES[..3]);
    let loads: Vec<std::process::Child> =
        (0..2).map(|_| p.command("ferry-load").arg("--once").stderr(std::process::Stdio::piped()).spawn().unwrap()).collect();
    let appender = ferry_tests::spawn_iceberg_appender(&p.ledger_url(), 6);
    for l in loads {
        let o = l.wait_with_output().unwrap();
        assert!(o.status.success(), "load: {}", String::from_utf8_lossy(&o.stderr));
    }
    let o = appender.wait_with_output().unwrap();
    assert!(o.status.success(), "appender: {}", String::from_utf8_lossy(&o.stderr));
    drained(&p);
    let ours = input_digest("jsonl", &p.path("in"));
    let got = p.table_digest();
    assert_eq!(got["rows"].as_i64().unwrap(), ours["rows"].as_i64().unwrap() + 30, "Ferry's rows and the other writer's 30: {got}");
    assert_eq!(got["rows"], got["distinct"], "{got}");
    let facts = table_facts(&p);
    let mut chunks = std::collections::BTreeSet::new();
    for s in snapshots(&facts) {
        for c in s["chunks"].as_str().into_iter().flat_map(|c| c.split(',')) {
            assert!(chunks.insert(c.split('@').next().unwrap().to_string()), "a chunk in two snapshots: {c}");
        }
    }
    assert_eq!(chunks.len() as i64, p.count("SELECT COUNT(*) FROM chunks"));
    ferry_ok(&p, &["verify"]);
}

/// Spark deletes some of Ferry's rows (copy-on-write: Ferry's file is deleted and Spark's
/// rewrite of it added). Ferry's later loads keep that; a rerun of the chunk with the same bytes
/// brings nothing back; with other bytes it is refused naming the chunk, the table unchanged;
/// `ferry verify` reports the file as rewritten by another writer, not as a problem.
#[test]
fn a_spark_delete_of_ferrys_rows_is_never_undone() {
    let p = iceberg_pipeline();
    p.add_jsonl_batch("a", 2, 300, 1);
    drained(&p);
    let before = p.table_digest()["rows"].as_i64().unwrap();
    let url = p.ledger_url();
    let picked = ferry_tests::spark_iceberg_sql(&url, &["SELECT event_id FROM ferry.default.events ORDER BY event_id LIMIT 5"]);
    let ids: Vec<String> = picked[0].iter().map(|r| format!("'{}'", r[0])).collect();
    ferry_tests::spark_iceberg_sql(&url, &[&format!("DELETE FROM ferry.default.events WHERE event_id IN ({})", ids.join(","))]);
    assert_eq!(p.table_digest()["rows"].as_i64().unwrap(), before - 5, "Spark deleted 5 rows");

    p.add_jsonl_batch("b", 1, 200, 2);
    drained(&p);
    let got = p.table_digest();
    assert_eq!(got["rows"].as_i64().unwrap(), before - 5 + 200, "{got}");
    assert_eq!(got["rows"], got["distinct"]);

    // The chunks whose recorded files Spark's snapshot took out.
    let live: Vec<String> = table_facts(&p)["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    let published = p.sql("SELECT group_concat(path || ' ' || chunk_id, char(10)) FROM published");
    let rewritten: Vec<&str> = published
        .lines()
        .filter(|l| !live.iter().any(|f| f.ends_with(l.split(' ').next().unwrap())))
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    assert!(!rewritten.is_empty(), "Spark's DELETE rewrote a file of Ferry's: {published}");
    let chunk = rewritten[0];
    let verify = ferry_ok(&p, &["verify"]);
    assert!(verify.contains("rewritten") && verify.contains(chunk), "{verify}");

    // The same bytes again: nothing comes back.
    ferry_ok(&p, &["rerun", "--chunk", chunk, "--from", "transform"]);
    drained(&p);
    let again = p.table_digest();
    assert_eq!((&again["rows"], &again["digest"]), (&got["rows"], &got["digest"]), "a rerun of the same bytes: {again}");

    // Other bytes: refused, named, the table unchanged.
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replace("max_bad_records = 5", "max_bad_records = 5\ncompression = \"snappy\"")).unwrap();
    ferry_ok(&p, &["rerun", "--chunk", chunk, "--from", "transform"]);
    for _ in 0..3 {
        for s in STAGES {
            p.stage_round(s);
        }
    }
    let load = p.sql(&format!("SELECT state || ' ' || COALESCE(last_error, '') FROM tasks WHERE chunk_id = '{chunk}' AND stage = 'load'"));
    assert!(load.starts_with("quarantined") && load.contains("deleted by another writer's snapshot") && load.contains(chunk), "{load}");
    let after = p.table_digest();
    assert_eq!((&after["rows"], &after["digest"]), (&got["rows"], &got["digest"]), "refused: nothing written ({after})");
}

/// A SQLite ledger whose Iceberg catalog holds the table, moved to Postgres (`ferry
/// move-ledger`): the catalog's rows move with it, PyIceberg and Spark find the table through
/// the new ledger, and loads go on there with every record once.
#[test]
fn the_catalog_moves_with_the_ledger_to_postgres() {
    let pg = Postgres::start(false);
    let p = iceberg_pipeline();
    p.add_jsonl_batch("a", 2, 300, 41);
    drained(&p);
    let sqlite = p.ledger_url();
    let to = pg.url();
    ferry_ok(&p, &["--ledger", &to, "migrate"]);
    ferry_ok(&p, &["move-ledger", "--to", &to]);
    assert_eq!(pg.sql("SELECT COUNT(*) FROM iceberg_tables"), "1", "the catalog's row moved");
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replace(&format!("url = \"{sqlite}\""), &format!("url = \"{to}\""))).unwrap();
    assert_eq!(p.ledger_url(), to);
    p.add_jsonl_batch("b", 1, 300, 42);
    drained_with(&p, &|q| pg.sql(q));
    let all = input_digest("jsonl", &p.path("in"));
    same(&p.table_digest(), &all, "PyIceberg through the moved catalog");
    let spark = ferry_tests::spark_iceberg_digests(&to, "default.events", &[None]);
    same(&spark[0], &all, "Spark through the moved catalog");
}

/// A data file Ferry wrote (`part-<chunk>-<hash>.parquet`), by its name.
fn is_ferrys(url: &str) -> bool {
    url.rsplit('/').next().is_some_and(|n| n.starts_with("part-") && n.ends_with(".parquet"))
}

/// `ferry vacuum` on an Iceberg table: Ferry's snapshots past the retention expire (the
/// current one and another writer's stay), then the files no snapshot left needs go: a rerun's
/// replaced part, the expired snapshots' manifest lists and manifests; never another writer's
/// file, a live one, or a part a load killed mid-way placed and has not committed yet (its
/// chunk is at work). A retention shorter than the table's needs --allow-short-retention; a dry
/// run deletes nothing. After it, every record is read once and the interrupted load finishes.
#[test]
fn vacuum_expires_ferrys_old_snapshots_and_deletes_only_what_no_snapshot_needs() {
    let p = iceberg_pipeline();
    p.add_jsonl_batch("a", 2, 300, 41);
    drained(&p);
    another_writer_appends(&p, &["theirs-1", "theirs-2"]);
    p.add_jsonl_batch("b", 2, 300, 42);
    drained(&p);
    // A rerun with other bytes: the chunk's old file leaves the table (an overwrite).
    let chunk = p.sql("SELECT MIN(id) FROM chunks").trim().to_string();
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replace("max_bad_records = 5", "max_bad_records = 5\ncompression = \"snappy\"")).unwrap();
    let before: Vec<String> = table_facts(&p)["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    ferry_ok(&p, &["rerun", "--chunk", &chunk, "--from", "transform"]);
    drained(&p);
    let facts = table_facts(&p);
    let live: Vec<String> = facts["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    let replaced: Vec<&String> = before.iter().filter(|f| !live.contains(f)).collect();
    assert!(!replaced.is_empty() && replaced.iter().all(|f| f.contains(&format!("part-{chunk}-"))), "{replaced:?}");
    let path = |url: &str| std::path::PathBuf::from(url.strip_prefix("file://").unwrap());
    assert!(replaced.iter().all(|f| path(f).exists()), "a replaced file stays until a vacuum");
    let theirs: Vec<&String> = live.iter().filter(|f| !is_ferrys(f)).collect();
    assert_eq!(theirs.len(), 1, "{live:?}");

    // A load killed after it placed a part of a new chunk in the table and before its commit.
    let ab = input_digest("jsonl", &p.path("in"));
    p.add_jsonl_batch("c", 1, 200, 43);
    p.stages_ok(&STAGES[..3]);
    let placed = |p: &Pipeline| -> Vec<std::path::PathBuf> {
        ferry_tests::files_under(&p.path("wh/events"))
            .into_iter()
            .filter(|f| {
                let u = format!("file://{}", f.display());
                is_ferrys(&u) && !live.contains(&u) && !before.contains(&u)
            })
            .collect()
    };
    let mut in_flight = vec![];
    for at in 1..500 {
        let o = p.command("ferry-load").arg("--once").env("FERRY_TEST_CRASH_AT", at.to_string()).output().unwrap();
        assert!(String::from_utf8_lossy(&o.stderr).contains("FERRY_TEST_CRASH_AT: killed"), "load ended before a part was placed");
        p.ledger_script("UPDATE tasks SET lease_expires_at = 0, attempt = 0 WHERE state = 'running'");
        in_flight = placed(&p);
        if !in_flight.is_empty() {
            break;
        }
    }
    assert!(!in_flight.is_empty(), "no kill left a placed part");
    assert!(p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state <> 'done'") > 0);

    let short = p.command("ferry").args(["vacuum", "--retain", "0s"]).output().unwrap();
    assert!(!short.status.success() && String::from_utf8_lossy(&short.stderr).contains("--retain"), "{short:?}");
    let dry = ferry_ok(&p, &["vacuum", "--retain", "0s", "--allow-short-retention", "--dry-run"]);
    assert!(replaced.iter().all(|f| dry.contains(f.as_str())) && replaced.iter().all(|f| path(f).exists()), "{dry}");
    assert_eq!(snapshots(&table_facts(&p)).len(), snapshots(&facts).len(), "a dry run expires nothing");

    let out = ferry_ok(&p, &["vacuum", "--retain", "0s", "--allow-short-retention"]);
    let after = table_facts(&p);
    let snaps = snapshots(&after);
    let foreign = snaps.iter().filter(|s| s["chunks"].is_null()).count();
    assert_eq!(foreign, snapshots(&facts).iter().filter(|s| s["chunks"].is_null()).count(), "the other writer's snapshot stays: {snaps:?}");
    assert_eq!(snaps.len(), foreign + 1, "Ferry's snapshots but the current one expired: {snaps:?}");
    assert!(replaced.iter().all(|f| !path(f).exists()), "the replaced part is deleted: {out}");
    assert!(live.iter().all(|f| path(f).exists()), "every live file stays: {out}");
    assert!(in_flight.iter().all(|f| f.exists()), "the interrupted load's part stays: {out}");
    let got = p.table_digest();
    assert_eq!(got["rows"].as_i64().unwrap(), ab["rows"].as_i64().unwrap() + 2, "after the vacuum: {got}");
    assert_eq!(got["rows"], got["distinct"], "{got}");
    let verify = ferry_ok(&p, &["verify"]);
    assert!(verify.contains("1 of other writers"), "{verify}");

    // The interrupted load finishes; every record is read once. (Spark reads a vacuumed table
    // in tests/tests/iceberg_rest.rs.)
    drained(&p);
    let got = p.table_digest();
    let ours = input_digest("jsonl", &p.path("in"));
    assert_eq!(got["rows"].as_i64().unwrap(), ours["rows"].as_i64().unwrap() + 2, "{got}");
    assert_eq!(got["rows"], got["distinct"], "{got}");
    ferry_ok(&p, &["verify"]);
}
