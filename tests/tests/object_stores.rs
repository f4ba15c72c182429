//! The pipeline publishing to Google Cloud Storage and to Azure Blob Storage (their emulators,
//! over TLS) through a fault proxy, as S3 is tested: hung handshakes, trickles and resets
//! while files land, then the store gone (every connection hangs) for longer than a copy's
//! deadline, then back. Every record lands exactly once, nothing is quarantined, no attempt
//! outlives its deadline, and every stage exits cleanly. The table is read back object by
//! object and checked by pyarrow against the input read by Python's own Avro reader.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferry_storage::Store;
use ferry_storage::options::StoreOptions;
use ferry_tests::clusters::{AzureServer, GcsServer};
use ferry_tests::proxy::{FaultProxy, Faults};
use ferry_tests::{Pipeline, STAGES, bin, input_digest, table_digest, wait_until};

/// Copy's deadline for one upload.
const DEADLINE_S: i64 = 30;
/// How long the store is away: longer than an upload's deadline.
const OUTAGE_S: i64 = DEADLINE_S + 10;
/// One call's budget with the limits below: connect 1 s + request 10 s + retries 12 s.
const BUDGET_S: i64 = 23;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// One object store under test: the destination URL, its `[destination.store.<section>]` body
/// for a given endpoint host:port (the proxy), and options to read it back directly.
struct Target {
    name: &'static str,
    url: String,
    server: std::net::SocketAddr,
    store_toml: Box<dyn Fn(&str) -> String>,
    direct: StoreOptions,
}

fn gcs_target() -> Target {
    let gcs = GcsServer::from_env();
    let url = format!("gs://{}/faults-{}", gcs.bucket, now_ms());
    let direct = gcs.store_options(&gcs.endpoint);
    let (sa, ca) = (gcs.service_account.display().to_string(), gcs.ca.display().to_string());
    Target {
        name: "gcs",
        url,
        server: gcs.addr,
        store_toml: Box::new(move |at| {
            format!("[destination.store.gcs]\nendpoint = \"https://{at}\"\nservice_account = \"{sa}\"\nca_bundle = \"{ca}\"\n")
        }),
        direct,
    }
}

fn azure_target() -> Target {
    let az = AzureServer::from_env();
    let url = format!("az://{}/faults-{}", az.container, now_ms());
    let direct = az.store_options(&az.addr.to_string());
    let (account, key, ca) = (az.account.clone(), az.key.clone(), az.ca.display().to_string());
    Target {
        name: "azure",
        url,
        server: az.addr,
        store_toml: Box::new(move |at| {
            format!(
                "[destination.store.azure]\nendpoint = \"https://{at}/{account}\"\naccount = \"{account}\"\naccess_key = \"{key}\"\nca_bundle = \"{ca}\"\n"
            )
        }),
        direct,
    }
}

#[test]
fn gcs_publishes_exactly_once_through_faults_and_an_outage() {
    publishes_exactly_once_through_faults_and_an_outage(gcs_target());
}

#[test]
fn azure_publishes_exactly_once_through_faults_and_an_outage() {
    publishes_exactly_once_through_faults_and_an_outage(azure_target());
}

