//! An outage of the destination is not a chunk failure: the S3 destination (a real server
//! behind the fault proxy) refuses every connection, then hangs every one, for many times what
//! the chunks' attempt budget would last; the copy service stops claiming, probes, records one
//! outage, quarantines nothing, and drains by itself when the store is back. Real processes,
//! real time.

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_tests::clusters::S3Server;
use ferry_tests::proxy::{FaultProxy, Faults};
use ferry_tests::{Pipeline, bin, input_digest, s3_table_digest, wait_until};

fn metrics(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn a_destination_outage_quarantines_nothing_and_heals_by_itself() {
    let s3 = S3Server::from_env();
    let proxy = FaultProxy::start(s3.addr, 11);
    let prefix = format!("outage-{}", std::process::id());
    let p = Pipeline::with_stores("64KiB", "30s", "0s", None, Some(s3_section("destination", &s3, &proxy, &prefix)));
    let mut cfg = std::fs::read_to_string(&p.config).unwrap();
    // Three attempts 100 ms to 1 s apart: without outage handling every chunk would be
    // quarantined within seconds of the outage.
    cfg = cfg.replace("lease = \"30s\"", "lease = \"30s\"\nmax_attempts = 3\noutage_probe_max = \"2s\"");
    cfg.push_str("\n[copy]\ndeadline = \"10s\"\nstall_timeout = \"3s\"\nconcurrency = 4\nhedge_multiple = 0.0\n");
    std::fs::write(&p.config, cfg).unwrap();

    // Copy starts while the destination answers (one that does not answer at start is waited
    // for at start, another rule), with nothing to do yet.
    let copy = p.watch_started("ferry-copy", &[]);
    let port = copy.metrics_port.unwrap();

    // The destination goes away: every connection reset at once (a closed port)...
    proxy.set(Faults { reset: 1.0, reset_within: 1, ..Faults::default() });
    proxy.cut_all();
    // ...while chunks arrive for copy.
    p.generate("in", "jsonl", "null", 3, 1500, 5);
    p.stages_ok(&["ferry-extract", "ferry-transform"]);
    let chunks = p.count("SELECT COUNT(*) FROM chunks");
    assert!(chunks >= 8, "{chunks} chunks");
    // The resets last until copy has found the store down and probed it five times (with
    // probes 0.5 s doubling to 2 s apart, several times the chunks' attempt budget)...
    let probes = || p.count("SELECT COALESCE(MAX(probes), 0) FROM open_outages");
    wait_until("copy finds the destination down and probes it", Duration::from_secs(120), || probes() >= 5);
    // ...then every connection is accepted and never answered (no TLS handshake), for three
    // more probes.
    proxy.set(Faults { hang: 1.0, ..Faults::default() });
    let before = probes();
    wait_until("copy probes the hung destination", Duration::from_secs(120), || probes() >= before + 3);

    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0, "an outage quarantines nothing");
    assert_eq!(p.count("SELECT COUNT(*) FROM outages"), 1, "one outage row, not one per chunk");
    assert_eq!(p.count("SELECT COUNT(*) FROM open_outages WHERE stage = 'copy' AND store LIKE 'destination s3://%'"), 1);
    assert!(p.count("SELECT MAX(attempt) FROM tasks WHERE stage = 'copy'") <= 3, "attempts while down are not counted");
    let m = metrics(port);
    assert!(m.contains("ferry_store_down{pipeline=\"default\",stage=\"copy\",store=\"destination\"} 1"), "{m}");
    assert!(m.contains("ferry_store_outages_total{pipeline=\"default\",stage=\"copy\",store=\"destination\"} 1"), "{m}");
    let check = Command::new(bin("ferry")).args(["--ledger", &p.ledger_url(), "status", "--check"]).output().unwrap();
    let line = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{line}");
    assert!(line.contains("destination s3://") && line.contains("down for copy"), "{line}");
    let json = Command::new(bin("ferry")).args(["--ledger", &p.ledger_url(), "status", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["outages"].as_array().map(|a| a.len()), Some(1), "{v}");

    // The store comes back: everything drains with no operator action.
    let healed = Instant::now();
    proxy.clear();
    loop {
        if p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND state = 'done'") == chunks {
            break;
        }
        assert!(healed.elapsed() < Duration::from_secs(60), "copy did not drain after the outage");
        std::thread::sleep(Duration::from_millis(300));
    }
    eprintln!("drained {:.1}s after the store came back ({})", healed.elapsed().as_secs_f64(), proxy.summary());
    assert_eq!(p.count("SELECT COUNT(*) FROM open_outages"), 0, "the outage is closed");
    assert_eq!(p.count("SELECT COUNT(*) FROM outages WHERE ended_at IS NOT NULL"), 1);
    let (code, _, log) = copy.stop();
    assert_eq!(code, Some(0), "{log}");
    let down = log.lines().find(|l| l.contains("store is down")).unwrap_or_else(|| panic!("{log}"));
    assert!(down.contains("ERROR"), "an outage starts at ERROR: {down}");
    let back = log.lines().find(|l| l.contains("store is back")).unwrap_or_else(|| panic!("{log}"));
    assert!(back.contains("INFO"), "and ends at INFO: {back}");

    let out = p.stage("ferry-load");
    assert!(out.status.success(), "load: {}", String::from_utf8_lossy(&out.stderr));
    let want = input_digest("jsonl", &p.path("in"));
    let got = s3_table_digest(&format!("{}/{prefix}/events", s3.bucket));
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}: every record published exactly once after the outage");
    }
    assert_eq!(got["rows"], 4500);
}

