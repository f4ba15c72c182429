//! Seed 000 as a test: events land continuously (a file every second, 20,000 records each) and
//! flow through all four stages, run as services (`--watch`), to a table on a real S3 server
//! behind TLS. A fault proxy in front of S3 sometimes accepts a connection and never completes
//! the TLS handshake, sometimes trickles bytes, sometimes resets. No transfer waits past its
//! deadline, the backlog stays bounded, and the table ends with every record exactly once.
//!
//! `FERRY_SEED000_SECS` sets how long events land (default 20 s in CI; the long variant is
//! e.g. 180).

use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use ferry_tests::clusters::S3Server;
use ferry_tests::proxy::{FaultProxy, Faults};
use ferry_tests::{Pipeline, STAGES, bin, input_digest, s3_table_digest};

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn sigterm(c: &mut Child) {
    let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
}

#[test]
fn seed_000_events_keep_flowing_through_hung_handshakes() {
    let secs: u64 = std::env::var("FERRY_SEED000_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let rate = 20_000u32;
    let s3 = S3Server::from_env();
    let proxy = FaultProxy::start(s3.addr, 2000);
    let prefix = format!("seed000-{}", now_ms());
    let endpoint = format!("https://{}", proxy.addr);
    let dest = format!("{}part_size = \"5MiB\"\n", s3.destination_toml(&prefix, &endpoint, 2, "12s"));
    let p = Pipeline::with_stores("2MiB", "5s", "0s", None, Some(dest));
    let deadline_s = 30;
    let mut cfg = std::fs::read_to_string(&p.config).unwrap();
    cfg.push_str(&format!("\n[copy]\ndeadline = \"{deadline_s}s\"\nstall_timeout = \"4s\"\nconcurrency = 4\nhedge_min = \"2s\"\n"));
    std::fs::write(&p.config, cfg).unwrap();
    p.raise_attempt_cap(50);
    // Make sure the ledger exists before four services and a monitor open it.
    let m = Command::new(bin("ferry")).args(["--ledger", &p.ledger_url(), "migrate"]).output().unwrap();
    assert!(m.status.success());

    let mut services: Vec<Child> = STAGES.iter().map(|s| p.command(s).args(["--watch", "--poll", "200ms"]).spawn().unwrap()).collect();
    // Connections are pooled and long-lived, so the odds per new connection are high: most
    // of them end in a reset somewhere in their first 4 MB, forcing reconnects, which meet
    // the proxy again.
    proxy.set(Faults { hang: 0.2, trickle: 0.1, reset: 0.5, reset_within: 4 << 20, ..Faults::default() });

    // The monitor: the largest number of chunks not yet published, sampled twice a second.
    let stop = Arc::new(AtomicBool::new(false));
    let max_backlog = Arc::new(AtomicI64::new(0));
    let ledger_db = p.path("ledger.db");
    let monitor = {
        let (stop, max_backlog) = (stop.clone(), max_backlog.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let out = Command::new("python3")
                    .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1], timeout=5); print(c.execute(\"SELECT COUNT(*) FROM tasks WHERE state <> 'done'\").fetchone()[0])"])
                    .arg(&ledger_db)
                    .output();
                if let Ok(o) = out
                    && let Ok(v) = String::from_utf8_lossy(&o.stdout).trim().parse::<i64>()
                {
                    max_backlog.fetch_max(v, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };

    // Landing: a whole file every second (written aside, then renamed in).
    let gen_dir = p.path("gen");
    let start = Instant::now();
    for k in 0..secs {
        let tick = start + Duration::from_secs(k);
        if let Some(w) = tick.checked_duration_since(Instant::now()) {
            std::thread::sleep(w);
        }
        let o = Command::new(bin("ferry"))
            .args(["gen", "--format", "avro", "--codec", "snappy", "--files", "1", "--records", &rate.to_string()])
            .args(["--seed", &(1000 + k).to_string(), "--block-records", "500", "--out"])
            .arg(&gen_dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "gen: {}", String::from_utf8_lossy(&o.stderr));
        let name = format!("events-{}-0000.avro", 1000 + k);
        std::fs::rename(gen_dir.join(&name), p.path("in").join(&name)).unwrap();
    }
    let landed_for = start.elapsed();

    // Let the services drain what landed (the proxy keeps injecting faults meanwhile).
    let drain_start = Instant::now();
    loop {
        // One statement, one snapshot: the services keep writing while we look.
        let drained = p.sql(&format!(
            "SELECT (SELECT COUNT(*) FROM source_files WHERE state = 'chunked') = {secs} \
             AND NOT EXISTS (SELECT 1 FROM source_files WHERE state = 'registered') \
             AND NOT EXISTS (SELECT 1 FROM tasks WHERE state <> 'done')"
        ));
        if drained == "1" {
            break;
        }
        let (pending, files) = (p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), p.count("SELECT COUNT(*) FROM source_files"));
        assert!(
            drain_start.elapsed() < Duration::from_secs(240),
            "not drained after 240 s: {pending} pending, {files} files; proxy: {}",
            proxy.summary()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let drained_after = drain_start.elapsed();
    stop.store(true, Ordering::SeqCst);
    monitor.join().unwrap();
    for c in services.iter_mut() {
        sigterm(c);
    }
    for (c, s) in services.iter_mut().zip(STAGES) {
        let st = c.wait().unwrap();
        assert!(st.success(), "{s} exited {st:?} after SIGTERM");
    }
    proxy.clear();

    // Every record exactly once, read back by pyarrow's own S3 client.
    let want = input_digest("avro", &p.path("in"));
    let got = s3_table_digest(&format!("{}/{prefix}/events", s3.bucket));
    assert_eq!(want["rows"], (secs * rate as u64) as i64);
    assert_eq!(got["rows"], want["rows"], "rows");
    assert_eq!(got["distinct"], want["distinct"], "exactly once");
    assert_eq!(got["digest"], want["digest"], "every field");

    // Landing-to-published latency per file.
    let lat = p.sql(
        "SELECT group_concat(l) FROM (SELECT MAX(p.published_at) - f.mtime_ms AS l FROM source_files f \
         JOIN chunks c ON c.file_id = f.id JOIN published p ON p.chunk_id = c.id GROUP BY f.id ORDER BY l)",
    );
    let mut lat: Vec<i64> = lat.split(',').filter_map(|x| x.parse().ok()).collect();
    lat.sort();
    let pct = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    let chunks = p.count("SELECT COUNT(*) FROM chunks");
    let redone = p.count("SELECT COUNT(DISTINCT chunk_id) FROM attempts WHERE outcome <> 'done'");
    let failed = p.count("SELECT COUNT(*) FROM attempts WHERE outcome <> 'done'");
    let longest = p.count("SELECT MAX(ended_at - started_at) FROM attempts WHERE stage IN ('copy', 'load')");
    let backlog = max_backlog.load(Ordering::SeqCst);
    eprintln!(
        "seed 000: {secs} files x {rate} records landed in {landed_for:?}, drained {drained_after:?} later; {chunks} chunks; \
         landing->published latency p50 {} ms, p99 {} ms; largest backlog {backlog} chunks; \
         {failed} failed attempts on {redone} chunks redone; longest copy/load attempt {longest} ms; proxy: {}",
        pct(0.5),
        pct(0.99),
        proxy.summary()
    );
    assert!(proxy.counters().hangs.load(Ordering::SeqCst) >= 1, "hung handshakes were injected");
    assert!(longest <= (deadline_s + 10) * 1000, "an attempt ran {longest} ms, past its {deadline_s} s deadline");
    // Bounded: never more than ~15 s of landed chunks waiting (chunks arrive at ~chunks/secs per second).
    let per_sec = (chunks as f64 / secs as f64).ceil() as i64;
    assert!(backlog <= per_sec * 15 + 8, "backlog grew to {backlog} chunks ({per_sec} chunks land per second)");
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0);
    p.assert_attempts_within(50);
}

/// Hedged copies: one upload stalls mid-body on its connection (the proxy stops forwarding it);
/// after the hedge delay a second upload on a new connection lands the part, the first is
/// cancelled, and no temp object is left. The attempt itself succeeds: nothing is retried.
#[test]
fn a_stalled_upload_is_overtaken_by_its_hedge() {
    let s3 = S3Server::from_env();
    let proxy = FaultProxy::start(s3.addr, 3000);
    let prefix = format!("hedge-{}", now_ms());
    let endpoint = format!("https://{}", proxy.addr);
    let dest = format!(
        "[destination]\nurl = \"s3://{}/{prefix}\"\n[destination.store.s3]\n{}request_timeout = \"60s\"\nread_timeout = \"60s\"\n",
        s3.bucket,
        s3.store_toml(&endpoint)
    );
    let p = Pipeline::with_stores("8MiB", "30s", "0s", None, Some(dest));
    let mut cfg = std::fs::read_to_string(&p.config).unwrap();
    // No history in a fresh process: 16 MB/s is assumed, so the hedge of a ~3 MB part starts
    // at hedge_min (1 s).
    cfg.push_str("\n[copy]\ndeadline = \"20s\"\nstall_timeout = \"18s\"\nconcurrency = 2\nhedge_min = \"1s\"\n");
    std::fs::write(&p.config, cfg).unwrap();
    p.stage_env("ferry-copy", "RUST_LOG", "info");
    p.generate("in", "avro", "null", 2, 6000, 21);
    for s in ["ferry-extract", "ferry-transform"] {
        assert!(p.stage(s).status.success(), "{s}");
    }
    let chunks = p.count("SELECT COUNT(*) FROM chunks");
    proxy.set(Faults { stall_once_after: Some(1 << 20), ..Faults::default() });
    let t = Instant::now();
    let out = p.stage("ferry-copy");
    let took = t.elapsed();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{log}");
    let hedged = log.matches("starting a hedged upload").count();
    let won = log.matches("the hedged upload won").count();
    eprintln!("hedging: {chunks} chunks copied in {took:?}; {hedged} hedges started, {won} won; proxy: {}", proxy.summary());
    assert_eq!(proxy.counters().hangs.load(Ordering::SeqCst), 1, "one upload was stalled");
    assert!(hedged >= 1 && won >= 1, "the stalled upload was hedged and the hedge won:\n{log}");
    assert!(took < Duration::from_secs(10), "the hedge beat the 20 s deadline by far: {took:?}");
    assert_eq!(p.count("SELECT COUNT(*) FROM attempts WHERE stage = 'copy' AND outcome <> 'done'"), 0, "no attempt failed");
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load'"), chunks, "every chunk copied");
    // The loser's temp object is removed (in the background, right after the win): looked for
    // until it is gone, 30 s at most.
    let t = Instant::now();
    let mut left = s3_keys(&s3, &format!("{prefix}/_ferry/tmp/"));
    while !left.is_empty() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
        left = s3_keys(&s3, &format!("{prefix}/_ferry/tmp/"));
    }
    assert!(left.is_empty(), "temp objects left: {left:?}");
    assert!(p.stage("ferry-load").status.success());
    let got = s3_table_digest(&format!("{}/{prefix}/events", s3.bucket));
    let want = input_digest("avro", &p.path("in"));
    assert_eq!((got["rows"].clone(), got["digest"].clone()), (want["rows"].clone(), want["digest"].clone()));
}

/// Keys under `prefix`, listed by pyarrow's S3 client (not ours).
fn s3_keys(s3: &S3Server, prefix: &str) -> Vec<String> {
    let script = r#"
import os, sys, pyarrow.fs as pfs
e = os.environ
fs = pfs.S3FileSystem(access_key=e["FERRY_TEST_S3_ACCESS_KEY"], secret_key=e["FERRY_TEST_S3_SECRET_KEY"],
    endpoint_override=e["FERRY_TEST_S3_ENDPOINT"].split("//")[1], scheme="https", region="us-east-1",
    tls_ca_file_path=e["FERRY_TEST_S3_CA"])
try:
    for f in fs.get_file_info(pfs.FileSelector(sys.argv[1], recursive=True)):
        if f.type == pfs.FileType.File:
            print(f.path)
except FileNotFoundError:
    pass
"#;
    let out = Command::new("python3").args(["-c", script, &format!("{}/{prefix}", s3.bucket)]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// Source and staging on S3 too: extract lists and reads the source bucket, stages chunks on
/// S3, transform reads them back; `delete` disposition removes each source object only after
/// its chunks are in the ledger.
#[test]
fn s3_source_and_staging_with_delete_disposition() {
    s3_source_and_staging("delete");
}

/// The same with `archive` to a local directory: each object is streamed there (through a temp
/// file, never in memory) before it goes from the bucket, and the archive holds its bytes.
#[test]
fn s3_source_and_staging_with_archive_disposition() {
    s3_source_and_staging("archive");
}

fn s3_source_and_staging(disposition: &str) {
    let s3 = S3Server::from_env();
    // Both dispositions run at once, often within the same millisecond: the prefix names the
    // disposition too, or the two pipelines would share one landing and take each other's files.
    let prefix = format!("srcstg-{disposition}-{}", now_ms());
    let store_toml = s3.store_toml(&s3.endpoint);
    let staging = format!("[staging]\nurl = \"s3://{}/{prefix}/staging\"\n[staging.store.s3]\n{store_toml}", s3.bucket);
    let p = Pipeline::with_stores("64KiB", "30s", "0s", Some(staging), None);
    // Point the source at S3 as well, with the same settings.
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    let local_in = format!("url = \"{}/in\"", p.path("").display().to_string().trim_end_matches('/'));
    assert!(cfg.contains(&local_in), "{cfg}");
    let cfg = cfg.replace(
        &local_in,
        &format!(
            "url = \"s3://{}/{prefix}/landing\"\ndisposition = \"{disposition}\"\narchive_url = \"{}\"\n[source.store.s3]\n{store_toml}",
            s3.bucket,
            p.path("archive").display()
        ),
    );
    // The [source] table's later keys (settle) must stay in [source]: move them above the subtable.
    let cfg = cfg.replace("[source.store.s3]", "settle = \"0s\"\n[source.store.s3]").replacen("\nsettle = \"0s\"\n\n", "\n\n", 1);
    std::fs::write(&p.config, &cfg).unwrap();
    p.generate("in", "avro", "snappy", 3, 2000, 31);
    // Upload the inputs with Ferry's own S3 store (the reader under test is extract).
    let o = s3.store_options(&s3.endpoint);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let landing = ferry_storage::Store::open(&format!("s3://{}/{prefix}/landing", s3.bucket), &o).unwrap();
    for e in std::fs::read_dir(p.path("in")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        rt.block_on(landing.put_atomic(&name, std::fs::read(e.path()).unwrap())).unwrap();
    }
    for s in STAGES {
        let o = p.stage(s);
        assert!(o.status.success(), "{s}: {}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(p.count("SELECT COUNT(*) FROM chunks") > 3);
    assert!(p.sql("SELECT MIN(location) FROM chunks").starts_with("s3://"), "chunks staged on S3");
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), 0);
    let want = input_digest("avro", &p.path("in"));
    let got = p.table_digest();
    assert_eq!((got["rows"].clone(), got["digest"].clone()), (want["rows"].clone(), want["digest"].clone()));
    let left = rt.block_on(landing.list("")).unwrap();
    assert!(left.is_empty(), "{disposition} disposition removed the source objects: {left:?}");
    if disposition == "archive" {
        let mut archived = 0;
        for e in std::fs::read_dir(p.path("in")).unwrap().flatten() {
            let kept = std::fs::read(p.path("archive").join(e.file_name())).unwrap();
            assert!(kept == std::fs::read(e.path()).unwrap(), "{:?} archived whole", e.file_name());
            archived += 1;
        }
        assert_eq!(archived, 3);
        let temps: Vec<_> =
            std::fs::read_dir(p.path("archive")).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with('.')).collect();
        assert!(temps.is_empty(), "no temp file left in the archive: {temps:?}");
    }
}
