//! Several pipelines on one ledger, and binaries of another schema than the ledger's.
//!
//! Two configs (pipelines "default" and "b", tables `events` and `events_b`) share one ledger,
//! SQLite and Postgres: the stages of one never claim, publish or report the other's work,
//! also when both read the same source; a config that gives a known pipeline another table is
//! refused. Rolling upgrades: a binary runs on a ledger whose newer migrations say they are
//! compatible with it, refuses one whose newer migrations are not, and (on a shared ledger)
//! never migrates one that is behind unless told to (`ferry migrate`).

use std::path::PathBuf;
use std::process::Command;

use ferry_tests::{Pipeline, STAGES, bin, input_digest, table_digest};

/// A second config beside `p`'s: pipeline `name`, table `table`, source `source` (relative to
/// the pipeline's directory); the same ledger, staging, spool and destination.
fn second_config(p: &Pipeline, name: &str, table: &str, source: &str) -> PathBuf {
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    let cfg = format!("pipeline = \"{name}\"\n{cfg}")
        .replace("name = \"events\"", &format!("name = \"{table}\""))
        .replace(&format!("url = \"{}\"", p.path("in").display()), &format!("url = \"{}\"", p.path(source).display()));
    std::fs::create_dir_all(p.path(source)).unwrap();
    let path = p.path(&format!("{name}.toml"));
    std::fs::write(&path, cfg).unwrap();
    path
}

/// Runs `stage --once` with `config`; returns (exit code, stderr).
fn run(p: &Pipeline, stage: &str, config: &PathBuf) -> (Option<i32>, String) {
    let out = p.command(stage).env("FERRY_CONFIG", config).arg("--once").output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn all_stages(p: &Pipeline, config: &PathBuf) {
    for s in STAGES {
        let (code, err) = run(p, s, config);
        assert_eq!(code, Some(0), "{s} with {}: {err}", config.display());
    }
}

fn isolated(p: &Pipeline) {
    let b = second_config(p, "b", "events_b", "in_b");
    p.generate("in", "jsonl", "null", 2, 300, 1);
    p.generate("in_b", "jsonl", "null", 3, 200, 2);
    // B's files are registered and chunked; then only A's stages run.
    let (code, err) = run(p, "ferry-extract", &b);
    assert_eq!(code, Some(0), "{err}");
    all_stages(p, &p.config);
    let (want_a, want_b) = (input_digest("jsonl", &p.path("in")), input_digest("jsonl", &p.path("in_b")));
    assert_ne!(want_a["digest"], want_b["digest"], "the two sources differ (seeds 1 and 2)");
    let same = |table: &str, want: &serde_json::Value, what: &str| {
        let got = table_digest(&p.path(&format!("wh/{table}")));
        for k in ["rows", "distinct", "digest"] {
            assert_eq!(got[k], want[k], "{what}: {k}");
        }
    };
    same("events", &want_a, "A's table holds exactly A's rows");
    assert!(!p.path("wh/events_b").exists(), "nothing of B published by A's stages");
    let a_status = p.command("ferry").args(["status", "--json"]).output().unwrap();
    let a_json: serde_json::Value = serde_json::from_slice(&a_status.stdout).unwrap();
    let b_status = p.command("ferry").args(["--pipeline", "b", "status", "--json"]).output().unwrap();
    let b_json: serde_json::Value = serde_json::from_slice(&b_status.stdout).unwrap();
    let pending = |v: &serde_json::Value| v.to_string();
    assert_ne!(pending(&a_json), pending(&b_json), "each pipeline has its own status");
    // Now B's own stages: its table, exactly once, and A's untouched.
    all_stages(p, &b);
    same("events_b", &want_b, "B's table holds exactly B's rows");
    same("events", &want_a, "A's table, untouched by B's stages");
    // A config that names pipeline b with A's table is refused, naming both.
    let wrong = second_config(p, "b", "events", "in_b");
    let (code, err) = run(p, "ferry-transform", &wrong);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("\"b\"") && err.contains("events_b"), "{err}");
}

#[test]
fn two_pipelines_on_one_sqlite_ledger_stay_isolated() {
    isolated(&Pipeline::new("64KiB", "30s", "0s"));
}

#[test]
fn two_pipelines_on_one_postgres_ledger_stay_isolated() {
    let pg = ferry_tests::postgres::Postgres::start(false);
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.use_ledger(&pg.url());
    isolated(&p);
}