fn publishes_exactly_once_through_faults_and_an_outage(t: Target) {
    let proxy = FaultProxy::start(t.server, 3000);
    let limits = "connect_timeout = \"1s\"\nrequest_timeout = \"10s\"\nread_timeout = \"3s\"\nmax_retries = 2\n\
                  retry_timeout = \"12s\"\npart_size = \"5MiB\"\n";
    let dest = format!(
        "[destination]\nurl = \"{}\"\n[destination.store]\ncall_timeout = \"5s\"\nread_stall = \"5s\"\n{}{limits}",
        t.url,
        (t.store_toml)(&proxy.addr.to_string())
    );
    let p = Pipeline::with_stores("2MiB", "5s", "0s", None, Some(dest));
    let mut cfg = std::fs::read_to_string(&p.config).unwrap();
    cfg.push_str(&format!("\n[copy]\ndeadline = \"{DEADLINE_S}s\"\nstall_timeout = \"4s\"\nconcurrency = 4\nhedge_min = \"2s\"\n"));
    std::fs::write(&p.config, cfg).unwrap();
    p.raise_attempt_cap(50);
    let m = Command::new(bin("ferry")).args(["--ledger", &p.ledger_url(), "migrate"]).output().unwrap();
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));

    // The stores answer at start (an outage is only an outage once a service is running).
    let services: Vec<_> = STAGES.iter().map(|s| p.watch_started(s, &[])).collect();
    proxy.set(Faults { hang: 0.2, trickle: 0.1, reset: 0.5, reset_within: 4 << 20, ..Faults::default() });
    let files = 12u32;
    let land = |k: u32| {
        // Connections are pooled: cut them all now and then, so that requests in flight are
        // reset and new connections meet the odds above (TLS hides the requests themselves
        // from the proxy).
        proxy.cut_all();
        // A file a second, as in the seed-000 test (written aside, then renamed in).
        let dir = format!("gen-{k}");
        p.generate(&dir, "avro", "snappy", 1, 20_000, 2000 + k as u64);
        for e in std::fs::read_dir(p.path(&dir)).unwrap().flatten() {
            std::fs::rename(e.path(), p.path(&format!("in/{k}-{}", e.file_name().to_string_lossy()))).unwrap();
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    (0..files / 2).for_each(land);
    // Then the store goes away for longer than a copy's deadline, while the other half lands:
    // every connection, old and new, hangs. An outage holds chunks back; it does not use up
    // their attempts.
    let outage = Instant::now();
    proxy.set(Faults { hang: 1.0, ..Faults::default() });
    proxy.cut_all();
    (files / 2..files).for_each(land);
    std::thread::sleep(Duration::from_secs(OUTAGE_S as u64).saturating_sub(outage.elapsed()));
    proxy.clear();

    wait_until(&format!("{}: the pipeline drained", t.name), Duration::from_secs(300), || {
        p.sql(&format!(
            "SELECT (SELECT COUNT(*) FROM source_files WHERE state = 'chunked') = {files} \
             AND NOT EXISTS (SELECT 1 FROM tasks WHERE state <> 'done')"
        )) == "1"
    });
    for s in services {
        let (code, _, log) = s.stop();
        assert_eq!(code, Some(0), "{}: a stage exited {code:?} after SIGTERM:\n{log}", t.name);
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0, "{}: nothing quarantined", t.name);
    p.assert_attempts_within(50);
    let longest = p.count("SELECT MAX(ended_at - started_at) FROM attempts WHERE stage IN ('copy', 'load')");
    let which = p.sql(
        "SELECT stage || ' ' || chunk_id || ' ' || outcome || ': ' || COALESCE(error, '') FROM attempts \
         WHERE stage IN ('copy', 'load') ORDER BY ended_at - started_at DESC LIMIT 1",
    );
    // An upload ends at its deadline; the calls around it (a hedge's copy into place, a HEAD)
    // each end within their budget (connect + request + retry timeouts: 23 s here), so one
    // caught by the outage waits it out at most that long past its end.
    let bound = (DEADLINE_S + OUTAGE_S + BUDGET_S + 10) * 1000;
    assert!(longest <= bound, "{}: an attempt ran {longest} ms, past {bound} ms: {which}", t.name);
    assert!(proxy.counters().hangs.load(Ordering::SeqCst) >= 1, "{}: hangs were injected: {}", t.name, proxy.summary());
    let scheme = t.url.split("://").next().unwrap();
    let seen = p.count(&format!("SELECT COUNT(*) FROM outages WHERE store LIKE 'destination {scheme}://%'"));
    assert!(seen >= 1, "{}: the outage was seen as one", t.name);
    assert_eq!(p.count("SELECT COUNT(*) FROM open_outages"), 0, "{}: and closed when the store came back", t.name);

    // Read the table back object by object (the emulator directly, no proxy).
    let local = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let t0 = Instant::now();
    rt.block_on(async {
        let store = Store::open(&t.url, &t.direct).unwrap();
        for e in store.list("events").await.unwrap() {
            if e.rel.contains("/_ferry/") || !e.rel.ends_with(".parquet") {
                continue;
            }
            let to = local.path().join(&e.rel);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::write(&to, store.read(&e.rel).await.unwrap()).unwrap();
        }
    });
    let want = input_digest("avro", &p.path("in"));
    let got = table_digest(&local.path().join("events"));
    assert_eq!(want["rows"], (files * 20_000) as i64);
    assert_eq!(got["rows"], want["rows"], "{}: rows", t.name);
    assert_eq!(got["distinct"], want["distinct"], "{}: exactly once", t.name);
    assert_eq!(got["digest"], want["digest"], "{}: every field", t.name);
    eprintln!("{}: {files} files exactly once through {}; read back in {:?}", t.name, proxy.summary(), t0.elapsed());
}
