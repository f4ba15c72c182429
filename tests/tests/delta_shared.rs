//! Delta tables other engines share: delta-rs (the `deltalake` Python package) and Spark with
//! delta-spark (Delta's reference implementation) set a table's properties, turn features on,
//! delete, update, merge and compact beside Ferry's loads. Each test ends with Ferry's rows
//! exactly once and the other engine's rows and settings untouched, or with a refusal that
//! names the reason.

mod delta_common;

use delta_common::*;
use ferry_tests::{delta_digest, input_digest, output_within};

/// A table is shared: another engine (delta-rs) sets its properties, its description and a
/// column's comment; Ferry's later loads keep every one of them. A rule the table sets
/// (append-only) refuses the commit that would break it, naming it, with the table as it was;
/// a feature Ferry does not write (the change data feed) is refused by load and by doctor.
#[test]
fn a_table_another_engine_changed_keeps_its_settings_and_refuses_what_ferry_does_not_write() {
    let (p, dir) = loaded(&[("a", 200)]);
    other_engine(
        &dir,
        "dt.alter.set_table_properties({'delta.deletedFileRetentionDuration': 'interval 2 days', \
         'delta.logRetentionDuration': 'interval 60 days', 'delta.checkpointInterval': '4'})\n\
         dt = DeltaTable(sys.argv[1])\ndt.alter.set_table_description('events, landed by ferry')\n\
         dt = DeltaTable(sys.argv[1])\ndt.alter.set_column_metadata('host', {'comment': 'where it happened'})",
    );
    let before = table_metadata(&dir);
    assert_eq!(before["configuration"]["delta.logRetentionDuration"], "interval 60 days", "{before}");
    let foreign = commits(&dir).last().unwrap().0;

    // More chunks: Ferry's commits carry nothing of the metaData over (no schema change), and
    // everything the other engine set is there after them, with every record once.
    std::fs::write(p.path("in/b.jsonl"), events("b", 200)).unwrap();
    drained(&p);
    let after: Vec<_> = commits(&dir).into_iter().filter(|(v, _)| *v > foreign).collect();
    assert!(after.len() > 1, "Ferry committed more chunks: {}", after.len());
    for (v, actions) in &after {
        assert!(actions.iter().all(|a| a.get("metaData").is_none()), "version {v} rewrote the metaData: {actions:?}");
    }
    assert_eq!(table_metadata(&dir), before, "the other engine's settings after Ferry's loads");
    let want = |files: &[(&str, usize)]| {
        let d = p.path(&format!("expect-{}", files.iter().map(|(t, _)| *t).collect::<String>()));
        std::fs::create_dir_all(&d).unwrap();
        for (tag, n) in files {
            std::fs::write(d.join(format!("{tag}.jsonl")), events(tag, *n)).unwrap();
        }
        input_digest("jsonl", &d)
    };
    same(&delta_digest(&dir, None), &want(&[("a", 200), ("b", 200)]), "a and b");
    no_version_doubles(&dir);

    // Append-only: a corrected a.jsonl would take a's rows out; the commit is refused with the
    // reason, nothing is half done, and the table still reads a and b.
    other_engine(&dir, "dt.alter.set_table_properties({'delta.appendOnly': 'true'})");
    let version = commits(&dir).last().unwrap().0;
    std::fs::write(p.path("in/.a.jsonl.part"), events("a2", 150)).unwrap();
    std::fs::rename(p.path("in/.a.jsonl.part"), p.path("in/a.jsonl")).unwrap();
    p.drain(6);
    let refused = p.sql("SELECT COALESCE(group_concat(last_error, ' | '), '') FROM tasks WHERE stage = 'load' AND state <> 'done'");
    assert!(refused.contains("append-only") && refused.contains("delta.appendOnly"), "load's error: {refused:?}");
    for (v, actions) in commits(&dir).into_iter().filter(|(v, _)| *v > version) {
        assert!(actions.iter().all(|a| a.get("remove").is_none()), "version {v} removed a file of an append-only table");
    }
    same(&delta_digest(&dir, None), &want(&[("a", 200), ("b", 200)]), "the append-only table as it was");
    let status = output_within(p.command("ferry").arg("status"), std::time::Duration::from_secs(120));
    assert!(String::from_utf8_lossy(&status.stdout).contains("append-only"), "{}", String::from_utf8_lossy(&status.stdout));

    // The change data feed: Ferry would have to write change files; refused by name at load and
    // by doctor, with the table's rows as they were.
    other_engine(&dir, "dt.alter.set_table_properties({'delta.appendOnly': 'false', 'delta.enableChangeDataFeed': 'true'})");
    let version = commits(&dir).last().unwrap().0;
    std::fs::write(p.path("in/c.jsonl"), events("c", 100)).unwrap();
    p.drain(6);
    let refused = p.sql(
        "SELECT COALESCE(group_concat(t.last_error, ' | '), '') FROM tasks t JOIN chunks c ON c.id = t.chunk_id \
         JOIN source_files f ON f.id = c.file_id WHERE t.stage = 'load' AND f.uri LIKE '%/c.jsonl'",
    );
    assert!(refused.contains("change data feed") && refused.contains("delta.enableChangeDataFeed"), "load's error: {refused:?}");
    assert_eq!(commits(&dir).last().unwrap().0, version, "nothing committed to a table with a change data feed");
    let o = output_within(p.command("ferry").arg("doctor"), std::time::Duration::from_secs(120));
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!o.status.success() && text.contains("change data feed"), "doctor: {text}");
    assert_eq!(table_metadata(&dir)["description"], before["description"]);
}

