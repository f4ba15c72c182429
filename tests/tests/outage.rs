//! An outage of the destination is not a chunk failure: the S3 destination (a real server
//! behind the fault proxy) refuses every connection, then hangs every one, for many times what
//! the chunks' attempt budget would last; the copy service stops claiming, probes, records one
//! outage, quarantines nothing, and drains by itself when the store is back. Real processes,
//! real time.

use std::io::{Read, Write};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ferry_tests::clusters::S3Server;
use ferry_tests::proxy::{FaultProxy, Faults};
use ferry_tests::{Pipeline, bin, input_digest, s3_table_digest};

fn sigterm(c: &mut Child) {
    let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
}

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
    let endpoint = format!("https://{}", proxy.addr);
    let dest = format!(
        "[destination]\nurl = \"s3://{}/{prefix}\"\n[destination.store]\ncall_timeout = \"3s\"\nread_stall = \"3s\"\n\
         [destination.store.s3]\n{}connect_timeout = \"1s\"\nrequest_timeout = \"5s\"\nread_timeout = \"2s\"\n\
         max_retries = 1\nretry_timeout = \"3s\"\n",
        s3.bucket,
        s3.store_toml(&endpoint)
    );
    let p = Pipeline::with_stores("64KiB", "30s", "0s", None, Some(dest));
    let mut cfg = std::fs::read_to_string(&p.config).unwrap();
    // Three attempts 100 ms to 1 s apart: without outage handling every chunk would be
    // quarantined within seconds of the outage.
    cfg = cfg.replace("lease = \"30s\"", "lease = \"30s\"\nmax_attempts = 3\noutage_probe_max = \"2s\"");
    cfg.push_str("\n[copy]\ndeadline = \"10s\"\nstall_timeout = \"3s\"\nconcurrency = 4\nhedge_multiple = 0.0\n");
    std::fs::write(&p.config, cfg).unwrap();
    p.generate("in", "jsonl", "null", 3, 1500, 5);
    for s in ["ferry-extract", "ferry-transform"] {
        let out = p.stage(s);
        assert!(out.status.success(), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let chunks = p.count("SELECT COUNT(*) FROM chunks");
    assert!(chunks >= 8, "{chunks} chunks");

    // The destination goes away: every connection reset at once (a closed port)...
    proxy.set(Faults { reset: 1.0, reset_within: 1, ..Faults::default() });
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut copy = p
        .command("ferry-copy")
        .env("RUST_LOG", "info")
        .args(["--watch", "--poll", "200ms", "--metrics-addr", &format!("127.0.0.1:{port}")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read the log as it comes: a full pipe would block the service's logging, and it.
    let mut stderr = copy.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    std::thread::sleep(Duration::from_secs(15));
    // ...then every connection accepted and never answered (no TLS handshake).
    proxy.set(Faults { hang: 1.0, ..Faults::default() });
    std::thread::sleep(Duration::from_secs(10));

    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0, "an outage quarantines nothing");
    assert_eq!(p.count("SELECT COUNT(*) FROM outages"), 1, "one outage row, not one per chunk");
    assert_eq!(p.count("SELECT COUNT(*) FROM open_outages WHERE stage = 'copy' AND store LIKE 'destination s3://%'"), 1);
    let probes = p.count("SELECT probes FROM open_outages");
    assert!(probes >= 3, "probed with backoff: {probes}");
    assert!(p.count("SELECT MAX(attempt) FROM tasks WHERE stage = 'copy'") <= 3, "attempts while down are not counted");
    let m = metrics(port);
    assert!(m.contains("ferry_store_down{stage=\"copy\",store=\"destination\"} 1"), "{m}");
    assert!(m.contains("ferry_store_outages_total{stage=\"copy\",store=\"destination\"} 1"), "{m}");
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
    sigterm(&mut copy);
    let status = copy.wait().unwrap();
    let log = log.join().unwrap();
    assert_eq!(status.code(), Some(0), "{log}");
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