/// One source, two destinations (B -> A and B -> S3 in the real setup): each pipeline takes
/// in every file and publishes it once, into its own table.
#[test]
fn two_pipelines_can_read_the_same_source() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    let b = second_config(&p, "copy2", "events_copy", "in");
    p.generate("in", "jsonl", "null", 2, 250, 3);
    all_stages(&p, &p.config);
    all_stages(&p, &b);
    assert_eq!(table_digest(&p.path("wh/events"))["rows"], 500);
    assert_eq!(table_digest(&p.path("wh/events_copy"))["rows"], 500);
    assert_eq!(table_digest(&p.path("wh/events"))["digest"], table_digest(&p.path("wh/events_copy"))["digest"]);
}

fn sql(db: &std::path::Path, q: &str) {
    let out = Command::new("python3")
        .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.commit()"])
        .arg(db)
        .arg(q)
        .output()
        .unwrap();
    assert!(out.status.success(), "{q}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The ledger one migration ahead of this binary (as a newer binary's `ferry migrate` leaves
/// it): compatible, the stages and `status` run on it; incompatible, they refuse, naming the
/// migration. One migration behind, on a ledger that does not migrate itself: refused with the
/// way out, and `ferry migrate --check` says what would run.
#[test]
fn binaries_run_on_a_compatible_newer_ledger_and_refuse_the_rest() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 1, 100, 4);
    all_stages(&p, &p.config);
    let db = p.path("ledger.db");
    let next = ferry_ledger::SCHEMA_VERSION + 1;
    sql(
        &db,
        &format!(
            "INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time)
             VALUES ({next}, 'from a newer binary', CURRENT_TIMESTAMP, 1, x'00', 1);
             CREATE TABLE newer_things (x INTEGER);
             INSERT INTO ledger_compat (version, oldest_binary, note) VALUES ({next}, {}, 'additive: newer_things');",
            ferry_ledger::SCHEMA_VERSION
        ),
    );
    p.generate("in", "jsonl", "null", 1, 50, 5);
    all_stages(&p, &p.config);
    assert_eq!(p.table_digest()["rows"], 150, "the stages ran on the newer ledger");
    let status = p.command("ferry").arg("status").output().unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", String::from_utf8_lossy(&status.stderr));
    sql(&db, &format!("UPDATE ledger_compat SET oldest_binary = {next}, note = 'changes claims' WHERE version = {next}"));
    for cmd in [vec!["ferry", "status"], vec!["ferry-transform", "--once"]] {
        let out = p.command(cmd[0]).args(&cmd[1..]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(err.contains(&format!("migration {next} (changes claims)")) && err.contains("upgrade this binary"), "{err}");
    }
    // Behind: pretend the ledger never had this binary's last migrations, from 8 on (spool
    // nodes, which needs every stage stopped).
    let behind = 8;
    sql(&db, &format!("DELETE FROM _sqlx_migrations WHERE version >= {behind};"));
    let cfg = std::fs::read_to_string(&p.config).unwrap().replace("[ledger]\n", "[ledger]\nauto_migrate = false\n");
    std::fs::write(&p.config, cfg).unwrap();
    for cmd in [vec!["ferry", "status"], vec!["ferry-load", "--once"]] {
        let out = p.command(cmd[0]).args(&cmd[1..]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(err.contains("older than this binary's") && err.contains("ferry migrate"), "{err}");
    }
    let check = Command::new(bin("ferry")).env("FERRY_CONFIG", &p.config).args(["migrate", "--check"]).output().unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    assert!(text.contains(&format!("ledger schema {}", behind - 1)) && text.contains("spool nodes"), "{text}");
    assert!(text.contains("must be stopped"), "{text}");
}

/// `ferry prune` deletes finished history and keeps what exactly-once needs: re-running every
/// stage afterwards publishes nothing twice, and new files still flow. Prints the ledger's
/// bytes per chunk before and after (SQLite, vacuumed).
#[test]
fn prune_keeps_exactly_once() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 4, 500, 6);
    all_stages(&p, &p.config);
    let before = p.table_digest();
    let chunks = p.count("SELECT COUNT(*) FROM chunks");
    let size = |p: &Pipeline| {
        sql(&p.path("ledger.db"), "VACUUM;");
        std::fs::metadata(p.path("ledger.db")).unwrap().len() as i64
    };
    let bytes_before = size(&p);
    let dry = p.command("ferry").args(["prune", "--older-than", "0s", "--dry-run"]).output().unwrap();
    assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks"), 3 * chunks, "a dry run changes nothing");
    let out = p.command("ferry").args(["prune", "--older-than", "0s"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("{} task(s)", 2 * chunks)), "{text}");
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks"), chunks, "each chunk keeps its load task");
    assert_eq!(p.count("SELECT COUNT(*) FROM attempts"), 0);
    let bytes_after = size(&p);
    println!("ledger bytes per chunk: {} before prune, {} after ({chunks} chunks)", bytes_before / chunks, bytes_after / chunks);
    assert!(bytes_after < bytes_before, "{bytes_after} < {bytes_before}");
    // Every stage again: nothing is redone or doubled; a new file still flows.
    all_stages(&p, &p.config);
    assert_eq!(p.table_digest(), before, "nothing published twice");
    // A pruned chunk can still be run again from transform (its staged copy is kept): the
    // task is recreated and load replaces the chunk's own files.
    let chunk = p.sql("SELECT id FROM chunks ORDER BY id LIMIT 1");
    let out = p.command("ferry").args(["rerun", "--chunk", &chunk, "--from", "transform"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("transform -> copy -> load"), "{}", String::from_utf8_lossy(&out.stdout));
    all_stages(&p, &p.config);
    assert_eq!(p.count(&format!("SELECT COUNT(*) FROM tasks WHERE chunk_id = '{chunk}' AND state = 'done'")), 3);
    assert_eq!(p.table_digest(), before, "rerun after prune: the same table");
    p.generate("more", "jsonl", "null", 1, 100, 7);
    for e in std::fs::read_dir(p.path("more")).unwrap().flatten() {
        std::fs::rename(e.path(), p.path(&format!("in/more-{}", e.file_name().to_string_lossy()))).unwrap();
    }
    all_stages(&p, &p.config);
    assert_eq!(p.table_digest()["rows"], before["rows"].as_i64().unwrap() + 100);
}

/// `ferry verify` finds a published file that went missing, one that changed size and one the
/// ledger does not know; `--requeue` runs the damaged chunks again and the table is whole.
/// `ferry gc` removes staged chunks past `transform.keep_staged`.
#[test]
fn verify_finds_and_requeues_damage_and_gc_removes_old_staged_chunks() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 2, 400, 8);
    all_stages(&p, &p.config);
    let before = p.table_digest();
    let verify = |args: &[&str]| {
        let out = p.command("ferry").arg("verify").args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, text) = verify(&[]);
    assert_eq!(code, Some(0), "{text}");
    let files: Vec<PathBuf> = walk(&p.path("wh/events")).into_iter().filter(|f| f.extension().is_some_and(|e| e == "parquet")).collect();
    assert!(files.len() >= 3, "{files:?}");
    std::fs::remove_file(&files[0]).unwrap();
    std::fs::write(&files[1], b"not parquet").unwrap();
    let stray = files[2].with_file_name("part-somebody-else.parquet");
    std::fs::copy(&files[2], &stray).unwrap();
    let (code, text) = verify(&[]);
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains("1 missing, 1 of the wrong size, 1 extra"), "{text}");
    let (code, text) = verify(&["--requeue"]);
    assert_eq!(code, Some(3), "{text}");
    assert!((1..=2).contains(&text.matches("will run again").count()), "the damaged files' chunks: {text}");
    std::fs::remove_file(&stray).unwrap();
    all_stages(&p, &p.config);
    let (code, text) = verify(&[]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(p.table_digest(), before, "whole again, nothing doubled");
    // Staged chunks: kept within transform.keep_staged, removed by gc after it.
    let staged = || walk(&p.path("staging")).len();
    assert!(staged() > 0);
    assert!(p.command("ferry").arg("gc").output().unwrap().status.success());
    assert!(staged() > 0, "within keep_staged (7 days by default)");
    let cfg = std::fs::read_to_string(&p.config).unwrap().replace("[transform]\n", "[transform]\nkeep_staged = \"0s\"\n");
    std::fs::write(&p.config, cfg).unwrap();
    let out = p.command("ferry").arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(staged(), 0, "{}", String::from_utf8_lossy(&out.stdout));
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

/// A host gone for good with its spool: its chunks wait for a copy on its node, nobody else's
/// copy takes them, and `ferry rerun --spool-node` has them transformed again elsewhere.
#[test]
fn a_lost_spool_node_is_rerun_elsewhere() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 2, 400, 8);
    let on = |stage: &str, node: &str| {
        let out = p
            .command(stage)
            .env("FERRY_SPOOL_NODE", node)
            .env("FERRY_SPOOL_DIR", p.path(&format!("spool-{node}")))
            .arg("--once")
            .output()
            .unwrap();
        assert!(out.status.success(), "{stage} on {node}: {}", String::from_utf8_lossy(&out.stderr));
    };
    on("ferry-extract", "gone");
    on("ferry-transform", "gone");
    std::fs::remove_dir_all(p.path("spool-gone")).unwrap();
    on("ferry-copy", "here");
    let waiting = p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND node = 'gone' AND state = 'available'");
    assert!(waiting > 1, "{waiting}");
    assert_eq!(p.count("SELECT chunks FROM copy_backlog_by_node WHERE node = 'gone'"), waiting);
    let out = p.command("ferry").args(["rerun", "--spool-node", "gone", "--from", "transform"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("{waiting} chunk(s) wait for a copy on spool node \"gone\"")), "{text}");
    let refused = p.command("ferry").args(["rerun", "--spool-node", "gone", "--from", "copy"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", String::from_utf8_lossy(&refused.stderr));
    for s in ["ferry-transform", "ferry-copy", "ferry-load"] {
        on(s, "here");
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), 0);
    assert_eq!(table_digest(&p.path("wh/events"))["rows"], 800);
}