/// Another engine (delta-rs) deletes rows of Ferry's chunks, then compacts the table's files:
/// its DELETE and OPTIMIZE rewrite Ferry's parts into files Ferry cannot name by chunk. A rerun
/// of those chunks from load changes nothing (the deleted rows stay deleted, none is doubled),
/// also when the rerun reads the table from a checkpoint written after the DELETE; a corrected
/// source file, whose switch would leave the old rows in the other engine's files beside the
/// new ones, is refused naming that engine's commit, with the table as that engine left it;
/// `ferry verify` reports the rewritten parts.
#[test]
fn another_engines_delete_and_optimize_are_never_undone_by_a_rerun_or_a_switch() {
    let (p, dir) = loaded(&[("a", 200), ("b", 200)]);
    other_engine(&dir, "dt.alter.set_table_properties({'delta.checkpointInterval': '2'})");
    let gone = ["a-00003", "a-00100", "a-00151"];
    other_engine(&dir, &format!("dt.delete(\"event_id in ('{}')\")", gone.join("', '")));
    let deleted = commits(&dir).last().unwrap().0;
    assert!(commits(&dir).last().unwrap().1.iter().any(|a| a.get("remove").is_some()), "the DELETE rewrote a file");
    // More of Ferry's commits: a checkpoint after the DELETE, which loads start from.
    std::fs::write(p.path("in/c.jsonl"), events("c", 100)).unwrap();
    drained(&p);
    let checkpoints: Vec<i64> = std::fs::read_dir(dir.join("_delta_log"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".checkpoint.parquet")?.parse().ok())
        .collect();
    assert!(checkpoints.iter().any(|c| *c > deleted), "a checkpoint after the DELETE at {deleted}: {checkpoints:?}");
    let want = {
        let d = p.path("expect");
        std::fs::create_dir_all(&d).unwrap();
        let a: String = events("a", 200).lines().filter(|l| !gone.iter().any(|g| l.contains(g))).map(|l| format!("{l}\n")).collect();
        std::fs::write(d.join("a.jsonl"), a).unwrap();
        std::fs::write(d.join("b.jsonl"), events("b", 200)).unwrap();
        std::fs::write(d.join("c.jsonl"), events("c", 100)).unwrap();
        input_digest("jsonl", &d)
    };
    same(&delta_digest(&dir, None), &want, "after the other engine's DELETE");
    let chunks_of = |file: &str| -> Vec<String> {
        p.sql(&format!(
            "SELECT group_concat(id, ' ') FROM (SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id \
             WHERE f.uri LIKE '%/{file}' ORDER BY c.id)"
        ))
        .split_whitespace()
        .map(str::to_string)
        .collect()
    };
    let rerun = |file: &str| {
        let chunks = chunks_of(file);
        assert!(chunks.len() > 1, "{file}: several chunks");
        for c in &chunks {
            let o = p.command("ferry").args(["rerun", "--chunk", c, "--from", "load"]).output().unwrap();
            assert!(o.status.success(), "rerun: {}", String::from_utf8_lossy(&o.stderr));
        }
        let before = commits(&dir).last().unwrap().0;
        drained(&p);
        for (v, actions) in commits(&dir).into_iter().filter(|(v, _)| *v > before) {
            assert!(actions.iter().all(|a| a.get("add").is_none()), "version {v} added a part again: {actions:?}");
        }
    };
    // A rerun of a's chunks: nothing comes back.
    rerun("a.jsonl");
    same(&delta_digest(&dir, None), &want, "a's chunks run again from load");
    let verify = || {
        let o = output_within(p.command("ferry").arg("verify"), std::time::Duration::from_secs(120));
        (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let (code, text) = verify();
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("rewritten ") && text.contains(&format!("commit {deleted} (DELETE")), "{text}");

    // The other engine compacts every partition's files: b's and c's parts are its files now.
    other_engine(&dir, "dt.optimize.compact()");
    let optimized = commits(&dir).last().unwrap().0;
    same(&delta_digest(&dir, None), &want, "after the other engine's OPTIMIZE");
    rerun("b.jsonl");
    same(&delta_digest(&dir, None), &want, "b's chunks run again from load");

    // A corrected b.jsonl: its switch would take b's rows out of files that are the other
    // engine's now. Refused, by the commit's name, and nothing written.
    let last = commits(&dir).last().unwrap().0;
    std::fs::write(p.path("in/.b.jsonl.part"), events("b2", 150)).unwrap();
    std::fs::rename(p.path("in/.b.jsonl.part"), p.path("in/b.jsonl")).unwrap();
    p.drain(6);
    let refused = p.sql(
        "SELECT COALESCE(group_concat(t.last_error, ' | '), '') FROM tasks t JOIN chunks c ON c.id = t.chunk_id \
         JOIN source_files f ON f.id = c.file_id WHERE t.stage = 'load' AND t.state <> 'done' AND f.version = 2",
    );
    assert!(
        refused.contains("rewritten by another writer's commit") && refused.contains(&format!("commit {optimized} (OPTIMIZE")),
        "load's error: {refused:?}"
    );
    assert_eq!(commits(&dir).last().unwrap().0, last, "nothing committed");
    same(&delta_digest(&dir, None), &want, "the table as the other engine left it");
    let (code, text) = verify();
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("commit {optimized} (OPTIMIZE")), "{text}");
}

