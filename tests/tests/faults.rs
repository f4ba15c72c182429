//! A fault on one connection costs one retry, never a chunk attempt, a stall or a stray file.
//! Checked over many seeds through the fault proxy, with copy and load both talking to the
//! destination through it:
//!
//! - S3 (versitygw over TLS): 10% of new connections hung (accepted, never answered), 5% reset
//!   at any byte of either direction, 5% trickling; and separately 30% trickling.
//! - HDFS (MiniDFS): resets and swallowed replies (the server acts, the answer never comes) on
//!   the NameNode's `complete`, `create`, `addBlock` and `rename2`.
//!
//! Every run ends with the table exactly once, nothing quarantined, the redone bytes recorded in
//! the ledger within one chunk per injected fault (and not zero when an attempt failed after
//! sending), no temp file or multipart upload left without gc, and copy's wall time within a
//! call timeout per fault met. `FERRY_FAULT_SEEDS` sets the seeds per profile (default 10).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ferry_tests::clusters::{MiniDfs, S3Server};
use ferry_tests::proxy::{FaultProxy, Faults};
use ferry_tests::{Pipeline, input_digest, s3_table_digest, table_digest};

/// Seeds per test: `FERRY_FAULT_SEEDS`, or `default` (what fits the suite's time).
fn seeds(default: u64) -> u64 {
    std::env::var("FERRY_FAULT_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn ok(o: &std::process::Output, what: &str) {
    assert!(o.status.success(), "{what} exited {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr));
}

/// What one seed's run did.
#[derive(Debug, Default)]
struct Run {
    faults: u64,
    copy_secs: f64,
    redone: i64,
    max_chunk: i64,
    part_retries: usize,
    hedges: usize,
    failed_attempts: i64,
    failed_with_bytes: i64,
}

/// Extract and transform without faults (they never touch the destination), then copy and load
/// with `--once`, round after round as cron would, with the proxy injecting `faults`.
fn run_seed(p: &Pipeline, proxy: &FaultProxy, faults: Faults, seed: u64) -> Run {
    p.generate("in", "jsonl", "null", 3, 6000, 100 + seed);
    ok(&p.stage("ferry-extract"), "extract");
    ok(&p.stage("ferry-transform"), "transform");
    proxy.set(faults);
    // Info, to count the hedges started (a hedge that loses is redone work no fault caused).
    p.stage_env("ferry-copy", "RUST_LOG", "info");
    let mut run = Run::default();
    let mut logs = String::new();
    // Rounds until every task is done, for as long as a store found down may make them wait
    // (a `--once` run leaves its chunks due at the breaker's next probe, which grows 1, 2,
    // 4 ... s with each failed probe). A fixed forty rounds once ended before such a wait did.
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        let t = Instant::now();
        let o = p.stage_round("ferry-copy");
        run.copy_secs += t.elapsed().as_secs_f64();
        logs.push_str(&String::from_utf8_lossy(&o.stderr));
        let o = p.stage_round("ferry-load");
        logs.push_str(&String::from_utf8_lossy(&o.stderr));
        if p.count("SELECT COUNT(*) FROM tasks WHERE state IN ('available','running','retryable')") == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    proxy.clear();
    run.faults = proxy.injected();
    run.part_retries = logs.matches("part copy failed; sending it again").count();
    run.hedges = logs.matches("starting a hedged upload").count();
    for l in logs.lines().filter(|l| l.contains("part copy failed")) {
        eprintln!("seed {seed}: {l}");
    }
    run.redone = p.count("SELECT COALESCE(SUM(redone_bytes), 0) FROM attempts");
    run.max_chunk = p.count("SELECT MAX(b) FROM (SELECT SUM(bytes) AS b FROM parts GROUP BY chunk_id)");
    run.failed_attempts = p.count("SELECT COUNT(*) FROM attempts WHERE outcome <> 'done'");
    run.failed_with_bytes = p.count("SELECT COUNT(*) FROM attempts WHERE outcome <> 'done' AND bytes > 0");
    if run.failed_attempts > 0 {
        eprintln!("seed {seed}: failed attempts:\n{}", p.sql("SELECT group_concat(stage || ' ' || outcome || ': ' || COALESCE(error, ''), char(10)) FROM attempts WHERE outcome <> 'done'"));
    }
    let quarantined = p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'");
    let left = p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'");
    assert_eq!((quarantined, left), (0, 0), "seed {seed}: every task done, none quarantined; proxy: {}\n{logs}", proxy.summary());
    // The ledger's own view says the same.
    let view = p.count("SELECT COALESCE(SUM(bytes), 0) FROM redone_work");
    assert_eq!(view, run.redone, "seed {seed}: redone_work reports the redone bytes");
    run
}

/// The checks every seed must pass once its table has been read back.
fn check(seed: u64, profile: &str, run: &Run, want: &serde_json::Value, got: &serde_json::Value, copy_bound: f64) {
    eprintln!("{profile} seed {seed}: {run:?}");
    assert_eq!(got["rows"], want["rows"], "{profile} seed {seed}: rows");
    assert_eq!(got["distinct"], want["distinct"], "{profile} seed {seed}: exactly once");
    assert_eq!(got["digest"], want["digest"], "{profile} seed {seed}: every field");
    assert!(
        run.redone <= (run.faults + run.hedges as u64) as i64 * run.max_chunk,
        "{profile} seed {seed}: {} bytes redone for {} faults and {} hedges (a chunk is at most {} bytes)",
        run.redone,
        run.faults,
        run.hedges,
        run.max_chunk
    );
    assert!(run.failed_with_bytes == 0 || run.redone > 0, "{profile} seed {seed}: attempts failed after sending bytes, yet 0 redone");
    assert!(
        run.copy_secs <= copy_bound,
        "{profile} seed {seed}: copy ran {:.1} s, more than {copy_bound:.1} s for {} faults",
        run.copy_secs,
        run.faults
    );
}

/// Runs every seed of a profile; returns (faults injected, parts sent again, bytes redone).
fn s3_profile(profile: &str, faults: impl Fn() -> Faults) -> (u64, usize, i64) {
    let s3 = S3Server::from_env();
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    let (mut redone, mut retries, mut injected) = (0, 0, 0);
    let seeds = seeds(10);
    for seed in 1..=seeds {
        let proxy = FaultProxy::start(s3.addr, 7000 + seed);
        let prefix = format!("faults-{profile}-{stamp}-{seed}");
        let endpoint = format!("https://{}", proxy.addr);
        let dest = s3.destination_toml(&prefix, &endpoint, 3, "15s");
        let p = Pipeline::with_stores("256KiB", "10s", "0s", None, Some(dest));
        let mut cfg = std::fs::read_to_string(&p.config).unwrap();
        // Many chunks at once: more connections for the faults to land on.
        cfg.push_str(
            "\n[copy]\ndeadline = \"60s\"\nstall_timeout = \"10s\"\nconcurrency = 8\nhedge_min = \"2s\"\n[load]\nconcurrency = 8\n",
        );
        std::fs::write(&p.config, cfg).unwrap();
        let run = run_seed(&p, &proxy, faults(), seed);
        let want = input_digest("jsonl", &p.path("in"));
        let got = s3_table_digest(&format!("{}/{prefix}/events", s3.bucket));
        // A fault costs at most one call timeout (5 s; a hung handshake costs the 1 s connect
        // timeout and a resend), over what the run takes without faults.
        check(seed, profile, &run, &want, &got, 30.0 + run.faults as f64 * 5.0);
        // Nothing left behind, without gc: no temp object, no multipart upload.
        let direct = ferry_storage::Store::open(&format!("s3://{}/{prefix}", s3.bucket), &s3.store_options(&s3.endpoint)).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let temps = rt.block_on(direct.list("_ferry/tmp")).unwrap();
        assert!(temps.is_empty(), "{profile} seed {seed}: temp objects left: {temps:?}");
        let uploads = rt.block_on(direct.abandoned_uploads(i64::MAX)).unwrap();
        assert!(uploads.is_empty(), "{profile} seed {seed}: multipart uploads left: {uploads:?}");
        redone += run.redone;
        retries += run.part_retries;
        injected += run.faults;
    }
    eprintln!("{profile}: {seeds} seeds, {injected} faults injected, {retries} parts sent again, {redone} bytes redone");
    assert!(injected > 0, "{profile}: faults were injected");
    (injected, retries, redone)
}

#[test]
fn s3_hung_reset_and_trickling_connections_cost_retries_not_attempts() {
    s3_profile("mixed", || Faults {
        hang: 0.10,
        reset: 0.05,
        reset_within: 1 << 20,
        reset_both_ways: true,
        trickle: 0.05,
        ..Faults::default()
    });
}

#[test]
fn s3_thirty_percent_trickling_connections_cost_retries_not_attempts() {
    s3_profile("trickle", || Faults { trickle: 0.30, ..Faults::default() });
}

/// Resets in the middle of request and reply bodies: parts are sent again inside the attempt,
/// and the bytes sent twice are in the ledger.
#[test]
fn s3_resets_mid_body_are_retried_and_counted_as_redone() {
    let (_, retries, redone) =
        s3_profile("resets", || Faults { reset: 0.30, reset_within: 256 << 10, reset_both_ways: true, ..Faults::default() });
    assert!(retries > 0, "resets mid-body sent parts again");
    assert!(redone > 0, "the bytes sent again are counted");
}

#[test]
fn hdfs_resets_and_lost_replies_on_namenode_calls_cost_retries_not_attempts() {
    let a = MiniDfs::start("A");
    let rpcs: [&[u8]; 4] = [b"complete", b"create", b"addBlock", b"rename2"];
    let mut runs = Vec::new();
    // Six seeds (some 450 faults, 35 s each): the longest test of the suite's longest binary.
    let seeds = seeds(6);
    for seed in 1..=seeds {
        let proxy = FaultProxy::start(a.addr, 8000 + seed);
        let dest = format!(
            "[destination]\nurl = \"hdfs://{}/wh{seed}\"\n[destination.store]\ncall_timeout = \"3s\"\nread_stall = \"10s\"\n",
            proxy.addr
        );
        let p = Pipeline::with_stores("96KiB", "10s", "0s", None, Some(dest));
        let mut cfg = std::fs::read_to_string(&p.config).unwrap();
        // The watchdog at the call timeout: a silent complete() must still be settled, not
        // killed as "no progress".
        cfg.push_str("\n[copy]\ndeadline = \"60s\"\nstall_timeout = \"3s\"\nconcurrency = 4\n");
        std::fs::write(&p.config, cfg).unwrap();
        let mut on_request = Vec::new();
        for rpc in rpcs {
            on_request.push((rpc.to_vec(), 0.04, true));
            on_request.push((rpc.to_vec(), 0.02, false));
        }
        let run = run_seed(&p, &proxy, Faults { on_request, ..Faults::default() }, seed);
        eprintln!("hdfs seed {seed}: proxy: {}", proxy.summary());
        runs.push((seed, p, run));
    }
    // Read back with Hadoop's own client, all seeds at once (one JVM start each).
    let back = tempfile::tempdir().unwrap();
    let tables: Vec<String> = runs.iter().map(|(seed, ..)| format!("/wh{seed}")).collect();
    let mut args: Vec<&str> = vec!["-get"];
    args.extend(tables.iter().map(String::as_str));
    args.push(back.path().to_str().unwrap());
    ok(&a.fs(&args), "hdfs dfs -get");
    let ls = String::from_utf8_lossy(&a.fs(&["-ls", "-R", "/"]).stdout).to_string();
    let (mut injected, mut retries) = (0, 0);
    for (seed, p, run) in &runs {
        let want = input_digest("jsonl", &p.path("in"));
        let got = table_digest(&back.path().join(format!("wh{seed}/events")));
        // A fault costs at most about two call timeouts (3 s) over what the run takes without
        // faults: the call that gets no answer, then the settle (a lease recovery on a new
        // client) or the retry with its backoff and the cleanup of the try's temp file.
        check(*seed, "hdfs", run, &want, &got, 30.0 + run.faults as f64 * 6.0);
        injected += run.faults;
        retries += run.part_retries;
    }
    let temps: Vec<&str> = ls.lines().filter(|l| l.contains("/_ferry/tmp/") || l.contains(".tmp")).collect();
    assert!(temps.is_empty(), "temp files left on HDFS without gc:\n{}", temps.join("\n"));
    eprintln!("hdfs: {seeds} seeds, {injected} faults injected, {retries} parts sent again");
    assert!(injected > 0, "faults were injected");
}

/// Every kind of S3 request Ferry sends gets through when its connection hangs in the TLS
/// handshake or is reset there: a request that never went out is sent again on a new
/// connection, whatever its method (object_store alone gives up on a conditional PUT, a
/// DeleteObjects and Ferry's own ListMultipartUploads whose connect timed out).
#[test]
fn s3_every_request_kind_is_sent_again_after_a_failed_connect() {
    use std::sync::atomic::Ordering::SeqCst;
    let s3 = S3Server::from_env();
    let proxy = FaultProxy::start(s3.addr, 9100);
    let mut o = s3.store_options(&format!("https://{}", proxy.addr));
    o.s3.connect_timeout = ferry_common::config::HumanDuration(Duration::from_secs(1));
    o.s3.retry_timeout = ferry_common::config::HumanDuration(Duration::from_secs(20));
    o.s3.part_size = ferry_common::config::ByteSize(5 << 20);
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    // Each request kind gets a store of its own, so its first request needs a new connection
    // (none pooled from the one before): the connection the fault is set for.
    let open = || Rc::new(ferry_storage::Store::open(&format!("s3://{}/resend-{stamp}", s3.bucket), &o).unwrap());
    let current = RefCell::new(open());
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::write(&small, vec![7u8; 100_000]).unwrap();
    let large = dir.path().join("large");
    std::fs::write(&large, (0..(11u32 << 20)).map(|i| (i % 251) as u8).collect::<Vec<u8>>()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    type Op<'a> = Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ferry_storage::Error>> + 'a>> + 'a>;
    fn on<'a, F, Fut>(current: &'a RefCell<Rc<ferry_storage::Store>>, f: F) -> Op<'a>
    where
        F: Fn(Rc<ferry_storage::Store>) -> Fut + 'a,
        Fut: std::future::Future<Output = Result<(), ferry_storage::Error>> + 'a,
    {
        Box::new(move || Box::pin(f(current.borrow().clone())))
    }
    let (small, large, c) = (&small, &large, &current);
    let ops: Vec<(&str, Op)> = vec![
        ("conditional PUT", on(c, move |s| async move { s.upload(small, "a/small", Default::default()).await.map(|_| ()) })),
        ("plain PUT", on(c, |s| async move { s.put_atomic("a/plain", b"hello".to_vec()).await })),
        ("HEAD", on(c, |s| async move { s.head("a/small").await.map(|h| assert!(h.is_some())) })),
        ("GET", on(c, |s| async move { s.read("a/plain").await.map(|b| assert_eq!(b, b"hello")) })),
        ("LIST", on(c, |s| async move { s.list("a").await.map(|l| assert_eq!(l.len(), 2)) })),
        ("COPY + DELETE", on(c, |s| async move { s.rename_noreplace("a/plain", "a/moved").await.map(|r| assert!(r)) })),
        ("DeleteObjects", on(c, |s| async move { s.delete("a/moved").await })),
        ("multipart", on(c, move |s| async move { s.upload(large, "a/large", Default::default()).await.map(|_| ()) })),
        ("ListMultipartUploads", on(c, |s| async move { s.abandoned_uploads(i64::MAX).await.map(|u| assert!(u.is_empty())) })),
    ];
    for (what, op) in &ops {
        for hang in [true, false] {
            *current.borrow_mut() = open();
            let store = current.borrow().clone();
            let next = proxy.counters().connections.load(SeqCst);
            let (hangs, resets) = (proxy.counters().hangs.load(SeqCst), proxy.counters().resets.load(SeqCst));
            proxy.set(if hang {
                Faults { hang_connections: vec![next], ..Faults::default() }
            } else {
                Faults { reset_connections: vec![next], ..Faults::default() }
            });
            let t = Instant::now();
            let r = rt.block_on(op());
            proxy.clear();
            let how = if hang { "hung" } else { "reset" };
            assert!(r.is_ok(), "{what} after a {how} connect: {:?}", r.err());
            let met = if hang { proxy.counters().hangs.load(SeqCst) - hangs } else { proxy.counters().resets.load(SeqCst) - resets };
            assert_eq!(met, 1, "{what}: the {how} connection was met");
            eprintln!("{what}: through a {how} connect in {:?}", t.elapsed());
            assert!(t.elapsed() < Duration::from_secs(15), "{what}: {:?}", t.elapsed());
            // Idempotent again for the second round.
            if *what == "COPY + DELETE" {
                rt.block_on(store.put_atomic("a/plain", b"hello".to_vec())).unwrap();
                if hang {
                    rt.block_on(store.delete("a/moved")).unwrap();
                }
            }
            if *what == "DeleteObjects" {
                rt.block_on(store.put_atomic("a/moved", b"hello".to_vec())).unwrap();
            }
        }
    }
}
