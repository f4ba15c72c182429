//! `[destination] table_format = "delta"`: the published table read back by delta-rs (the
//! `deltalake` Python package, an independent reader of the Delta protocol), at its latest
//! version and at earlier ones (time travel): every record exactly once at every version, a
//! corrected file switched in one commit, and load killed at every step of its commits, or
//! run twice at once, still leaving every record once.

use std::path::{Path, PathBuf};
use std::process::Command;

mod delta_common;

use delta_common::*;
use ferry_tests::{
    Pipeline, STAGES, copy_tree, delta_digest, input_digest, output_within, spark_delta_digests, spark_delta_digests_s3, wait_until,
};

#[test]
fn every_record_is_in_the_delta_table_once_at_every_version() {
    let p = delta_pipeline("16KiB");
    p.add_jsonl_batch("a", 3, 400, 1);
    drained(&p);
    let first = input_digest("jsonl", &p.path("in"));
    same(&delta_digest(&table(&p), None), &first, "after the first batch");
    let after_first = commits(&table(&p)).last().unwrap().0;
    p.add_jsonl_batch("b", 2, 300, 2);
    drained(&p);
    same(&delta_digest(&table(&p), None), &input_digest("jsonl", &p.path("in")), "after the second batch");
    same(&delta_digest(&table(&p), Some(after_first)), &first, "time travel to the first batch's last commit");
    no_version_doubles(&table(&p));

    // What the log says, read as JSON: the protocol a plain reader takes, the partition
    // column, and a txn naming its chunk in every commit that adds one.
    let log = commits(&table(&p));
    let v0 = &log[0].1;
    let protocol = v0.iter().find_map(|a| a.get("protocol")).expect("a protocol action");
    assert_eq!((protocol["minReaderVersion"].as_i64(), protocol["minWriterVersion"].as_i64()), (Some(1), Some(2)));
    let meta = v0.iter().find_map(|a| a.get("metaData")).expect("a metaData action");
    assert_eq!(meta["partitionColumns"], serde_json::json!(["dt"]));
    let chunks = p.count("SELECT COUNT(*) FROM chunks");
    let mut txns = std::collections::BTreeSet::new();
    for (v, actions) in &log {
        let adds: Vec<&serde_json::Value> = actions.iter().filter_map(|a| a.get("add")).collect();
        let apps: Vec<&str> = actions.iter().filter_map(|a| a.get("txn")?.get("appId")?.as_str()).collect();
        if !adds.is_empty() {
            assert!(!apps.is_empty() && apps.iter().all(|a| a.starts_with("ferry:default:")), "commit {v}: {apps:?}");
            for a in &adds {
                let stats: serde_json::Value = serde_json::from_str(a["stats"].as_str().unwrap()).unwrap();
                assert!(stats["numRecords"].as_i64().unwrap() > 0, "commit {v}: {a}");
                assert!(a["partitionValues"]["dt"].as_str().unwrap().starts_with("20"), "commit {v}: {a}");
                // Bounds of the columns a reader skips files by; none of the partition column
                // (the path holds it) and none of the float (NaN has no place in an order).
                for c in ["user_id", "event_id", "ts"] {
                    assert!(stats["minValues"][c].is_number() || stats["minValues"][c].is_string(), "commit {v}: {c} in {stats}");
                    assert!(stats["maxValues"].get(c).is_some() && stats["nullCount"].get(c).is_some(), "commit {v}: {c} in {stats}");
                }
                assert!(stats["minValues"].get("dt").is_none() && stats["minValues"].get("score").is_none(), "{stats}");
            }
        }
        txns.extend(apps);
    }
    assert_eq!(txns.len() as i64, chunks, "one txn app id per chunk");
    // The ledger's published files are the table's active ones, each with the version that
    // added it.
    let published = p.count("SELECT COUNT(*) FROM published");
    assert_eq!(published, delta_files(&table(&p)).len() as i64);
    let added_in: std::collections::BTreeMap<String, i64> = log
        .iter()
        .flat_map(|(v, actions)| actions.iter().filter_map(|a| Some((a.get("add")?["path"].as_str()?.to_string(), *v))))
        .collect();
    let rows = p.sql("SELECT path || ' ' || COALESCE(table_version, -1) FROM published");
    for row in rows.lines() {
        let (path, v) = row.rsplit_once(' ').unwrap();
        let rel = path.strip_prefix("events/").unwrap();
        assert_eq!(added_in.get(rel), Some(&v.parse::<i64>().unwrap()), "{row}");
    }
    // Readers skip files by those bounds: delta-rs filtering on them returns exactly the rows a
    // full scan's filter does.
    same(&skipping_reads(&table(&p)), &serde_json::json!("ok"), "filtered reads with file skipping");

    // Every tenth commit is followed by a checkpoint, which readers start from; with the
    // commits before it cleaned up (as a log cleanup does), load goes on from it, and delta-rs
    // reads the table whole.
    let last = log.last().unwrap().0;
    assert!(last >= 10, "{last} commits: too few for a checkpoint");
    let dir = table(&p).join("_delta_log");
    let newest = (last / 10) * 10;
    let pointer: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("_last_checkpoint")).unwrap()).unwrap();
    assert_eq!(pointer["version"], newest);
    for v in 0..newest {
        std::fs::remove_file(dir.join(format!("{v:020}.json"))).unwrap();
    }
    let second = input_digest("jsonl", &p.path("in"));
    p.add_jsonl_batch("c", 2, 300, 3);
    drained(&p);
    let all = input_digest("jsonl", &p.path("in"));
    same(&delta_digest(&table(&p), None), &all, "after a cleanup, from the checkpoint");
    let published = p.count("SELECT COUNT(*) FROM published");
    assert_eq!(published, delta_files(&table(&p)).len() as i64);
    // Spark (delta-spark) reads the same: the latest version, and the second batch's last one
    // (from the checkpoint and the commits after it).
    let spark = spark_delta_digests(&table(&p), &[None, Some(last)]);
    same(&spark[0], &all, "Spark, latest");
    same(&spark[1], &second, "Spark, time travel to the second batch's last commit");
}