/// `[<section>]` on the S3 test server behind `proxy`, with short deadlines.
fn s3_section(section: &str, s3: &S3Server, proxy: &FaultProxy, prefix: &str) -> String {
    format!(
        "[{section}]\nurl = \"s3://{}/{prefix}\"\n[{section}.store]\ncall_timeout = \"3s\"\nread_stall = \"3s\"\n\
         [{section}.store.s3]\n{}connect_timeout = \"1s\"\nrequest_timeout = \"5s\"\nread_timeout = \"2s\"\n\
         max_retries = 1\nretry_timeout = \"3s\"\n",
        s3.bucket,
        s3.store_toml(&format!("https://{}", proxy.addr))
    )
}

fn short_budget(p: &Pipeline) {
    let mut cfg = std::fs::read_to_string(&p.config).unwrap();
    cfg = cfg.replace("lease = \"30s\"", "lease = \"30s\"\nmax_attempts = 3\noutage_probe_max = \"5s\"");
    cfg.push_str("\n[copy]\ndeadline = \"10s\"\nstall_timeout = \"3s\"\nconcurrency = 4\nhedge_multiple = 0.0\n");
    std::fs::write(&p.config, cfg).unwrap();
}

/// The acceptance run: all four stages as `--watch` services, the destination gone for ten
/// minutes (connections refused, then connections that hang) while new files keep landing;
/// nothing is quarantined and everything is published exactly once after it comes back.
/// `FERRY_TEST_OUTAGE_SECS` shortens the outage for a quick local run.
#[test]
fn a_ten_minute_destination_outage_under_four_watch_services() {
    let secs: u64 = std::env::var("FERRY_TEST_OUTAGE_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
    let s3 = S3Server::from_env();
    let proxy = FaultProxy::start(s3.addr, 12);
    let prefix = format!("outage10-{}", std::process::id());
    let p = Pipeline::with_stores("32KiB", "30s", "0s", None, Some(s3_section("destination", &s3, &proxy, &prefix)));
    short_budget(&p);
    p.add_jsonl_batch("a", 2, 1000, 51);
    let mut services: Vec<_> = ferry_tests::STAGES.iter().map(|s| p.watch(s, &[])).collect();
    wait_until("the first batch published", Duration::from_secs(120), || p.drained(2));

    let t0 = Instant::now();
    proxy.set(Faults { reset: 1.0, reset_within: 1, ..Faults::default() });
    proxy.cut_all(); // the kept-alive connections of the first batch go too
    let mut batch = 0;
    while t0.elapsed() < Duration::from_secs(secs) {
        if t0.elapsed() >= Duration::from_secs(secs / 2) && batch < 100 {
            proxy.set(Faults { hang: 1.0, ..Faults::default() });
            batch = 100;
        }
        // A file lands every so often, as in a landing zone.
        if t0.elapsed() >= Duration::from_secs((batch % 100) as u64 * secs / 4) && batch % 100 < 4 {
            p.add_jsonl_batch(&format!("o{batch}"), 1, 800, 60 + batch as u64);
            batch += 1;
        }
        for s in services.iter_mut() {
            assert!(s.running(), "{} ended during the outage", s.name);
        }
        assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0, "the outage quarantined a chunk");
        std::thread::sleep(Duration::from_secs(2));
    }
    let files = p.count("SELECT COUNT(*) FROM source_files");
    assert!(files >= 5, "files kept landing: {files}");
    if p.count("SELECT COUNT(*) FROM open_outages WHERE stage = 'copy' AND store LIKE 'destination %'") != 1 {
        let rows =
            p.sql("SELECT group_concat(store || ' ' || stage || ' ' || started_at || '-' || COALESCE(ended_at, 0), '; ') FROM outages");
        let logs: Vec<String> = services.drain(..).map(|s| s.stop().2).collect();
        let said: Vec<&str> = logs.iter().flat_map(|l| l.lines()).filter(|l| l.contains("store") || l.contains("ERROR")).collect();
        panic!("copy did not find the destination down: outages {rows}\n{}", said.join("\n"));
    }
    let healed = Instant::now();
    proxy.clear();
    wait_until("everything published after the outage", Duration::from_secs(300), || p.drained(files));
    eprintln!("drained {:.1}s after the destination came back ({})", healed.elapsed().as_secs_f64(), proxy.summary());
    for s in services.drain(..) {
        let name = s.name.clone();
        let (code, _, log) = s.stop();
        assert_eq!(code, Some(0), "{name}:\n{log}");
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0);
    assert_eq!(p.count("SELECT COUNT(*) FROM open_outages"), 0, "every outage closed");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM outages WHERE stage = 'copy' AND store LIKE 'destination %'"),
        1,
        "one outage row for the copy stage's destination, not one per chunk or probe"
    );
    eprintln!(
        "redone: {} attempts, {} bytes",
        p.sql("SELECT COALESCE(SUM(attempts), 0) FROM redone_work"),
        p.sql("SELECT COALESCE(SUM(bytes), 0) FROM redone_work")
    );
    let want = input_digest("jsonl", &p.path("in"));
    let got = s3_table_digest(&format!("{}/{prefix}/events", s3.bucket));
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}: every record published exactly once after the outage");
    }
}