/// Two pipelines may write tables of the same name into different destinations: each keeps its
/// own schema versions (B's `user_id` is text where A's is a number: no spurious quarantine)
/// and its own partitions (each DDL lists only its own).
#[test]
fn pipelines_with_a_table_of_the_same_name_share_no_schema_and_no_partitions() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    let b = second_config(&p, "b", "events", "in_b");
    let cfg = std::fs::read_to_string(&b).unwrap();
    let cfg = cfg
        .replace(&format!("url = \"{}/wh\"", p.dir.path().display()), &format!("url = \"{}/wh_b\"", p.dir.path().display()))
        .replace("{ name = \"user_id\", type = \"long\"", "{ name = \"user_id\", type = \"string\"");
    assert!(cfg.contains("wh_b") && cfg.contains("\"user_id\", type = \"string\""), "{cfg}");
    std::fs::write(&b, cfg).unwrap();
    p.generate("in", "jsonl", "null", 1, 300, 1);
    let mut lines = String::new();
    for i in 0..50 {
        lines += &format!(
            "{{\"event_id\":\"b{i}\",\"ts\":\"2027-01-0{}T10:00:00Z\",\"host\":\"h\",\"kind\":\"k\",\"user_id\":\"{i}\",\"payload\":\"p\",\"score\":null}}\n",
            1 + i % 2
        );
    }
    std::fs::write(p.path("in_b/b.jsonl"), lines).unwrap();
    all_stages(&p, &p.config);
    all_stages(&p, &b);
    assert_eq!(table_digest(&p.path("wh_b/events"))["rows"], 50);
    assert_eq!(table_digest(&p.path("wh/events"))["rows"], 300);
    let a_ddl = std::fs::read_to_string(p.path("wh/events/_ferry/ddl.sql")).unwrap();
    let b_ddl = std::fs::read_to_string(p.path("wh_b/events/_ferry/ddl.sql")).unwrap();
    assert!(a_ddl.contains("`user_id` BIGINT") && b_ddl.contains("`user_id` STRING"), "{a_ddl}\n{b_ddl}");
    assert!(!a_ddl.contains("2027-01-0"), "A's DDL lists only A's partitions:\n{a_ddl}");
    assert_eq!(b_ddl.matches("ADD IF NOT EXISTS PARTITION").count(), 2, "B's DDL lists only B's partitions:\n{b_ddl}");
    assert_eq!(p.count("SELECT COUNT(*) FROM table_schemas WHERE table_name = 'events'"), 2, "one version per pipeline");
}

