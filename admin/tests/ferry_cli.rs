//! The `ferry` admin binary against both databases, through its real interface.

#[path = "../../ledger/tests/support/mod.rs"]
mod support;

use std::process::Command;

use support::{Db, TestDb};

fn ferry(ledger: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry")).arg("--ledger").arg(ledger).args(args).env_remove("FERRY_LEDGER").output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

async fn migrate_status_requeue(db: Db) {
    let t = TestDb::new(db).await;
    let (code, out, err) = ferry(&t.url, &["migrate"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("migrated"), "{out}");
    let (code, out, err) = ferry(&t.url, &["migrate"]);
    assert_eq!(code, 0, "second migrate: {out}{err}");
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks").await, 0);
    t.try_execute(
        "INSERT INTO source_files (uri, size, mtime_ms, content_hash, format, state, registered_at)
         VALUES ('file:///x', 1, 1, 'h', 'csv', 'chunked', 1)",
    )
    .await
    .unwrap();
    t.try_execute(
        "INSERT INTO chunks (id, file_id, seq, range_kind, range_start, range_end, bytes, content_hash, location, created_at)
         VALUES ('c1', 1, 0, 'bytes', 0, 1, 1, 'h', 'file:///s', 1)",
    )
    .await
    .unwrap();
    t.try_execute(
        "INSERT INTO tasks (chunk_id, stage, state, max_attempts, scheduled_at, created_at, finalized_at, last_error, last_error_class)
         VALUES ('c1', 'copy', 'quarantined', 3, 1, 1, 1, 'reset', 'transient')",
    )
    .await
    .unwrap();
    let (code, out, _) = ferry(&t.url, &["status"]);
    assert_eq!(code, 3, "something is quarantined: {out}");
    assert!(out.contains("copy") && out.contains("quarantined"), "{out}");
    assert!(out.contains("1 chunked"), "{out}");
    let (code, out, _) = ferry(&t.url, &["status", "--json"]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let copy = v["stages"].as_array().unwrap().iter().find(|s| s["stage"] == "copy").unwrap().clone();
    assert_eq!(copy["tasks"]["quarantined"]["chunks"], 1, "{v}");
    assert_eq!(v["files"]["chunked"], 1, "{v}");
    assert_eq!(v["quarantined"][0]["reason"], "reset", "{v}");
    let (code, out, _) = ferry(&t.url, &["status", "--check"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.starts_with("FERRY CRITICAL - 1 copy chunk(s) quarantined"), "{out}");
    let (code, out, _) = ferry(&t.url, &["requeue", "--stage", "copy"]);
    assert_eq!(code, 0);
    assert!(out.contains("requeued 1"), "{out}");
    assert_eq!(t.scalar("SELECT COUNT(*) FROM tasks WHERE state = 'available' AND attempt = 0").await, 1);
    let (code, out, _) = ferry(&t.url, &["status", "--check"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("FERRY OK"), "{out}");
    // Due for longer than --max-age: a warning.
    let (code, out, _) = ferry(&t.url, &["status", "--check", "--max-age", "0s"]);
    assert!(code == 1 && out.starts_with("FERRY WARNING - copy work due for"), "{code} {out}");
}

#[test]
fn read_commands_never_create_a_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("typo.db");
    let url = format!("sqlite://{}", db.display());
    for args in [&["status"][..], &["requeue"][..]] {
        let (code, _, err) = ferry(&url, args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("does not exist") && err.contains("ferry migrate"), "{err}");
        assert!(!db.exists(), "{args:?} created {}", db.display());
    }
    let (code, out, _) = ferry(&url, &["status", "--check"]);
    assert_eq!(code, 3, "Nagios UNKNOWN: {out}");
    assert!(out.starts_with("FERRY UNKNOWN"), "{out}");
    let (code, _, _) = ferry(&url, &["migrate"]);
    assert_eq!(code, 0);
    assert_eq!(ferry(&url, &["status"]).0, 0);
}

#[tokio::test]
async fn sqlite_migrate_status_requeue() {
    migrate_status_requeue(Db::Sqlite).await;
}

#[tokio::test]
async fn postgres_migrate_status_requeue() {
    migrate_status_requeue(Db::Postgres).await;
}

#[test]
fn bad_ledger_url_is_a_config_error() {
    let (code, _, err) = ferry("mysql://nope", &["status"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("mysql://nope") && err.contains("sqlite://"), "{err}");
    let (code, _, err) = ferry("sqlite://x.db", &["requeue", "--stage", "copyy"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("copyy"), "{err}");
}

#[test]
fn stages_starting_together_on_a_new_ledger_all_migrate_it() {
    // cron starts the four stages in the same minute on a new host: four processes create
    // and migrate one new SQLite ledger at once.
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/new/ledger.db", dir.path().display());
        let children: Vec<_> = (0..4)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_ferry"))
                    .args(["--ledger", &url, "migrate"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}