/// A Delta pipeline with `<tag>.jsonl` files of `events(tag, n)` loaded, and its table's
/// directory.
fn loaded(files: &[(&str, usize)]) -> (ferry_tests::Pipeline, std::path::PathBuf) {
    let p = delta_pipeline("16KiB");
    for (tag, n) in files {
        std::fs::write(p.path(&format!("in/{tag}.jsonl")), events(tag, *n)).unwrap();
    }
    drained(&p);
    let dir = table(&p);
    (p, dir)
}

/// The table's rows as delta-rs reads them: payload by event id; no id twice.
fn rows(dir: &std::path::Path) -> std::collections::BTreeMap<String, String> {
    // delta-rs may abort at interpreter exit: the result is printed, then the process ends.
    let script = "import sys, json\nfrom deltalake import DeltaTable\nt = DeltaTable(sys.argv[1]).to_pyarrow_table(columns=['event_id', 'payload'])\n\
                  print(json.dumps(list(zip(t.column('event_id').to_pylist(), t.column('payload').to_pylist()))))\n\
                  import os; sys.stdout.flush(); os._exit(0)";
    let out = std::process::Command::new("python3").arg("-c").arg(script).arg(dir).output().unwrap();
    assert!(out.status.success(), "delta-rs: {}", String::from_utf8_lossy(&out.stderr));
    let list: Vec<(String, String)> = serde_json::from_slice(&out.stdout).unwrap();
    let n = list.len();
    let map: std::collections::BTreeMap<String, String> = list.into_iter().collect();
    assert_eq!(map.len(), n, "an event id twice in the table");
    map
}

