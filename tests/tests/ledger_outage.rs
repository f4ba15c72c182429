//! The ledger heals too: a Postgres ledger restarted (fast and immediate) and then down for a
//! minute never ends a `--watch` service, and the table is exactly once when it is back; a
//! stage paused past its lease (SIGSTOP) answers SIGTERM within its grace period; the Postgres
//! ledger over TLS verifies the server. Real processes, real servers, real time.

use std::process::Command;
use std::time::{Duration, Instant};

use ferry_tests::postgres::Postgres;
use ferry_tests::{Pipeline, STAGES, bin, input_digest, wait_until};

/// Every chunk of every registered file published, nothing waiting.
fn drained(pg: &Postgres, files: i64) -> bool {
    pg.count("SELECT COUNT(*) FROM source_files WHERE state <> 'registered'") == files
        && pg.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'") == 0
        && pg.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load'") == pg.count("SELECT COUNT(*) FROM chunks")
}

#[test]
fn a_postgres_ledger_restart_and_a_minute_down_end_no_service() {
    let pg = Postgres::start(false);
    let p = Pipeline::new("32KiB", "6s", "0s");
    p.use_ledger(&pg.url());
    p.add_jsonl_batch("a", 3, 1500, 21);
    let out = Command::new(bin("ferry")).args(["migrate", "--config"]).arg(&p.config).output().unwrap();
    assert!(out.status.success(), "migrate: {}", String::from_utf8_lossy(&out.stderr));
    let mut services: Vec<_> = STAGES.iter().map(|s| p.watch(s, &[])).collect();
    wait_until("the first batch published", Duration::from_secs(120), || drained(&pg, 3));

    // Restarts while work flows: sessions told (fast), then a crash (immediate).
    p.add_jsonl_batch("b", 3, 1500, 22);
    std::thread::sleep(Duration::from_millis(700));
    pg.restart("fast");
    std::thread::sleep(Duration::from_secs(2));
    p.add_jsonl_batch("c", 3, 1500, 23);
    std::thread::sleep(Duration::from_millis(500));
    pg.restart("immediate");
    wait_until("the batches after the restarts published", Duration::from_secs(180), || drained(&pg, 9));

    // Down for a minute, with new files landing meanwhile.
    p.add_jsonl_batch("d", 2, 1500, 24);
    std::thread::sleep(Duration::from_millis(300));
    pg.stop("fast");
    let down = Instant::now();
    p.add_jsonl_batch("e", 2, 1500, 25);
    while down.elapsed() < Duration::from_secs(60) {
        for s in services.iter_mut() {
            assert!(s.running(), "{} ended while the ledger was down", s.name);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    pg.start_again();
    wait_until("everything published after the ledger came back", Duration::from_secs(240), || drained(&pg, 13));

    let mut logs = String::new();
    for s in services.drain(..) {
        let name = s.name.clone();
        let (code, secs, log) = s.stop();
        assert_eq!(code, Some(0), "{name} after the outages:\n{log}");
        assert!(secs < 35.0, "{name} took {secs:.1}s to stop");
        logs += &log;
    }
    assert_eq!(pg.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0, "the outages quarantined nothing");
    // The minute-long outage is recorded once per stage that waited it out.
    for stage in ["transform", "copy", "load"] {
        let n = pg.count(&format!(
            "SELECT COUNT(*) FROM outages WHERE store = 'ledger' AND stage = '{stage}' AND ended_at - started_at >= 45000"
        ));
        let rows = pg.sql("SELECT store, stage, started_at, ended_at, probes FROM outages ORDER BY id");
        let said: Vec<&str> = logs.lines().filter(|l| l.contains("ledger")).collect();
        assert_eq!(n, 1, "{stage}: one row for the minute the ledger was down:\n{rows}\n{}", said.join("\n"));
    }
    assert!(logs.contains("ledger unreachable") && logs.contains("ledger is back"), "logged as an outage");
    let want = input_digest("jsonl", &p.path("in"));
    let got = p.table_digest();
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}: every record published exactly once");
    }
    assert_eq!(got["rows"], 13 * 1500);
}