/// Staging (S3 behind the proxy) goes away while extract and transform work on it: extract
/// keeps retrying its files, transform records the outage, nothing is quarantined, and
/// everything flows when it is back.
#[test]
fn staging_unreachable_heals_by_itself() {
    let s3 = S3Server::from_env();
    let proxy = FaultProxy::start(s3.addr, 13);
    let prefix = format!("staging-out-{}", std::process::id());
    let p = Pipeline::with_stores("16KiB", "30s", "0s", Some(s3_section("staging", &s3, &proxy, &prefix)), None);
    short_budget(&p);
    // The services start while staging answers (one that does not answer at start is waited
    // for at start, another rule). Transform is paused while extract stages a first batch, so
    // that it has chunks to meet the outage with.
    let mut services: Vec<_> = ferry_tests::STAGES.iter().map(|s| p.watch_started(s, &[])).collect();
    services[1].signal("-STOP");
    p.add_jsonl_batch("a", 3, 1000, 71);
    wait_until("the first batch staged", Duration::from_secs(60), || {
        p.count("SELECT COUNT(*) FROM source_files WHERE state = 'chunked'") == 3
    });

    proxy.set(Faults { reset: 1.0, reset_within: 1, ..Faults::default() });
    proxy.cut_all();
    services[1].signal("-CONT");
    p.add_jsonl_batch("b", 2, 1000, 72);
    // Resets until transform has found staging down and probed it three times and extract has
    // met the outage with the new files; then hung connections for three more probes.
    let probes = || p.count("SELECT COALESCE(MAX(probes), 0) FROM open_outages WHERE stage = 'transform' AND store LIKE 'staging %'");
    wait_until("transform finds staging down and probes it", Duration::from_secs(120), || probes() >= 3);
    // Extract keeps no outage record: its log names each file it could not stage yet.
    wait_until("extract meets the outage with the new files", Duration::from_secs(120), || {
        services[0].log_so_far().matches("cannot extract now; will retry").count() >= 2
    });
    proxy.set(Faults { hang: 1.0, ..Faults::default() });
    let before = probes();
    wait_until("transform probes hung staging", Duration::from_secs(120), || probes() >= before + 3);
    for s in services.iter_mut() {
        assert!(s.running(), "{} ended while staging was down", s.name);
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0);
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'quarantined'"), 0);
    assert_eq!(p.count("SELECT COUNT(*) FROM open_outages WHERE stage = 'transform' AND store LIKE 'staging %'"), 1);
    // --once meanwhile: no progress, and it says so with its own exit code.
    let once = p.stage("ferry-transform");
    assert_eq!(once.status.code(), Some(4), "{}", String::from_utf8_lossy(&once.stderr));
    assert!(String::from_utf8_lossy(&once.stderr).contains("no progress"), "{}", String::from_utf8_lossy(&once.stderr));

    proxy.clear();
    wait_until("everything published after staging came back", Duration::from_secs(240), || p.drained(5));
    for s in services.drain(..) {
        let name = s.name.clone();
        let (code, _, log) = s.stop();
        assert_eq!(code, Some(0), "{name}:\n{log}");
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM outages WHERE stage = 'transform' AND store LIKE 'staging %'"), 1);
    let want = input_digest("jsonl", &p.path("in"));
    let got = p.table_digest();
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}");
    }
}