/// The events of `events(tag, n)`: payload by event id.
fn rows_of(tag: &str, n: usize) -> std::collections::BTreeMap<String, String> {
    events(tag, n)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["event_id"].as_str().unwrap().to_string(), v["payload"].as_str().unwrap().to_string())
        })
        .collect()
}

/// `delta.`<dir>`` in Spark SQL.
fn spark_table(dir: &std::path::Path) -> String {
    format!("delta.`{}`", dir.display())
}

/// Ferry's columns as Spark's DDL writes them.
const COLUMNS: &str = "event_id STRING NOT NULL, ts TIMESTAMP NOT NULL, host STRING NOT NULL, kind STRING NOT NULL, \
                       user_id BIGINT NOT NULL, payload STRING NOT NULL, score DOUBLE, dt DATE";

/// Tables Spark made, each with a setting or a feature, then handed to Ferry: one with
/// retention, checkpoint and description settings is loaded and keeps them all; an append-only
/// one takes Ferry's appends and refuses the correction that would take rows out; each one that
/// uses a feature Ferry does not write (CHECK constraints, column mapping, generated and
/// identity columns, the change data feed, deletion vectors) is refused by the feature's name,
/// with nothing committed.
#[test]
fn tables_spark_made_are_loaded_with_their_settings_or_refused_by_the_feature_they_use() {
    struct Case {
        name: &'static str,
        columns: &'static str,
        properties: &'static str,
        then: &'static str,
        refused: Option<&'static str>,
    }
    let cases = [
        Case {
            name: "settings",
            columns: "",
            properties: "'delta.logRetentionDuration' = 'interval 60 days', 'delta.deletedFileRetentionDuration' = 'interval 2 days', \
                         'delta.checkpointInterval' = '3'",
            then: "",
            refused: None,
        },
        Case { name: "append-only", columns: "", properties: "'delta.appendOnly' = 'true'", then: "", refused: None },
        Case {
            name: "check",
            columns: "",
            properties: "",
            then: "ALTER TABLE {t} ADD CONSTRAINT known_user CHECK (user_id >= 0)",
            refused: Some("CHECK constraint"),
        },
        Case { name: "mapping", columns: "", properties: "'delta.columnMapping.mode' = 'name'", then: "", refused: Some("column mapping") },
        Case {
            name: "generated",
            columns: ", day DATE GENERATED ALWAYS AS (CAST(ts AS DATE))",
            properties: "",
            then: "",
            refused: Some("generated column"),
        },
        Case {
            name: "identity",
            columns: ", seq BIGINT GENERATED ALWAYS AS IDENTITY",
            properties: "",
            then: "",
            refused: Some("identity column"),
        },
        Case {
            name: "feed",
            columns: "",
            properties: "'delta.enableChangeDataFeed' = 'true'",
            then: "",
            refused: Some("change data feed"),
        },
        Case {
            name: "vectors",
            columns: "",
            properties: "'delta.enableDeletionVectors' = 'true'",
            then: "",
            refused: Some("deletionVectors"),
        },
    ];
    let pipelines: Vec<_> = cases.iter().map(|_| delta_pipeline("16KiB")).collect();
    let mut sql = vec![];
    for (c, p) in cases.iter().zip(&pipelines) {
        let t = spark_table(&table(p));
        let props = if c.properties.is_empty() { String::new() } else { format!(" TBLPROPERTIES ({})", c.properties) };
        sql.push(format!("CREATE TABLE {t} ({COLUMNS}{}) USING DELTA PARTITIONED BY (dt){props} COMMENT 'made by Spark'", c.columns));
        if !c.then.is_empty() {
            sql.push(c.then.replace("{t}", &t));
        }
    }
    let properties = |p: &ferry_tests::Pipeline| format!("SHOW TBLPROPERTIES {}", spark_table(&table(p)));
    sql.extend(pipelines.iter().map(properties));
    let before = ferry_tests::spark_sql(&sql);
    let before = &before[before.len() - cases.len()..];

    for (c, p) in cases.iter().zip(&pipelines) {
        let made = commits(&table(p)).last().unwrap().0;
        std::fs::write(p.path("in/a.jsonl"), events(c.name, 120)).unwrap();
        p.drain(6);
        let errors = p.sql("SELECT COALESCE(group_concat(last_error, ' | '), '') FROM tasks WHERE state <> 'done'");
        match c.refused {
            Some(why) => {
                assert!(errors.contains(why) && errors.contains("which Ferry does not write"), "{}: load's error: {errors:?}", c.name);
                assert_eq!(commits(&table(p)).last().unwrap().0, made, "{}: nothing committed", c.name);
            }
            None => {
                assert_eq!(errors, "", "{}: every task done", c.name);
                assert_eq!(rows(&table(p)), rows_of(c.name, 120), "{}: Ferry's rows once", c.name);
            }
        }
    }
    // The tables Ferry loaded keep every setting Spark made them with, as Spark reads them.
    let after = ferry_tests::spark_sql(&pipelines.iter().map(properties).collect::<Vec<_>>());
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(after[i], before[i], "{}: the table's properties and protocol", c.name);
    }
    assert!(before[0].iter().any(|kv| kv == "delta.logRetentionDuration,interval 60 days"), "{:?}", before[0]);

    // Append-only: a corrected file would take rows out; refused, and the rows stay.
    let p = &pipelines[1];
    std::fs::write(p.path("in/.a.jsonl.part"), events("again", 80)).unwrap();
    std::fs::rename(p.path("in/.a.jsonl.part"), p.path("in/a.jsonl")).unwrap();
    p.drain(6);
    let errors = p.sql("SELECT COALESCE(group_concat(last_error, ' | '), '') FROM tasks WHERE state <> 'done'");
    assert!(errors.contains("append-only"), "load's error: {errors:?}");
    assert_eq!(rows(&table(p)), rows_of("append-only", 120), "the append-only table as it was");
}