/// On Postgres: a paused SQLite writer would hold the database's one write lock while it
/// sleeps, which is why several hosts (and zombies) need the Postgres ledger.
#[test]
fn a_stage_paused_past_its_lease_answers_sigterm_within_its_grace() {
    let pg = Postgres::start(false);
    let p = Pipeline::new("8KiB", "2s", "0s");
    p.use_ledger(&pg.url());
    p.add_jsonl_batch("a", 4, 3000, 31);
    for s in ["ferry-extract", "ferry-transform"] {
        let out = p.stage(s);
        assert!(out.status.success(), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let chunks = pg.count("SELECT COUNT(*) FROM chunks");
    assert!(chunks >= 40, "{chunks} chunks");
    for round in 0..4 {
        // Past its start checks first: the freeze is meant to catch it at work.
        let copy = p.watch_started("ferry-copy", &["--grace", "3s", "--concurrency", "2"]);
        std::thread::sleep(Duration::from_millis(150 + 100 * round));
        let pid = copy.child.id().to_string();
        // A VM freeze: stopped well past the lease, so its chunks are taken over...
        Command::new("kill").args(["-STOP", &pid]).status().unwrap();
        let other = p.stage("ferry-copy");
        assert!(other.status.code().is_some_and(|c| c == 0 || c == 3), "{}", String::from_utf8_lossy(&other.stderr));
        std::thread::sleep(Duration::from_secs(3));
        // ...then it wakes and is told to stop at once.
        Command::new("kill").args(["-CONT", &pid]).status().unwrap();
        let (code, secs, log) = copy.stop();
        assert_eq!(code, Some(0), "round {round}:\n{log}");
        assert!(secs < 3.0 + 4.0, "round {round}: SIGTERM answered in {secs:.1}s, over the 3 s grace:\n{log}");
        assert!(!log.contains("quarantined;"), "a zombie quarantines nothing:\n{log}");
    }
    for _ in 0..5 {
        for s in STAGES {
            p.stage(s);
        }
        if drained(&pg, 4) {
            break;
        }
    }
    assert!(drained(&pg, 4));
    let want = input_digest("jsonl", &p.path("in"));
    let got = p.table_digest();
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}");
    }
}

#[test]
fn a_postgres_ledger_over_tls_verifies_the_server() {
    let pg = Postgres::start(true);
    let ca = pg.ca.clone().unwrap();
    let migrate = |url: &str| Command::new(bin("ferry")).args(["--ledger", url, "migrate"]).output().unwrap();
    let plain = migrate(&format!("{}?sslmode=disable", pg.url()));
    assert!(!plain.status.success(), "the server takes TLS only");
    // Verified against the system's roots, which did not sign this server: refused.
    let unknown = migrate(&format!("{}?sslmode=verify-full", pg.url()));
    assert!(!unknown.status.success(), "an unknown CA is refused");
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(err.contains("ledger") && !err.contains("panicked"), "{err}");

    let url = format!("{}?sslmode=verify-full&sslrootcert={}", pg.url(), ca.display());
    let ok = migrate(&url);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert_eq!(pg.count("SELECT COUNT(*) FROM pg_stat_ssl WHERE ssl"), pg.count("SELECT COUNT(*) FROM pg_stat_ssl"));

    let p = Pipeline::new("64KiB", "30s", "0s");
    p.use_ledger(&url);
    p.add_jsonl_batch("a", 2, 1000, 41);
    for s in STAGES {
        let out = p.stage(s);
        assert_eq!(out.status.code(), Some(0), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(pg.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state = 'done'"), pg.count("SELECT COUNT(*) FROM chunks"));
    ferry_tests::assert_same_rows(&p.table_digest(), &ferry_tests::input_digest("jsonl", &p.path("in")), "the table over TLS");
}
