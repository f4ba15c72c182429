//! How the binaries behave as services: SIGTERM in --watch, source disposition, marker files,
//! config errors.

use std::time::{Duration, Instant};

use ferry_tests::{Pipeline, STAGES};

#[test]
fn sigterm_stops_a_watching_stage_cleanly() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    for s in STAGES {
        let mut child = p.command(s).args(["--watch", "--poll", "100ms"]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(400));
        assert!(child.try_wait().unwrap().is_none(), "{s} --watch exited on its own");
        let started = Instant::now();
        assert!(std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "{s} ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{s} exit {status:?}");
    }
}

#[test]
fn delete_disposition_and_marker_files() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    let cfg = std::fs::read_to_string(&p.config)
        .unwrap()
        .replace("settle = \"0s\"", "settle = \"0s\"\nmarker = \".done\"\ndisposition = \"delete\"");
    std::fs::write(&p.config, cfg).unwrap();
    p.generate("in", "jsonl", "null", 2, 300, 5);
    let files: Vec<_> = std::fs::read_dir(p.path("in")).unwrap().flatten().map(|e| e.path()).collect();
    // Only the first file is marked finished.
    std::fs::write(format!("{}.done", files[0].display()), "").unwrap();
    let out = p.stage("ferry-extract");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(p.sql("SELECT COUNT(*) FROM source_files"), "1", "the unmarked file waits");
    assert!(!files[0].exists(), "a chunked file is deleted (disposition = delete)");
    assert!(files[1].exists());
}

#[test]
fn bad_config_names_the_key_and_exits_2() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    let cfg = std::fs::read_to_string(&p.config).unwrap().replace("max_bad_records = 5", "max_bad_record = 5");
    std::fs::write(&p.config, cfg).unwrap();
    for s in STAGES {
        let out = p.stage(s);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{s}: {err}");
        assert!(err.contains("max_bad_record") && err.contains("ferry.toml"), "{s}: {err}");
    }
}

#[test]
fn bad_store_settings_name_the_key_and_exit_2() {
    let cases = [
        ("[destination.store.s3]\nca_bundel = \"x\"\n", "s3://b/p", "ca_bundel"),
        ("[destination.store.s3]\nca_bundle = \"/nonexistent/ca.pem\"\n", "s3://b/p", "ca_bundle"),
        ("[destination.store]\ncall_timeout = \"soon\"\n", "hdfs://127.0.0.1:1/w", "call_timeout"),
        ("", "s3:///nobucket", "bucket"),
        ("", "gopher://x/y", "gopher"),
    ];
    for (extra, url, key) in cases {
        let p = Pipeline::new("1MiB", "30s", "0s");
        let cfg = std::fs::read_to_string(&p.config).unwrap();
        let dest = format!("url = \"{}/wh\"", p.dir.path().display());
        assert!(cfg.contains(&dest));
        let cfg = cfg.replace(&dest, &format!("url = \"{url}\"\n{extra}"));
        std::fs::write(&p.config, cfg).unwrap();
        for s in ["ferry-copy", "ferry-load"] {
            let out = p.stage(s);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{s} with {url} {extra:?}: {err}");
            assert!(err.contains(key), "{s}: the error names {key:?}: {err}");
        }
    }
}