/// Spark deletes, updates, merges into and compacts Ferry's table, and inserts rows of its own,
/// between Ferry's loads: Ferry's next loads add their rows once beside Spark's, a rerun of the
/// chunks Spark rewrote changes nothing, and a corrected source file whose rows Spark rewrote is
/// refused naming Spark's commit. Every row ends as Spark left it.
#[test]
fn spark_deletes_updates_merges_and_compacts_beside_ferrys_loads() {
    let (p, dir) = loaded(&[("a", 200), ("b", 200)]);
    let t = spark_table(&dir);
    ferry_tests::spark_sql(&[
        format!("DELETE FROM {t} WHERE event_id IN ('a-00003', 'a-00100', 'a-00151')"),
        format!("UPDATE {t} SET payload = 'updated' WHERE event_id LIKE 'b-0001%'"),
        format!(
            "MERGE INTO {t} AS t USING (SELECT event_id FROM {t} WHERE event_id IN ('a-00010', 'b-00190')) AS s \
             ON t.event_id = s.event_id WHEN MATCHED THEN UPDATE SET payload = 'merged'"
        ),
        format!(
            "INSERT INTO {t} BY NAME SELECT concat('spark-', event_id) AS event_id, ts, host, kind, user_id, payload, score, dt \
             FROM {t} WHERE event_id LIKE 'a-000%'"
        ),
        format!("OPTIMIZE {t}"),
    ]);
    let mut want = rows_of("a", 200);
    want.extend(rows_of("b", 200));
    for gone in ["a-00003", "a-00100", "a-00151"] {
        want.remove(gone);
    }
    for i in 10..20 {
        want.insert(format!("b-{i:05}"), "updated".into());
    }
    for id in ["a-00010", "b-00190"] {
        want.insert(id.into(), "merged".into());
    }
    let spark_rows: Vec<(String, String)> =
        want.iter().filter(|(id, _)| id.starts_with("a-000")).map(|(id, v)| (format!("spark-{id}"), v.clone())).collect();
    want.extend(spark_rows);
    assert_eq!(rows(&dir), want, "the table as Spark left it");
    let spark_commits: Vec<i64> = commits(&dir)
        .into_iter()
        .filter(|(_, a)| a.iter().any(|a| a["commitInfo"]["engineInfo"].as_str().is_some_and(|e| e.contains("Spark"))))
        .map(|(v, _)| v)
        .collect();
    assert_eq!(spark_commits.len(), 5, "five commits of Spark's");

    // Ferry's next file goes in beside Spark's rows.
    std::fs::write(p.path("in/c.jsonl"), events("c", 100)).unwrap();
    drained(&p);
    want.extend(rows_of("c", 100));
    assert_eq!(rows(&dir), want, "c's rows added once");
    // A rerun from load of every chunk of a and b: nothing comes back, nothing is doubled.
    let chunks = p.sql(
        "SELECT group_concat(id, ' ') FROM (SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id \
         WHERE f.uri LIKE '%/a.jsonl' OR f.uri LIKE '%/b.jsonl')",
    );
    for c in chunks.split_whitespace() {
        let o = p.command("ferry").args(["rerun", "--chunk", c, "--from", "load"]).output().unwrap();
        assert!(o.status.success(), "rerun: {}", String::from_utf8_lossy(&o.stderr));
    }
    drained(&p);
    assert_eq!(rows(&dir), want, "after the reruns");
    // A corrected b.jsonl: refused, naming one of Spark's commits; the rows stay as they are.
    let last = commits(&dir).last().unwrap().0;
    std::fs::write(p.path("in/.b.jsonl.part"), events("b2", 150)).unwrap();
    std::fs::rename(p.path("in/.b.jsonl.part"), p.path("in/b.jsonl")).unwrap();
    p.drain(6);
    let errors = p.sql("SELECT COALESCE(group_concat(last_error, ' | '), '') FROM tasks WHERE state <> 'done'");
    assert!(
        errors.contains("rewritten by another writer's commit")
            && errors.contains("Apache-Spark")
            && spark_commits.iter().any(|v| errors.contains(&format!("commit {v} ("))),
        "load's error: {errors:?}"
    );
    assert_eq!(commits(&dir).last().unwrap().0, last, "nothing committed");
    assert_eq!(rows(&dir), want, "the table as it was");
    let o = output_within(p.command("ferry").arg("verify"), std::time::Duration::from_secs(120));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains("rewritten ") && text.contains("of other writers"), "{text}");
}