/// Cleanup touches only what is Ferry's and its own pipeline's: with two pipelines on one
/// destination root, `ferry gc` of A removes A's abandoned copy temp files and leaves B's
/// (B may be slower, its upload live) and a file another tool put in `_ferry/tmp`.
#[test]
fn gc_of_one_pipeline_leaves_the_other_pipelines_and_foreign_temp_files() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    let b = second_config(&p, "b", "events_b", "in_b");
    p.generate("in", "jsonl", "null", 1, 100, 1);
    p.generate("in_b", "jsonl", "null", 1, 100, 2);
    for config in [&p.config, &b] {
        let (code, err) = run(&p, "ferry-extract", config);
        assert_eq!(code, Some(0), "{err}");
    }
    let chunk_of = |pipeline: &str| {
        p.sql(&format!(
            "SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.pipeline = '{pipeline}' ORDER BY c.id LIMIT 1"
        ))
    };
    let tmp = p.path("wh/_ferry/tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let (a_temp, b_temp, foreign) =
        (tmp.join(format!("{}.1.0.1", chunk_of("default"))), tmp.join(format!("{}.1.0.1", chunk_of("b"))), tmp.join("rsync-partial.bin"));
    for f in [&a_temp, &b_temp, &foreign] {
        std::fs::write(f, b"partial").unwrap();
    }
    let out = p.command("ferry").args(["gc", "--older-than", "0s"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!a_temp.exists(), "A's own abandoned temp file went");
    assert!(b_temp.exists(), "B's is B's to clean up");
    assert!(foreign.exists(), "a file Ferry did not write is never removed");
}