/// `ferry move-ledger`: a pipeline part-way through on SQLite (one batch published, another
/// chunked and transformed, not copied) moves into a new Postgres ledger and finishes there,
/// with a batch more: every record published once. On the way: a move is refused while a
/// stage holds a live lease, into an unmigrated or non-empty ledger, and once done; the old
/// file refuses the stages that still name it; a move whose mark was lost is finished by
/// running it again.
#[test]
fn a_sqlite_ledger_moved_to_postgres_goes_on_there_with_every_record_once() {
    let pg = ferry_tests::postgres::Postgres::start(false);
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.add_jsonl_batch("a", 2, 400, 31);
    p.stages_ok(&STAGES);
    p.add_jsonl_batch("b", 2, 400, 32);
    p.stages_ok(&["ferry-extract", "ferry-transform"]);
    let ferry = |args: &[&str]| {
        let o = p.command("ferry").args(args).output().unwrap();
        (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let to = pg.url();

    // Not migrated yet: refused, nothing marked.
    let (code, out) = ferry(&["move-ledger", "--to", &to]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("ferry migrate"), "{out}");
    let (code, out) = ferry(&["--ledger", &to, "migrate"]);
    assert_eq!(code, Some(0), "{out}");
    // A stage at work (a live lease on a copy task): refused, naming it.
    let task = p.count("SELECT MIN(id) FROM tasks WHERE stage = 'copy' AND state = 'available'");
    let far = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() + 600_000;
    p.ledger_script(&format!(
        "UPDATE tasks SET state = 'running', lease_owner = 'host-a:1', lease_expires_at = {far}, epoch = epoch + 1 WHERE id = {task}"
    ));
    let (code, out) = ferry(&["move-ledger", "--to", &to]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("a stage is at work") && out.contains("host-a:1"), "{out}");
    assert_eq!(pg.sql("SELECT COUNT(*) FROM chunks"), "0", "nothing copied by a refused move");
    p.ledger_script(&format!("UPDATE tasks SET state = 'available', lease_owner = NULL, lease_expires_at = NULL WHERE id = {task}"));

    let tables = ferry_ledger::TABLES;
    let before: Vec<String> = tables.iter().map(|t| p.sql(&format!("SELECT COUNT(*) FROM {t}"))).collect();
    let (code, out) = ferry(&["move-ledger", "--to", &to]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("Point [ledger] url"), "{out}");
    for (t, n) in tables.iter().zip(&before) {
        assert_eq!(&pg.sql(&format!("SELECT COUNT(*) FROM {t}")), n, "{t}: every row moved");
    }
    // The rows themselves, ids included, read on each side by its own client.
    for (table, row, order) in [
        ("source_files", "id || uri || state || content_hash", "id"),
        ("tasks", "id || chunk_id || stage || state || attempt || epoch", "id"),
        ("parts", "chunk_id || partition || name || bytes || content_hash", "chunk_id, partition"),
    ] {
        let got = pg.sql(&format!("SELECT string_agg({row}, ',' ORDER BY {order}) FROM {table}"));
        let want = p.sql(&format!("SELECT group_concat(r, ',') FROM (SELECT {row} AS r FROM {table} ORDER BY {order})"));
        assert!(!want.is_empty(), "{table}");
        assert_eq!(got, want, "{table}: the same rows on both sides");
    }

    // The old ledger: every stage and command that still names it is refused, saying where it went.
    let load = p.stage("ferry-load");
    let err = String::from_utf8_lossy(&load.stderr);
    assert_eq!(load.status.code(), Some(2), "{err}");
    assert!(err.contains("was moved") && err.contains(&format!("127.0.0.1:{}", pg.port)), "{err}");
    let (code, out) = ferry(&["move-ledger", "--to", &to]);
    assert_eq!(code, Some(2), "a second move of the same file: {out}");
    assert!(out.contains("was moved"), "{out}");
    // A move whose mark was lost (the process died between the commit and the mark): run
    // again, it finds its rows there and only marks.
    let unmark = std::process::Command::new("python3")
        .args(["-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA user_version = 0'); c.commit()"])
        .arg(p.path("ledger.db"))
        .status()
        .unwrap();
    assert!(unmark.success());
    let (code, out) = ferry(&["move-ledger", "--to", &to]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("copied by an earlier run"), "{out}");
    assert_eq!(p.stage("ferry-copy").status.code(), Some(2), "marked again");
    // Another SQLite ledger into the same, now full, Postgres ledger: refused.
    let other = Pipeline::new("16KiB", "30s", "0s");
    other.add_jsonl_batch("x", 1, 10, 1);
    other.stages_ok(&["ferry-extract"]);
    let o = other.command("ferry").args(["move-ledger", "--to", &to]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not empty"), "{}", String::from_utf8_lossy(&o.stderr));

    // On Postgres: batch b goes on from where it was, a new batch c comes in (new ids past the
    // moved ones), and the table holds every record once.
    p.use_ledger(&to);
    let last_file = pg.sql("SELECT MAX(id) FROM source_files");
    p.add_jsonl_batch("c", 2, 400, 33);
    for _ in 0..3 {
        p.stages_ok(&STAGES);
    }
    assert_eq!(pg.sql("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), "0", "everything done on Postgres");
    assert_eq!(pg.sql(&format!("SELECT COUNT(*) FROM source_files WHERE id > {last_file}")), "2", "batch c's files after the moved ids");
    ferry_tests::assert_same_rows(&p.table_digest(), &ferry_tests::input_digest("jsonl", &p.path("in")), "moved mid-way");
}

/// The upgrade runbook's backup, and going back to it: the SQLite ledger backed up (SQLite's
/// online backup, what `sqlite3 .backup` runs) with a batch half-way, work done after it (that
/// batch published, another one too), then the backup put back as after a failed upgrade, and
/// the chunks it has waiting for a copy sent through transform again (their spool files went
/// with the copies made since). The stages go on from the backup, and the table still holds
/// every record once: parts published after the backup are found in the table and recorded,
/// not written a second time.
#[test]
fn a_ledger_put_back_from_its_backup_publishes_nothing_twice() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.add_jsonl_batch("a", 2, 300, 41);
    p.stages_ok(&STAGES);
    p.add_jsonl_batch("b", 2, 300, 42);
    p.stages_ok(&["ferry-extract", "ferry-transform"]);
    let (db, backup) = (p.path("ledger.db"), p.path("backup.db"));
    let out = std::process::Command::new("python3")
        .args(["-c", "import sqlite3, sys; d = sqlite3.connect(sys.argv[2]); sqlite3.connect(sys.argv[1]).backup(d); d.close()"])
        .arg(&db)
        .arg(&backup)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    p.stages_ok(&["ferry-copy", "ferry-load"]);
    p.add_jsonl_batch("c", 1, 300, 43);
    p.stages_ok(&STAGES);
    let published = p.count("SELECT COUNT(*) FROM published");
    // Going back: the stages stopped, the file put back (its WAL with it gone).
    for f in ["ledger.db-wal", "ledger.db-shm"] {
        let _ = std::fs::remove_file(p.path(f));
    }
    std::fs::copy(&backup, &db).unwrap();
    assert!(p.count("SELECT COUNT(*) FROM published") < published, "the backup is from before b and c were published");
    // The chunks the backup has waiting for a copy had their spool files shipped and removed
    // since: they are transformed again (their staged chunks are kept), as the runbook says.
    let node = p.sql("SELECT node FROM tasks WHERE stage = 'copy' AND state <> 'done' LIMIT 1");
    assert!(!node.is_empty(), "b's chunks wait for a copy in the backup");
    let out = p.command("ferry").args(["rerun", "--spool-node", &node, "--from", "transform"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for _ in 0..3 {
        p.stages_ok(&STAGES);
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), 0, "everything done again");
    ferry_tests::assert_same_rows(&p.table_digest(), &ferry_tests::input_digest("jsonl", &p.path("in")), "after going back to the backup");
}