/// Two Ferry loads at once and a Spark writer, all on one table: Spark inserts four times in one
/// session; after each of its first three inserts is in the log, Ferry's next batch goes in
/// (two `ferry-load --once` at a time) while Spark makes its next insert, so commits of the
/// three writers race for versions. Every row once at every version, and Ferry's commits
/// between Spark's (the writers interleaved).
#[test]
fn two_ferry_loads_and_a_spark_writer_at_once_each_commit_every_row_once() {
    let (p, dir) = loaded(&[("first", 50)]);
    let t = spark_table(&dir);
    let gate = p.path("spark-gate");
    std::fs::create_dir_all(&gate).unwrap();
    let inserts = 4;
    let mut statements = Vec::new();
    for k in 0..inserts {
        if k > 0 {
            statements.push(format!("-- wait for {}", gate.join(format!("go-{k}")).display()));
        }
        statements.push(format!(
            "INSERT INTO {t} BY NAME SELECT concat('spark-{k}-', id) AS event_id, TIMESTAMP'2026-11-20 10:00:00' AS ts, \
             'h' AS host, 'k' AS kind, id AS user_id, 'from spark' AS payload, CAST(NULL AS DOUBLE) AS score, \
             DATE'2026-11-20' AS dt FROM range(10)"
        ));
    }
    let before = spark_commits(&dir).len();
    let spark = std::thread::spawn(move || ferry_tests::spark_sql(&statements));
    let mut want = rows_of("first", 50);
    for k in 0..inserts - 1 {
        ferry_tests::wait_until(&format!("Spark's insert {k} in the log"), std::time::Duration::from_secs(600), || {
            spark_commits(&dir).len() > before + k || spark.is_finished()
        });
        assert!(!spark.is_finished(), "Spark ended before its insert {}", k + 1);
        std::fs::write(gate.join(format!("go-{}", k + 1)), b"").unwrap();
        let tag = format!("batch{k}");
        std::fs::write(p.path(&format!("in/{tag}.jsonl")), events(&tag, 60)).unwrap();
        want.extend(rows_of(&tag, 60));
        for s in ["ferry-extract", "ferry-transform", "ferry-copy"] {
            p.stage_round(s);
        }
        let loads: Vec<_> = (0..2)
            .map(|_| p.command("ferry-load").args(["--once", "--concurrency", "2"]).stdout(std::process::Stdio::null()).spawn().unwrap())
            .collect();
        for mut l in loads {
            let code = l.wait().unwrap().code();
            assert!(matches!(code, Some(0 | 3 | 4)), "load exited {code:?}");
        }
    }
    spark.join().unwrap();
    drained(&p);
    for k in 0..inserts {
        for id in 0..10 {
            want.insert(format!("spark-{k}-{id}"), "from spark".into());
        }
    }
    assert_eq!(rows(&dir), want, "every row once");
    assert_eq!(versions_with_an_id_twice(&dir), Vec::<i64>::new(), "no version holds a row twice");
    // The writers interleaved: Ferry committed between Spark's first insert and its last.
    let spark_versions = spark_commits(&dir);
    let (first, last) = (spark_versions[before], *spark_versions.last().unwrap());
    let ferry_between = commits(&dir)
        .iter()
        .filter(|(v, a)| *v > first && *v < last && a.iter().any(|a| a.get("add").is_some()) && engine(a).starts_with("ferry/"))
        .count();
    assert!(ferry_between >= 2, "Ferry's commits between Spark's {first} and {last}: {ferry_between}");
    let o = output_within(p.command("ferry").arg("verify"), std::time::Duration::from_secs(120));
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
}