/// Filtered reads through delta-rs (which skips files by their stats) against the same filter
/// over a full scan, at several cut points of three columns; "ok" or what differed.
fn skipping_reads(dir: &Path) -> serde_json::Value {
    const SCRIPT: &str = r#"
import sys, os, json
import pyarrow.compute as pc
from deltalake import DeltaTable
dt = DeltaTable(sys.argv[1])
full = dt.to_pyarrow_table()
bad = []
for col in ["user_id", "event_id", "ts"]:
    vals = sorted(full.column(col).to_pylist())
    for q in [0, len(vals) // 3, len(vals) // 2, len(vals) - 1]:
        cut = vals[q]
        for op, f in [(">", pc.greater), ("<=", pc.less_equal), ("=", pc.equal)]:
            got = dt.to_pyarrow_table(filters=[(col, op, cut)]).num_rows
            want = pc.sum(f(full.column(col), cut)).as_py() or 0
            if got != want:
                bad.append(f"{col} {op} {cut}: {got} rows, a full scan has {want}")
print(json.dumps("ok" if not bad else bad)); sys.stdout.flush(); os._exit(0)
"#;
    let out = Command::new("python3").arg("-c").arg(SCRIPT).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_corrected_file_switches_in_one_commit_and_earlier_versions_still_read_the_old_rows() {
    let p = delta_pipeline("16KiB");
    std::fs::write(p.path("in/data.jsonl"), events("v1", 300)).unwrap();
    drained(&p);
    let v1_last = commits(&table(&p)).last().unwrap().0;
    std::fs::write(p.path("in/.data.jsonl.part"), events("v2", 250)).unwrap();
    std::fs::rename(p.path("in/.data.jsonl.part"), p.path("in/data.jsonl")).unwrap();
    drained(&p);
    assert!(p.count("SELECT COUNT(*) FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.version = 2") > 1, "several chunks");
    let want = |tag: &str, n: usize| {
        let d = p.path(&format!("expect-{tag}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("data.jsonl"), events(tag, n)).unwrap();
        input_digest("jsonl", &d)
    };
    same(&delta_digest(&table(&p), None), &want("v2", 250), "the correction");
    same(&delta_digest(&table(&p), Some(v1_last)), &want("v1", 300), "the version before it");
    // Every version after the first is v1 growing chunk by chunk, then v2 whole: the switch
    // is one commit, and no version shows a mix.
    let v2_rows = want("v2", 250)["rows"].clone();
    let mut switched = 0;
    for (v, d) in no_version_doubles(&table(&p)).iter().enumerate() {
        if (v as i64) > v1_last {
            assert_eq!(d["rows"], v2_rows, "version {v}: the correction whole");
            switched += 1;
        } else {
            assert!(d["rows"].as_i64().unwrap() <= 300, "version {v}: {d}");
        }
    }
    assert_eq!(switched, 1, "one commit switched the correction in");
    // The old version's files are still in the directory (readers of the older versions need them).
    let data_files = || {
        ferry_tests::files_under(&table(&p))
            .into_iter()
            .filter(|f| f.extension().is_some_and(|e| e == "parquet") && !f.to_string_lossy().contains("_delta_log"))
            .collect::<Vec<_>>()
    };
    let active = delta_files(&table(&p)).len();
    let on_disk = data_files().len();
    assert!(on_disk > active, "{on_disk} files on disk, {active} active");

    // `ferry verify` reads the ledger against the latest version: all there.
    let ferry = |args: &[&str]| output_within(p.command("ferry").args(args), std::time::Duration::from_secs(120));
    let o = ferry(&["verify"]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        text.contains(&format!(
            "{active} active file(s) (0 compacted, holding 0 part(s)), {active} part(s) in all, {active} published in the ledger"
        )),
        "{text}"
    );
    // `ferry status` shows the table version each partition's newest file came in.
    let o = ferry(&["status"]);
    let last = commits(&table(&p)).last().unwrap().0;
    assert!(String::from_utf8_lossy(&o.stdout).contains("(table version "), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(p.count("SELECT MAX(table_version) FROM published") <= last);

    // Vacuum: nothing is past the table's retention (a week); a shorter one is refused unless
    // asked for, and then the old version's files go and the latest version reads the same.
    let o = ferry(&["vacuum"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("deleted 0 removed file(s) and 0 file(s)"), "{o:?}");
    let o = ferry(&["vacuum", "--retain", "0s"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--allow-short-retention"), "{o:?}");
    let o = ferry(&["vacuum", "--retain", "0s", "--allow-short-retention", "--dry-run"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("would delete {} removed file(s)", on_disk - active)), "{o:?}");
    assert_eq!(data_files().len(), on_disk, "a dry run deletes nothing");
    let o = ferry(&["vacuum", "--retain", "0s", "--allow-short-retention"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(data_files().len(), active, "only the files the latest version names are left");
    same(&delta_digest(&table(&p), None), &want("v2", 250), "after the vacuum");
    assert_eq!(ferry(&["verify"]).status.code(), Some(0));

    // A commit's temp file that a killed load left in the log goes with gc's table-meta sweep;
    // the commits stay.
    let log_dir = table(&p).join("_delta_log");
    let temp = log_dir.join(format!(".{:020}.json.7.tmp", last + 1));
    std::fs::write(&temp, b"{}").unwrap();
    let commits_before = commits(&table(&p)).len();
    let o = ferry(&["gc", "--sweep", "table-meta-temps", "--older-than", "0s"]);
    assert!(o.status.success(), "{o:?}");
    assert!(!temp.exists(), "the log's temp file is gone");
    assert_eq!(commits(&table(&p)).len(), commits_before);

    // A file the table names that is gone from the store is found, with its chunk.
    let victim = data_files().pop().unwrap();
    std::fs::remove_file(&victim).unwrap();
    let o = ferry(&["verify"]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(text.contains("gone ") && text.contains(victim.file_name().unwrap().to_str().unwrap()), "{text}");
}

/// `ferry compact` merges each partition's small files; the merged table reads the same
/// (delta-rs with file skipping, Spark), a version switch of a source file whose chunks were
/// merged takes exactly their rows out (the merged file rewritten without them, in the
/// switch's one commit), a second compaction merges merged files, and vacuum leaves the files
/// the latest version names and the parts of chunks still at work.
#[test]
fn compacted_files_hold_every_part_once_through_a_switch_a_second_compaction_and_vacuum() {
    let p = delta_pipeline("16KiB");
    p.add_jsonl_batch("a", 3, 300, 1);
    // keep.jsonl shares its partitions with data.jsonl, which is corrected below.
    std::fs::write(p.path("in/keep.jsonl"), events("keep", 300)).unwrap();
    std::fs::write(p.path("in/data.jsonl"), events("v1", 300)).unwrap();
    drained(&p);
    let ferry = |args: &[&str]| output_within(p.command("ferry").args(args), std::time::Duration::from_secs(120));
    let expect = |v2: bool| {
        let d = p.path(&format!("expect-{v2}"));
        let _ = std::fs::remove_dir_all(&d);
        copy_tree(&p.path("in"), &d);
        std::fs::write(d.join("data.jsonl"), if v2 { events("v2", 250) } else { events("v1", 300) }).unwrap();
        input_digest("jsonl", &d)
    };
    let before = delta_files(&table(&p)).len();
    let o = ferry(&["compact", "--target-size", "64MiB", "--dry-run"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("would merge"), "{o:?}");
    assert_eq!(delta_files(&table(&p)).len(), before, "a dry run merges nothing");
    let o = ferry(&["compact", "--target-size", "64MiB"]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{text}{}", String::from_utf8_lossy(&o.stderr));
    let partitions = p.count("SELECT COUNT(DISTINCT partition) FROM parts");
    let after = delta_files(&table(&p));
    assert_eq!(after.len() as i64, partitions, "one file per partition: {text}");
    assert!(after.iter().all(|f| f.contains("/compact-")), "{after:?}");
    same(&delta_digest(&table(&p), None), &expect(false), "after the compaction");
    let compacted_at = commits(&table(&p)).last().unwrap().0;
    let compaction = &commits(&table(&p))[compacted_at as usize].1;
    assert!(compaction.iter().filter_map(|a| a.get("add")).all(|a| a["dataChange"] == false), "a compaction changes no data");
    same(&skipping_reads(&table(&p)), &serde_json::json!("ok"), "filtered reads over merged files' stats");
    let o = ferry(&["verify"]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{text} {:?}", commits(&table(&p)).last());
    assert!(text.contains(&format!("({partitions} compacted, holding")), "{text}");

    // data.jsonl corrected: its chunks' rows leave the merged files in the switch's commit.
    std::fs::write(p.path("in/.data.jsonl.part"), events("v2", 250)).unwrap();
    std::fs::rename(p.path("in/.data.jsonl.part"), p.path("in/data.jsonl")).unwrap();
    drained(&p);
    let all = expect(true);
    same(&delta_digest(&table(&p), None), &all, "the switch through merged files");
    let log = commits(&table(&p));
    let rewrote = log[compacted_at as usize + 1..].iter().any(|(_, actions)| {
        actions.iter().any(|a| a.get("remove").is_some_and(|r| r["path"].as_str().unwrap().contains("/compact-")))
            && actions.iter().any(|a| a.get("add").is_some_and(|r| r["path"].as_str().unwrap().contains("/compact-")))
    });
    assert!(rewrote, "a merged file rewritten without the old version's parts: {:?}", &log[compacted_at as usize..]);
    no_version_doubles(&table(&p));
    assert_eq!(ferry(&["verify"]).status.code(), Some(0));

    // Merged files merge again with the switch's new parts.
    let o = ferry(&["compact", "--target-size", "64MiB"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(delta_files(&table(&p)).len() as i64, p.count("SELECT COUNT(DISTINCT partition) FROM parts"));
    same(&delta_digest(&table(&p), None), &all, "after the second compaction");
    assert_eq!(ferry(&["verify"]).status.code(), Some(0));

    // Spark reads the merged files (latest), and the version before the first compaction.
    let spark = spark_delta_digests(&table(&p), &[None, Some(compacted_at - 1)]);
    same(&spark[0], &all, "Spark, latest");
    same(&spark[1], &expect(false), "Spark, before the compaction");

    // Vacuum: removed files, and files no version names: a settled chunk's stray part goes, a
    // part of a chunk the ledger does not know stays.
    let dir = std::fs::read_dir(table(&p))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|d| d.file_name().unwrap().to_string_lossy().starts_with("dt="))
        .unwrap();
    let settled = p.sql("SELECT id FROM chunks LIMIT 1").trim().to_string();
    let stray = dir.join(format!("part-{settled}-deadbeef.parquet"));
    let foreign = dir.join("part-nosuchchunk-deadbeef.parquet");
    // A merged file no version names yet, written just now: a commit may be about to add it.
    let young = dir.join("compact-0123456789abcdef.parquet");
    std::fs::write(&stray, b"x").unwrap();
    std::fs::write(&foreign, b"x").unwrap();
    std::fs::write(&young, b"x").unwrap();
    let o = ferry(&["vacuum", "--retain", "0s", "--allow-short-retention"]);
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("and 1 file(s) no version names"), "{o:?}");
    assert!(!stray.exists() && foreign.exists() && young.exists());
    std::fs::remove_file(&foreign).unwrap();
    std::fs::remove_file(&young).unwrap();
    let data_files: Vec<_> = ferry_tests::files_under(&table(&p))
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "parquet") && !f.to_string_lossy().contains("_delta_log"))
        .collect();
    assert_eq!(data_files.len(), delta_files(&table(&p)).len(), "{data_files:?}");
    same(&delta_digest(&table(&p), None), &all, "after the vacuum");
    assert_eq!(ferry(&["verify"]).status.code(), Some(0));
}

/// Copies `from` into `to` (a directory tree), replacing `to`.
#[test]
fn load_killed_at_every_step_leaves_every_record_once() {
    let p = delta_pipeline("16KiB");
    std::fs::write(p.path("in/a.jsonl"), events("a", 150)).unwrap();
    for s in &STAGES[..3] {
        let o = p.stage(s);
        assert!(o.status.success(), "{s}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let want = input_digest("jsonl", &p.path("in"));
    // The state before load, put back before each kill.
    let saved = p.path("saved");
    let keep = ["ledger.db", "ledger.db-wal", "ledger.db-shm", "wh"];
    p.save(&keep, &saved);
    let results = p.path("results");
    std::fs::create_dir_all(&results).unwrap();
    let (mut killed, mut refused) = (0, 0);
    for at in 1..400 {
        p.restore(&keep, &saved);
        let o = output_within(
            p.command("ferry-load").arg("--once").env("FERRY_TEST_CRASH_AT", at.to_string()),
            std::time::Duration::from_secs(120),
        );
        if !String::from_utf8_lossy(&o.stderr).contains("FERRY_TEST_CRASH_AT: killed") {
            assert!(o.status.success(), "load ran to its end: {}", String::from_utf8_lossy(&o.stderr));
            break;
        }
        killed += 1;
        // The kill's lease must expire before another load claims the chunk: the ledger's
        // lease is 30 s, so the test ends the leases instead of waiting.
        p.ledger_script("UPDATE tasks SET lease_expires_at = 0 WHERE state = 'running'");
        // A chunk whose files the table holds while the ledger names none of them (killed
        // between its commit and its record) is not skipped: its rows are visible.
        let active = commits(&table(&p)).iter().fold(std::collections::BTreeSet::new(), |mut live, (_, actions)| {
            for a in actions {
                if let Some(path) = a.get("add").and_then(|x| x["path"].as_str()) {
                    live.insert(path.to_string());
                } else if let Some(path) = a.get("remove").and_then(|x| x["path"].as_str()) {
                    live.remove(path);
                }
            }
            live
        });
        for chunk in p.sql("SELECT chunk_id FROM tasks WHERE stage = 'load' AND state <> 'done'").lines() {
            let recorded = p.count(&format!("SELECT COUNT(*) FROM published WHERE chunk_id = '{chunk}'"));
            if recorded == 0 && active.iter().any(|f| f.contains(&format!("part-{chunk}-"))) {
                let o = p.command("ferry").args(["skip", "--chunk", chunk, "--reason", "test", "--dry-run"]).output().unwrap();
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(!o.status.success() && err.contains("in the table already"), "step {at}, chunk {chunk}: {err}");
                refused += 1;
            }
        }
        for _ in 0..3 {
            let o = p.stage("ferry-load");
            assert!(
                o.status.code().is_some_and(|c| c == 0 || c == 3),
                "load after a kill at step {at}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            if p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state <> 'done'") == 0 {
                break;
            }
            p.ledger_script("UPDATE tasks SET scheduled_at = 0 WHERE state = 'retryable'");
        }
        copy_tree(&table(&p), &results.join(at.to_string()));
    }
    assert!(killed > 10, "load was killed at {killed} steps");
    assert!(refused > 0, "some kill fell between a commit and its record (a skip was refused)");
    // Every outcome, read by delta-rs: every record once at the latest version, none twice at any.
    let mut outcomes: Vec<PathBuf> = std::fs::read_dir(&results).unwrap().flatten().map(|e| e.path()).collect();
    outcomes.sort();
    let latest: Vec<(PathBuf, Option<i64>)> = outcomes.iter().map(|o| (o.clone(), None)).collect();
    for (o, got) in outcomes.iter().zip(ferry_tests::delta_digests(&latest)) {
        same(&got, &want, &format!("killed at step {}", o.file_name().unwrap().to_string_lossy()));
    }
    for e in std::fs::read_dir(&results).unwrap().flatten().step_by(7) {
        no_version_doubles(&e.path());
    }
}

/// A Delta table keeps its column types (widening needs Delta's typeWidening feature, which
/// Ferry does not write): an Avro field that went from int to long is no new schema version;
/// its values that fit go in as the column's int, one that does not is a rejected record with
/// the reason, and the chunks after it load (before, every later chunk failed on the type
/// change at load).
#[test]
fn a_wider_input_keeps_a_delta_tables_column_type_and_rejects_values_that_do_not_fit() {
    let p = delta_pipeline("64KiB");
    p.set_columns("", "derive = { dt = \"date(ts)\" }");
    let ts = "{'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}}";
    let id = "{'name': 'id', 'type': 'string'}";
    let fields = |n: &str| format!("[{id}, {ts}, {{'name': 'n', 'type': '{n}'}}]");
    ferry_tests::write_avro(&p, "a.avro", &fields("int"), "[{'id': 'a1', 'ts': 1796040000000000, 'n': 1}]");
    drained(&p);
    ferry_tests::write_avro(
        &p,
        "b.avro",
        &fields("long"),
        "[{'id': 'b1', 'ts': 1796040000000000, 'n': 2}, {'id': 'b2', 'ts': 1796040000000000, 'n': 3000000000}]",
    );
    ferry_tests::write_avro(&p, "c.avro", &fields("int"), "[{'id': 'c1', 'ts': 1796040000000000, 'n': 5}]");
    drained(&p);
    assert_eq!(p.sql("SELECT group_concat(version || ': ' || change, ' | ') FROM table_schemas"), "1: created");
    let why = p.sql("SELECT group_concat(reason, ' | ') FROM rejects");
    assert!(why.contains("\"n\"") && why.contains("3000000000") && why.contains("typeWidening"), "{why}");
    let script = "import sys, json, os\nfrom deltalake import DeltaTable\nt = DeltaTable(sys.argv[1]).to_pyarrow_table(columns=['id', 'n'])\n\
                  print(json.dumps({'type': str(t.schema.field('n').type), 'rows': sorted(zip(t.column('id').to_pylist(), t.column('n').to_pylist()))}))\n\
                  sys.stdout.flush(); os._exit(0)";
    let out = Command::new("python3").arg("-c").arg(script).arg(table(&p)).output().unwrap();
    assert!(out.status.success(), "delta-rs: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, serde_json::json!({"type": "int32", "rows": [["a1", 1], ["b1", 2], ["c1", 5]]}));
}

/// A table partitioned by a timestamp (`col(ts)`): each file's partition value is written as
/// Delta's protocol has it (an instant in UTC, `...T10:00:00.000000Z`, not Arrow's
/// `...T10:00:00+00:00`), also in the files `ferry compact` merges, and readers in another time
/// zone read every row's partition value as the instant it was: delta-rs, and Spark with its
/// session in New York.
#[test]
fn timestamp_partition_values_are_the_instants_delta_readers_read() {
    let p = delta_pipeline("8KiB");
    p.set_columns(
        "  { name = \"event_id\", type = \"string\", nullable = false },\n  { name = \"ts\", type = \"timestamp\", nullable = false },",
        "derive = { hr = \"col(ts)\" }",
    );
    let cfg = std::fs::read_to_string(&p.config).unwrap().replace("partition_by = [\"dt\"]", "partition_by = [\"hr\"]");
    std::fs::write(&p.config, cfg).unwrap();
    let lines: String = (0..300)
        .map(|i| {
            format!(
                "{{\"event_id\": \"e{i}\", \"ts\": \"{}\"}}\n",
                ["2026-11-20T08:00:00Z", "2026-11-20T09:30:00.25Z", "2026-11-20T10:00:00Z"][i % 3]
            )
        })
        .collect();
    std::fs::write(p.path("in/a.jsonl"), lines).unwrap();
    drained(&p);
    let values = |what: &str| {
        let mut seen = std::collections::BTreeSet::new();
        for (v, actions) in commits(&table(&p)) {
            for a in actions.iter().filter_map(|a| a.get("add")) {
                let hr = a["partitionValues"]["hr"].as_str().unwrap_or_else(|| panic!("{what}: commit {v}: {a}")).to_string();
                seen.insert(hr);
            }
        }
        seen
    };
    let want: std::collections::BTreeSet<String> =
        ["2026-11-20T08:00:00.000000Z", "2026-11-20T09:30:00.250000Z", "2026-11-20T10:00:00.000000Z"].map(String::from).into();
    assert_eq!(values("loaded"), want);
    let o = output_within(p.command("ferry").args(["compact", "--target-size", "64MiB"]), std::time::Duration::from_secs(120));
    assert!(o.status.success(), "compact: {}", String::from_utf8_lossy(&o.stderr));
    assert!(delta_files(&table(&p)).iter().all(|f| f.contains("/compact-")), "every partition merged");
    assert_eq!(values("compacted"), want);
    // delta-rs: every row's partition value is its time, as an instant.
    let script = "import sys, json, os\nfrom deltalake import DeltaTable\nt = DeltaTable(sys.argv[1]).to_pyarrow_table(columns=['ts', 'hr'])\n\
                  bad = [str(a) for a, b in zip(t.column('ts').to_pylist(), t.column('hr').to_pylist()) if a != b]\n\
                  print(json.dumps({'rows': t.num_rows, 'bad': bad[:3]}))\nsys.stdout.flush(); os._exit(0)";
    let out = Command::new("python3").arg("-c").arg(script).arg(table(&p)).output().unwrap();
    assert!(out.status.success(), "delta-rs: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, serde_json::json!({"rows": 300, "bad": []}));
    // Spark in another time zone: the same instants.
    let path = table(&p).display().to_string();
    let got = ferry_tests::spark_sql(&[
        "SET spark.sql.session.timeZone = America/New_York".into(),
        format!("SELECT COUNT(*), SUM(CASE WHEN hr = ts THEN 1 ELSE 0 END), CAST(MIN(hr) AS STRING) FROM delta.`{path}`"),
    ]);
    assert_eq!(got[1], vec!["300,300,2026-11-20 03:00:00".to_string()], "Spark in New York");
}

/// A Delta pipeline whose input (four files, small chunks) went through extract, transform and
/// copy, with its number of chunks: load is what the test runs.
fn landed_for_load() -> (Pipeline, i64) {
    let p = delta_pipeline("8KiB");
    p.add_jsonl_batch("a", 4, 300, 3);
    for s in &STAGES[..3] {
        let o = p.stage(s);
        assert!(o.status.success(), "{s}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let chunks = p.count("SELECT COUNT(*) FROM chunks");
    (p, chunks)
}

#[test]
fn two_loads_on_one_table_commit_every_chunk_once() {
    let (p, chunks) = landed_for_load();
    assert!(chunks >= 12, "{chunks} chunks");
    let spawn =
        || p.command("ferry-load").arg("--once").stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let (a, b) = (spawn(), spawn());
    for c in [a, b] {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    drained(&p);
    same(&delta_digest(&table(&p), None), &input_digest("jsonl", &p.path("in")), "two loads at once");
    let log = commits(&table(&p));
    let adds: usize = log.iter().map(|(_, a)| a.iter().filter(|a| a.get("add").is_some()).count()).sum();
    assert_eq!(adds as i64, p.count("SELECT COUNT(*) FROM parts"), "every part added once, by one of the two");
    no_version_doubles(&table(&p));
}

/// Group commit: chunks whose plans are ready while a commit is made go in the next one
/// together, each with its own txn. The first commit is held (with the log's lock taken) until
/// the load's other tasks have queued their plans, so the figure is exact.
#[test]
fn chunks_ready_together_share_one_commit_with_a_txn_each() {
    let (p, chunks) = landed_for_load();
    let tasks = 6;
    assert!(chunks > tasks as i64, "{chunks} chunks");
    let gate = p.path("group-gate");
    std::fs::create_dir_all(&gate).unwrap();
    let load = p
        .command("ferry-load")
        .arg("--once")
        .env("FERRY_LOAD_CONCURRENCY", tasks.to_string())
        .env("FERRY_TEST_DELTA_GROUP_GATE", &gate)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Every task has a plan queued (the one holding the lock queued its own first).
    let queued = || std::fs::read_dir(&gate).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("queued-")).count();
    wait_until("every load task queues its plan", std::time::Duration::from_secs(60), || queued() >= tasks);
    std::fs::write(gate.join("go"), b"").unwrap();
    let o = load.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    drained(&p);
    same(&delta_digest(&table(&p), None), &input_digest("jsonl", &p.path("in")), "after group commits");
    no_version_doubles(&table(&p));
    let log = commits(&table(&p));
    let mut seen = std::collections::BTreeSet::new();
    for (v, actions) in &log {
        let apps: Vec<&str> = actions.iter().filter_map(|a| a.get("txn")?.get("appId")?.as_str()).collect();
        let distinct: std::collections::BTreeSet<&str> = apps.iter().copied().collect();
        assert_eq!(distinct.len(), apps.len(), "commit {v}: one txn per chunk: {apps:?}");
        let info: Vec<&serde_json::Value> = actions.iter().filter_map(|a| a.get("commitInfo")).collect();
        assert_eq!(info.len(), 1, "commit {v}: one commitInfo");
        let named: std::collections::BTreeSet<String> =
            info[0]["operationParameters"]["chunks"].as_str().unwrap().split(',').map(|c| format!("ferry:default:{c}")).collect();
        assert_eq!(named, distinct.iter().map(|a| a.to_string()).collect(), "commit {v}: commitInfo names its chunks");
        for a in distinct {
            assert!(seen.insert(a.to_string()), "commit {v}: {a} carried by an earlier commit too");
        }
    }
    assert_eq!(seen.len() as i64, chunks, "every chunk's txn, once");
    // The first commit that adds files took every plan queued while it was held.
    let first = log.iter().find(|(_, a)| a.iter().any(|a| a.get("add").is_some())).unwrap();
    let carried = first.1.iter().filter(|a| a.get("txn").is_some()).count();
    assert_eq!(carried, tasks, "commit {}: the chunks of every task, in one commit", first.0);
    assert!((log.len() as i64) < chunks, "{} commits for {chunks} chunks", log.len());
}

/// Every stage to the end, several rounds (a chunk whose commit met a fault waits its backoff).
fn drained_within(p: &Pipeline, what: &str) {
    for _ in 0..12 {
        p.drain(1);
        if p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'") == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let left =
        p.sql("SELECT group_concat(stage || ' ' || state || ': ' || COALESCE(last_error, ''), '; ') FROM tasks WHERE state <> 'done'");
    panic!("{what}: tasks left: {left}");
}

/// The table on HDFS (a MiniDFS cluster), load reaching the NameNode through a fault proxy
/// that resets connections right after a `rename2` (a commit's rename without overwrite, or a
/// part's move) or a `complete` went out, and swallows some replies to them: commits whose
/// outcome load cannot know. Read back with Hadoop's own client, then by delta-rs.
#[test]
fn a_delta_table_on_hdfs_through_lost_commit_replies_holds_every_record_once() {
    use ferry_tests::clusters::MiniDfs;
    use ferry_tests::proxy::{FaultProxy, Faults};
    let a = MiniDfs::start("A");
    let proxy = FaultProxy::start(a.addr, 3901);
    let dest = format!(
        "[destination]\nurl = \"{}/wh\"\ntable_format = \"delta\"\n[destination.store]\ncall_timeout = \"3s\"\nread_stall = \"10s\"\n",
        a.url
    );
    let p = Pipeline::with_stores("16KiB", "5s", "0s", None, Some(dest));
    p.stage_env("ferry-load", "FERRY_DESTINATION_URL", &format!("hdfs://{}/wh", proxy.addr));
    p.raise_attempt_cap(40);
    p.add_jsonl_batch("a", 3, 300, 11);
    proxy.set(Faults {
        on_request: vec![(b"rename2".to_vec(), 0.25, true), (b"rename2".to_vec(), 0.15, false), (b"complete".to_vec(), 0.1, false)],
        ..Faults::default()
    });
    drained_within(&p, "HDFS through faults");
    let c = proxy.counters();
    let hit = c.pattern_resets.load(std::sync::atomic::Ordering::SeqCst) + c.silences.load(std::sync::atomic::Ordering::SeqCst);
    assert!(hit > 0, "the proxy cut some of the commits' requests");
    p.assert_attempts_within(40);
    let local = p.path("readback");
    a.fs(&["-get", "/wh/events", local.to_str().unwrap()]);
    same(&delta_digest(&local, None), &input_digest("jsonl", &p.path("in")), "read back from HDFS");
    no_version_doubles(&local);
    // Spark reads the table where it is, through Hadoop's own HDFS client.
    let spark = spark_delta_digests(Path::new(&format!("{}/wh/events", a.url)), &[None]);
    same(&spark[0], &input_digest("jsonl", &p.path("in")), "Spark, on HDFS");
    // Compacted on HDFS (the faults healed): the merged table reads the same, and the ledger agrees.
    proxy.set(Faults::default());
    compacted_reads_the_same(&p, "HDFS", |merged| {
        a.fs(&["-get", "/wh/events", merged.to_str().unwrap()]);
    });
}

/// The table on S3 (the test server over TLS), load through a fault proxy that resets a third
/// of its connections at a random byte of either direction: a reset in a reply to a log PUT is
/// a commit that landed with its answer lost, one in the request a commit that did not land
/// (TLS hides which request a connection carries, so the faults are by byte, not by request).
/// Downloaded with pyarrow's S3 client, then read by delta-rs; and read in place by Spark.
#[test]
fn a_delta_table_on_s3_through_lost_commit_replies_holds_every_record_once() {
    use ferry_tests::clusters::S3Server;
    use ferry_tests::proxy::{FaultProxy, Faults};
    let s3 = S3Server::from_env();
    let proxy = FaultProxy::start(s3.addr, 3902);
    let prefix = format!("delta-{}", std::process::id());
    let dest = s3.destination_toml(&prefix, &format!("https://{}", proxy.addr), 2, "12s").replacen(
        "[destination.store]",
        "table_format = \"delta\"\n[destination.store]",
        1,
    );
    let p = Pipeline::with_stores("16KiB", "5s", "0s", None, Some(dest));
    p.raise_attempt_cap(40);
    p.add_jsonl_batch("a", 3, 300, 12);
    proxy.set(Faults { reset: 0.35, reset_within: 24 << 10, reset_both_ways: true, ..Faults::default() });
    drained_within(&p, "S3 through faults");
    // Resets are drawn per connection, and a run that pools its connections may open only a
    // few: more batches, each through new processes and connections, until some were reset
    // (0.65^n of a run with n connections meets none).
    let resets = || proxy.counters().resets.load(std::sync::atomic::Ordering::SeqCst);
    for round in 0..8u64 {
        if resets() > 0 {
            break;
        }
        p.add_jsonl_batch(&format!("more{round}"), 1, 200, 40 + round);
        drained_within(&p, "S3 through faults, another batch");
    }
    assert!(resets() > 0, "the proxy reset some of the stages' connections");
    p.assert_attempts_within(40);
    let local = p.path("readback");
    download_s3(&s3, &format!("{}/{prefix}/events", s3.bucket), &local);
    same(&delta_digest(&local, None), &input_digest("jsonl", &p.path("in")), "read back from S3");
    no_version_doubles(&local);
    // Spark reads the table where it is, through Hadoop's S3A connector (the latest version and
    // the first commit that added files).
    let first = commits(&local).iter().find(|(_, a)| a.iter().any(|a| a.get("add").is_some())).unwrap().0;
    let spark = spark_delta_digests_s3(&s3, &format!("{}/{prefix}/events", s3.bucket), &[None, Some(first)]);
    same(&spark[0], &input_digest("jsonl", &p.path("in")), "Spark, on S3");
    same(&spark[1], &delta_digest(&local, Some(first)), "Spark, on S3, its first version with files");
    // Compacted on S3 (the faults healed): the merged table reads the same, and the ledger agrees.
    proxy.set(Faults::default());
    compacted_reads_the_same(&p, "S3", |merged| download_s3(&s3, &format!("{}/{prefix}/events", s3.bucket), merged));
}

/// Faults aimed at the log's commits on S3. Over TLS the proxy cannot tell a commit from any
/// other request, so load reaches the same server through a plain-HTTP gateway of it, and the
/// proxy resets (or silences) connections right after a `PUT` of `_delta_log/<version>.json`
/// went out: the server has the commit, the writer has no reply. The writer does not send it
/// again: it reads the object, finds its own bytes there, and goes on (a retry would find the
/// chunk in the snapshot too); nothing is written twice.
#[test]
fn a_delta_commit_whose_reply_is_lost_on_s3_is_found_not_written_again() {
    use ferry_tests::clusters::S3Server;
    use ferry_tests::proxy::{FaultProxy, Faults};
    use std::sync::atomic::Ordering::SeqCst;
    let s3 = S3Server::from_env();
    let gateway = s3.plain_gateway();
    let proxy = FaultProxy::start(gateway.addr, 3903);
    let prefix = format!("delta-lost-{}", std::process::id());
    let dest = s3.destination_toml(&prefix, &format!("http://{}", proxy.addr), 2, "12s").replacen(
        "[destination.store]",
        "table_format = \"delta\"\n[destination.store]",
        1,
    ) + "allow_http = true\n";
    let p = Pipeline::with_stores("16KiB", "5s", "0s", None, Some(dest));
    let commit = format!("PUT /{}/{prefix}/events/_delta_log/0", s3.bucket).into_bytes();
    proxy.set(Faults { on_request: vec![(commit.clone(), 0.4, true), (commit, 0.15, false)], ..Faults::default() });
    p.add_jsonl_batch("a", 3, 300, 12);
    drained_within(&p, "S3 commits through lost replies");
    // Each commit's PUT meets the rules at 0.4 + 0.6 * 0.15: more batches (more commits) until
    // both a reset and a silence landed on one.
    let hit = |p: &ferry_tests::proxy::FaultProxy| (p.counters().pattern_resets.load(SeqCst), p.counters().silences.load(SeqCst));
    for round in 0..10u64 {
        if hit(&proxy).0 > 0 && hit(&proxy).1 > 0 {
            break;
        }
        p.add_jsonl_batch(&format!("more{round}"), 1, 200, 40 + round);
        drained_within(&p, "S3 commits through lost replies, another batch");
    }
    let (resets, silences) = hit(&proxy);
    eprintln!("{resets} commit replies reset, {silences} silenced ({})", proxy.summary());
    assert!(resets > 0 && silences > 0, "replies of log commits were lost: {resets} reset, {silences} silenced");
    // Each lost reply was settled where it happened (the object's bytes are the commit's):
    // no attempt of the load failed for it.
    let failed = p.count("SELECT COUNT(*) FROM attempts WHERE stage = 'load' AND outcome <> 'done'");
    let errors = || p.sql("SELECT group_concat(error, '; ') FROM attempts WHERE stage = 'load' AND outcome <> 'done'");
    assert_eq!(failed, 0, "load attempts failed: {}", errors());
    let local = p.path("readback");
    download_s3(&s3, &format!("{}/{prefix}/events", s3.bucket), &local);
    same(&delta_digest(&local, None), &input_digest("jsonl", &p.path("in")), "read back from S3");
    no_version_doubles(&local);
    // One commit added each chunk: a lost reply was never answered by a second commit.
    let mut carried = Vec::new();
    for (_, actions) in commits(&local) {
        if actions.iter().any(|a| a.get("add").is_some()) {
            carried.extend(actions.iter().filter_map(|a| Some(a.get("txn")?.get("appId")?.as_str()?.to_string())));
        }
    }
    let distinct: std::collections::BTreeSet<&String> = carried.iter().collect();
    assert_eq!(carried.len(), distinct.len(), "a chunk added by two commits: {carried:?}");
    assert_eq!(distinct.len() as i64, p.count("SELECT COUNT(*) FROM chunks"), "every chunk added");
}

/// `ferry compact` of `p`'s table, then `ferry verify`; the table fetched by `fetch` into a local
/// directory reads as the input, every partition in one merged file.
fn compacted_reads_the_same(p: &Pipeline, where_: &str, fetch: impl FnOnce(&Path)) {
    let ferry = |args: &[&str]| output_within(p.command("ferry").args(args), std::time::Duration::from_secs(120));
    let o = ferry(&["compact", "--target-size", "64MiB"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("merged"), "{o:?}");
    let o = ferry(&["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let merged = p.path("readback-merged");
    fetch(&merged);
    same(&delta_digest(&merged, None), &input_digest("jsonl", &p.path("in")), &format!("compacted on {where_}"));
    assert!(delta_files(&merged).iter().all(|f| f.contains("/compact-")), "every partition merged");
}

/// Copies `bucket/prefix` from the S3 test server into `local` with pyarrow's own S3 client.
fn download_s3(s3: &ferry_tests::clusters::S3Server, path: &str, local: &Path) {
    let script = "import sys, pyarrow.fs as pfs\n\
        ep, key, secret, ca, src, dst = sys.argv[1:7]\n\
        fs = pfs.S3FileSystem(access_key=key, secret_key=secret, endpoint_override=ep.split('//')[1], scheme='https', \
            region='us-east-1', tls_ca_file_path=ca)\n\
        pfs.copy_files(src, dst, source_filesystem=fs, destination_filesystem=pfs.LocalFileSystem())\n";
    let out = Command::new("python3")
        .args(["-c", script, &s3.endpoint, &s3.access_key, &s3.secret_key, s3.ca.to_str().unwrap(), path, local.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "download: {}", String::from_utf8_lossy(&out.stderr));
}

/// A load that goes on past its lease (paused, or cut off from the ledger while it still
/// reaches the store: a zombie) while its chunk is run again with other bytes and committed by
/// another load: the zombie's commit, planned again against that one, confirms its lease with
/// the ledger first (another commit carried its chunk), finds it lost, and writes nothing.
/// Unfenced, it took the newer load's files out and put its own back, files no ledger row names.
#[test]
fn a_load_gone_on_past_its_lease_does_not_undo_the_newer_load_of_its_chunk() {
    // A lease longer than the test: the zombie's own heartbeat never runs and tells it.
    let p = Pipeline::new("16KiB", "600s", "0s").table_format("delta");
    std::fs::write(p.path("in/a.jsonl"), events("a", 150)).unwrap();
    for s in &STAGES[..3] {
        let o = p.stage(s);
        assert!(o.status.success(), "{s}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let gate = p.path("gate");
    std::fs::create_dir_all(&gate).unwrap();
    let zombie = p
        .command("ferry-load")
        .args(["--once", "--concurrency", "1"])
        .env("FERRY_TEST_DELTA_COMMIT_GATE", &gate)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !gate.join("reached").exists() {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "the load never reached its commit");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let chunk = p.sql("SELECT chunk_id FROM tasks WHERE stage = 'load' AND state = 'running'");
    // Its lease ends (the pause outlasts it): another load takes the chunk over and loads it.
    p.ledger_script("UPDATE tasks SET lease_expires_at = 0 WHERE state = 'running'");
    drained(&p);
    // Then it is run again from transform with a column added: its parts made again are other
    // bytes, under other names.
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    let score = "{ name = \"score\", type = \"double\" },";
    assert!(cfg.contains(score));
    std::fs::write(&p.config, cfg.replace(score, &format!("{score}\n  {{ name = \"note\", type = \"string\" }},"))).unwrap();
    let o = p.command("ferry").args(["rerun", "--chunk", &chunk, "--from", "transform"]).output().unwrap();
    assert!(o.status.success(), "rerun: {}", String::from_utf8_lossy(&o.stderr));
    drained(&p);
    let published =
        || p.sql(&format!("SELECT group_concat(path, ' ') FROM (SELECT path FROM published WHERE chunk_id = '{chunk}' ORDER BY path)"));
    let active = || {
        let mut mine: Vec<String> = delta_files(&table(&p))
            .into_iter()
            .filter(|f| f.contains(&format!("part-{chunk}-")))
            .map(|f| format!("events/{}", f.split("/events/").nth(1).unwrap()))
            .collect();
        mine.sort();
        mine.join(" ")
    };
    let before = published();
    assert_eq!(active(), before, "the newer load's files are the chunk's in the table");
    std::fs::write(gate.join("go"), b"").unwrap();
    let o = zombie.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("lease was taken over"), "the zombie's result is discarded: {said}");
    assert_eq!(active(), before, "the zombie changed nothing in the table");
    assert_eq!(published(), before);
    same(&delta_digest(&table(&p), None), &input_digest("jsonl", &p.path("in")), "every record once");
    let o = p.command("ferry").arg("verify").output().unwrap();
    assert!(o.status.success(), "verify: {}", String::from_utf8_lossy(&o.stdout));
    no_version_doubles(&table(&p));
}

/// On a store that lets a second create replace the first (an S3-compatible server that ignores
/// `If-None-Match`), `ferry doctor` refuses the Delta destination by name, exits non-zero and
/// leaves no probe; the same store passes for the Hive layout, which needs no put-if-absent.
#[test]
fn doctor_refuses_a_delta_destination_whose_store_lets_a_second_create_replace_the_first() {
    let s3 = ferry_tests::clusters::OverwritingS3::start();
    let p = Pipeline::with_stores("16KiB", "5s", "0s", None, Some(s3.destination_toml("overwrites/wh", "delta")));
    let o = output_within(p.command("ferry").args(["doctor", "--json", "--timeout", "10s"]), std::time::Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("doctor --json ({e}): {stdout}"));
    assert_eq!(o.status.code(), Some(1), "{v}");
    let failed: Vec<&serde_json::Value> = v["hops"].as_array().unwrap().iter().filter(|h| h["ok"] == false).collect();
    assert_eq!(failed.len(), 1, "one hop fails: {v}");
    let error = failed[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("put-if-absent") && error.contains("If-None-Match") && error.contains("s3://ferry/overwrites/wh"), "{v}");
    // The probe is gone (a listing of the bucket names none).
    let list = output_within(
        std::process::Command::new("curl").args(["-sS", &format!("{}/ferry?list-type=2&prefix=overwrites/", s3.endpoint)]),
        std::time::Duration::from_secs(30),
    );
    let listing = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success() && listing.contains("ListBucketResult") && !listing.contains("put-if-absent-probe"), "{listing}");
    // The check is the Delta table's (its commits are creates of the next log version): the same
    // store passes doctor with the Hive layout.
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replace("table_format = \"delta\"", "table_format = \"hive\"")).unwrap();
    let o = output_within(p.command("ferry").args(["doctor", "--timeout", "10s"]), std::time::Duration::from_secs(120));
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && !text.contains("put-if-absent"), "hive on the same store: {text}");
}

/// `ferry doctor` on a Delta table's destination checks the put-if-absent a commit needs (a
/// second create of one object refused, the first one's bytes kept) and leaves no probe behind.
#[test]
fn doctor_checks_that_the_destination_refuses_a_second_create_and_leaves_no_probe() {
    let p = delta_pipeline("16KiB");
    let o = output_within(p.command("ferry").arg("doctor"), std::time::Duration::from_secs(120));
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && text.contains("a second create is refused"), "doctor: {text}");
    let left: Vec<PathBuf> =
        ferry_tests::files_under(&p.path("wh")).into_iter().filter(|f| f.to_string_lossy().contains("put-if-absent-probe")).collect();
    assert!(left.is_empty(), "probes left: {left:?}");
}