/// Under cron (`--once` runs), one lone chunk meets a destination outage: each run finds the
/// store down by the store's own probe, so the chunk's attempts are not spent however many
/// runs the outage lasts (a breaker that waits for failures of two chunks never trips on
/// one). The outage record the exited runs leave open is closed by the first run of any stage
/// that finds the store answering, even one with nothing to do.
#[test]
fn a_lone_chunk_under_once_runs_outlives_an_outage_and_its_record_closes() {
    let s3 = S3Server::from_env();
    let proxy = FaultProxy::start(s3.addr, 21);
    let prefix = format!("lone-{}", std::process::id());
    let p = Pipeline::with_stores("1MiB", "30s", "0s", None, Some(s3_section("destination", &s3, &proxy, &prefix)));
    short_budget(&p);
    p.add_jsonl_batch("lone", 1, 200, 5);
    p.stages_ok(&["ferry-extract", "ferry-transform"]);
    assert_eq!(p.count("SELECT COUNT(*) FROM chunks"), 1, "one lone chunk");
    // Every connection to S3 is reset at its first byte.
    proxy.set(Faults { reset: 1.0, reset_within: 1, ..Faults::default() });
    proxy.cut_all();
    for run in 0..5 {
        // As cron does: the next run comes after the chunk's retry is due (a second or two).
        wait_until("the chunk's retry is due", Duration::from_secs(60), || {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
            p.count(&format!("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND scheduled_at <= {now}")) == 1
        });
        let out = p.stage("ferry-copy");
        let log = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(4), "run {run}: no progress while the destination is down: {log}");
        assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0, "run {run}: nothing quarantined: {log}");
    }
    assert!(p.count("SELECT attempt FROM tasks WHERE stage = 'copy'") < 3, "the outage's failures are not the chunk's");
    assert_eq!(p.count("SELECT COUNT(*) FROM open_outages"), 1, "one outage recorded, open");
    proxy.clear();
    // Load has nothing to do yet; it finds the destination answering and closes the record.
    let out = p.stage("ferry-load");
    assert!(out.status.success(), "load: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(p.count("SELECT COUNT(*) FROM open_outages"), 0, "closed by a run that saw the store work");
    // The chunk's retry comes due a probe interval after the last failed run (up to 2 s): a
    // cron run before that finds nothing due yet, as it should.
    wait_until("the chunk copied and loaded", Duration::from_secs(60), || {
        for s in ["ferry-copy", "ferry-load"] {
            let out = p.stage(s);
            assert!(out.status.success(), "{s}: {}", String::from_utf8_lossy(&out.stderr));
        }
        p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state = 'done'") == 1
    });
    let got = s3_table_digest(&format!("{}/{prefix}/events", s3.bucket));
    let want = input_digest("jsonl", &p.path("in"));
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}");
    }
}