/// The writer of a commit, from its commitInfo.
fn engine(actions: &[serde_json::Value]) -> String {
    actions.iter().find_map(|a| a.get("commitInfo")?.get("engineInfo")?.as_str()).unwrap_or_default().to_string()
}

/// The versions of the commits that add files and are not Ferry's.
fn spark_commits(dir: &std::path::Path) -> Vec<i64> {
    commits(dir)
        .iter()
        .filter(|(_, a)| a.iter().any(|a| a.get("add").is_some()) && !engine(a).starts_with("ferry/"))
        .map(|(v, _)| *v)
        .collect()
}

/// Every version of the table read by delta-rs (in one process), and those in which an event
/// id appears twice.
fn versions_with_an_id_twice(dir: &std::path::Path) -> Vec<i64> {
    let script = "import sys, os, json\nfrom deltalake import DeltaTable\nlast = DeltaTable(sys.argv[1]).version()\nbad = []\n\
                  for v in range(last + 1):\n    ids = DeltaTable(sys.argv[1], version=v).to_pyarrow_table(columns=['event_id']).column(0)\n\
                  \x20   if len(ids) != len(set(ids.to_pylist())):\n        bad.append(v)\n\
                  print(json.dumps(bad)); sys.stdout.flush(); os._exit(0)";
    let out = std::process::Command::new("python3").arg("-c").arg(script).arg(dir).output().unwrap();
    assert!(out.status.success(), "delta-rs: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}
