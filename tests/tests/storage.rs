//! Storage conformance: the same checks against local dirs, a real HDFS (MiniDFS), a real
//! S3-compatible server, and the GCS and Azure emulators, each behind TLS. Plus: no call waits past its deadline when the server
//! accepts the connection and never answers.

use std::time::{Duration, Instant};

use ferry_common::config::HumanDuration;
use ferry_storage::options::StoreOptions;
use ferry_storage::{Progress, Store, hash_file};
use ferry_tests::clusters::{AzureServer, GcsServer, MiniDfs, S3Server};
use ferry_tests::proxy::{FaultProxy, Faults};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn random_file(dir: &std::path::Path, name: &str, len: usize, seed: u8) -> std::path::PathBuf {
    let p = dir.join(name);
    let bytes: Vec<u8> = (0..len).map(|i| (i as u64 * 2654435761 % 251) as u8 ^ seed).collect();
    std::fs::write(&p, bytes).unwrap();
    p
}

async fn conformance(store: Store) {
    let local = tempfile::tempdir().unwrap();

    // put / head / read / list
    assert!(store.head("a/missing").await.unwrap().is_none());
    assert!(store.list("nothing/here").await.unwrap().is_empty());
    store.put_atomic("a/one.txt", b"one".to_vec()).await.unwrap();
    store.put_atomic("a/b/two.txt", b"two!".to_vec()).await.unwrap();
    store.put_atomic("a/one.txt", b"uno".to_vec()).await.unwrap(); // replaces whole
    assert_eq!(store.read("a/one.txt").await.unwrap(), b"uno");
    assert_eq!(store.head("a/b/two.txt").await.unwrap().unwrap().size, 4);
    let names: Vec<String> = store.list("a").await.unwrap().into_iter().map(|e| e.rel).collect();
    assert_eq!(names, vec!["a/b/two.txt".to_string(), "a/one.txt".to_string()]);
    let e = store.list("a").await.unwrap();
    assert!(e.iter().all(|e| e.mtime_ms > 1_700_000_000_000), "mtimes are real: {e:?}");
    // children: one level only, directories by name, a missing directory is empty
    assert_eq!(store.children("a").await.unwrap(), vec!["b".to_string(), "one.txt".to_string()]);
    assert_eq!(store.children("a/b").await.unwrap(), vec!["two.txt".to_string()]);
    assert!(store.children("nothing/here").await.unwrap().is_empty());

    // upload (hashing every byte) then publish by no-overwrite rename
    for (name, len) in [("small", 300_000usize), ("large", 13 << 20)] {
        let src = random_file(local.path(), name, len, 7);
        let want = hash_file(&src).unwrap();
        let tmp = format!("_ferry/tmp/{name}.1.0");
        let progress = Progress::default();
        let got = store.upload(&src, &tmp, progress.clone()).await.unwrap();
        assert_eq!(got, want, "{name}: upload returns size and blake3 of what it sent");
        assert_eq!(progress.bytes(), len as u64, "{name}: progress counts every byte");
        assert_eq!(store.hash(&tmp).await.unwrap(), want, "{name}: stored bytes hash the same");
        let landed = format!("_ferry/landed/t/{name}/dt=2026-11-30/part-{name}.parquet");
        assert!(store.rename_noreplace(&tmp, &landed).await.unwrap());
        assert!(store.head(&tmp).await.unwrap().is_none(), "{name}: temp name gone");
        assert_eq!(store.hash(&landed).await.unwrap(), want);

        // a second attempt of the same chunk: the target exists, nothing is overwritten
        let tmp2 = format!("_ferry/tmp/{name}.2.0");
        let other = random_file(local.path(), "other", 1000, 9);
        store.upload(&other, &tmp2, Progress::default()).await.unwrap();
        assert!(!store.rename_noreplace(&tmp2, &landed).await.unwrap(), "{name}: no overwrite");
        assert_eq!(store.hash(&landed).await.unwrap(), want, "{name}: target unchanged");
        store.delete(&tmp2).await.unwrap();

        // blocking reads (the splitter and decoders use them)
        let s = store.clone();
        let l2 = landed.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut s.open_blocking(&l2).unwrap(), &mut v).unwrap();
            v
        })
        .await
        .unwrap();
        assert_eq!(bytes, std::fs::read(&src).unwrap(), "{name}: open_blocking reads every byte");
    }

    // put-if-absent (a Delta commit): the first writer of a name wins, whole; of eight racing
    // for one name exactly one is told it won, and the name holds its bytes
    assert!(store.create_new("t/_delta_log/00000000000000000000.json", b"first".to_vec()).await.unwrap());
    assert!(!store.create_new("t/_delta_log/00000000000000000000.json", b"second".to_vec()).await.unwrap());
    assert_eq!(store.read("t/_delta_log/00000000000000000000.json").await.unwrap(), b"first");
    let racers = (0..8u8).map(|i| {
        let s = store.clone();
        async move { (i, s.create_new("t/_delta_log/00000000000000000001.json", vec![b'a' + i; 100 + i as usize]).await.unwrap()) }
    });
    let won: Vec<u8> = futures::future::join_all(racers).await.into_iter().filter(|(_, won)| *won).map(|(i, _)| i).collect();
    assert_eq!(won.len(), 1, "exactly one writer creates the name: {won:?}");
    assert_eq!(store.read("t/_delta_log/00000000000000000001.json").await.unwrap(), vec![b'a' + won[0]; 100 + won[0] as usize]);
    let log: Vec<String> = store.list("t/_delta_log").await.unwrap().into_iter().map(|e| e.rel).collect();
    assert_eq!(log.len(), 2, "no temp file left beside the log: {log:?}");
    for f in log {
        store.delete(&f).await.unwrap();
    }

    // renaming a missing file says "not found"; deleting a missing file is fine
    let e = store.rename_noreplace("_ferry/tmp/nope", "x/y").await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    store.delete("_ferry/tmp/nope").await.unwrap();

    // blocking atomic put (extract stages chunks from a blocking thread)
    let s = store.clone();
    tokio::task::spawn_blocking(move || s.put_atomic_blocking("staged/c1.avro", b"chunk").unwrap()).await.unwrap();
    assert_eq!(store.read("staged/c1.avro").await.unwrap(), b"chunk");

    // gc finds abandoned copy temp files, only those older than the cutoff and only names
    // Ferry writes: another tool's file in the same directory is not a candidate
    store.put_atomic("_ferry/tmp/crashed.3.0.1", b"partial".to_vec()).await.unwrap();
    store.put_atomic("_ferry/tmp/not-ferrys.bin", b"someone else's".to_vec()).await.unwrap();
    assert!(store.abandoned("t", 0).await.unwrap().is_empty(), "too young to collect");
    let found = store.abandoned("t", chrono_now_ms() + 60_000).await.unwrap();
    assert_eq!(found.iter().map(|a| (a.rel.as_str(), a.chunk.as_str())).collect::<Vec<_>>(), vec![("_ferry/tmp/crashed.3.0.1", "crashed")]);
    assert_eq!(store.remove_abandoned(&found).await.unwrap(), 1);
    let left: Vec<String> = store.list("_ferry/tmp").await.unwrap().into_iter().map(|e| e.rel).collect();
    assert_eq!(left, vec!["_ferry/tmp/not-ferrys.bin".to_string()]);
    store.delete("_ferry/tmp/not-ferrys.bin").await.unwrap();
}

fn chrono_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[test]
fn local_dirs() {
    let d = tempfile::tempdir().unwrap();
    rt().block_on(conformance(Store::from_url(&d.path().display().to_string()).unwrap()));
}

#[test]
fn hdfs() {
    let nn = MiniDfs::start("A");
    let opts = StoreOptions::default();
    rt().block_on(async {
        conformance(Store::open(&format!("{}/conformance", nn.url), &opts).unwrap()).await;
    });
    // Hadoop's own client sees what we published.
    let out = nn.fs(&["-ls", "-R", "/conformance/_ferry/landed"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("part-large.parquet"));

    // The same through a viewfs mount table given in Ferry's config (as a Hadoop conf dir
    // would give it): viewfs://lake/warehouse -> hdfs://<nn>/through-viewfs.
    let mut vopts = StoreOptions::default();
    vopts.hdfs.config.insert("fs.viewfs.mounttable.lake.link./warehouse".into(), format!("{}/through-viewfs", nn.url));
    vopts.hdfs.config.insert("fs.viewfs.mounttable.lake.linkFallback".into(), format!("{}/", nn.url));
    rt().block_on(async {
        conformance(Store::open("viewfs://lake/warehouse", &vopts).unwrap()).await;
    });
    let out = nn.fs(&["-ls", "-R", "/through-viewfs/_ferry/landed"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("part-large.parquet"), "viewfs wrote through the mount");
}

/// An HA nameservice (two NameNodes, `hdfs://ns1`) named in a Hadoop conf dir given in
/// Ferry's config; the active NameNode fails over between two rounds on the same store.
#[test]
fn hdfs_ha_nameservice_across_a_failover() {
    let mut nn = MiniDfs::start_ha("HA", "ns1");
    assert_eq!(nn.url, "hdfs://ns1");
    let mut opts = StoreOptions::default();
    opts.hdfs.conf_dir = Some(nn.conf_dir.display().to_string());
    let rt = rt();
    let store = Store::open("hdfs://ns1/before", &opts).unwrap();
    rt.block_on(conformance(store.clone()));
    let active = nn.failover();
    eprintln!("failed over to {active}");
    rt.block_on(async {
        // The same client object: hdfs-native finds the new active NameNode.
        store.put_atomic("after-failover.txt", b"still here".to_vec()).await.unwrap();
        assert_eq!(store.read("after-failover.txt").await.unwrap(), b"still here");
        conformance(Store::open("hdfs://ns1/after", &opts).unwrap()).await;
    });
    let out = nn.fs(&["-ls", "-R", "/after/_ferry/landed"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("part-large.parquet"));
}

fn s3_opts(s3: &S3Server, endpoint: &str) -> StoreOptions {
    let mut o = s3.store_options(endpoint);
    o.s3.part_size = ferry_common::config::ByteSize(5 << 20);
    o
}

#[test]
fn s3() {
    let s3 = S3Server::from_env();
    let prefix = format!("conformance-{}", chrono_now_ms());
    let opts = s3_opts(&s3, &s3.endpoint);
    rt().block_on(conformance(Store::open(&format!("s3://{}/{prefix}", s3.bucket), &opts).unwrap()));
}

#[test]
fn gcs() {
    let gcs = GcsServer::from_env();
    let mut opts = gcs.store_options(&gcs.endpoint);
    opts.gcs.part_size = ferry_common::config::ByteSize(5 << 20);
    let url = format!("gs://{}/conformance-{}", gcs.bucket, chrono_now_ms());
    rt().block_on(conformance(Store::open(&url, &opts).unwrap()));
}

#[test]
fn azure() {
    let az = AzureServer::from_env();
    let mut opts = az.store_options(&az.addr.to_string());
    opts.azure.part_size = ferry_common::config::ByteSize(5 << 20);
    let url = format!("az://{}/conformance-{}", az.container, chrono_now_ms());
    rt().block_on(conformance(Store::open(&url, &opts).unwrap()));
}

/// A chunk's landed key is created at most once; bytes that do not hash to what the caller
/// expects are never completed; a multipart upload cut off mid-way is aborted, and its record
/// is gone (where the service keeps one).
async fn conditional_create_and_cut_off_uploads(store: &Store) {
    let d = tempfile::tempdir().unwrap();
    let small = random_file(d.path(), "s", 1000, 1);
    store.upload(&small, "k", Progress::default()).await.unwrap();
    // the same bytes again: the conditional PUT fails, the HEAD shows it is ours, fine
    store.upload(&small, "k", Progress::default()).await.unwrap();
    // other bytes: refused, the object is unchanged
    let other = random_file(d.path(), "o", 1000, 2);
    assert!(store.upload(&other, "k", Progress::default()).await.is_err());
    assert_eq!(store.hash("k").await.unwrap(), hash_file(&small).unwrap());

    let wrong = "0".repeat(64);
    for (name, len) in [("small-wrong", 1000usize), ("large-wrong", 12 << 20)] {
        let f = random_file(d.path(), name, len, 5);
        let (n, h) = store.upload_checked(&f, name, Some(&wrong), Progress::default()).await.unwrap();
        assert_eq!((n, h), hash_file(&f).unwrap(), "{name}: the caller learns what the bytes hash to");
        assert!(store.head(name).await.unwrap().is_none(), "{name}: nothing was completed");
    }
    assert!(store.abandoned_uploads(chrono_now_ms() + 60_000).await.unwrap().is_empty(), "the refused multipart upload was aborted");

    // a large upload cut off mid-way (its future dropped, as a watchdog does)
    let big = random_file(d.path(), "big", 100 << 20, 3);
    let p = Progress::default();
    let (s2, b2, p2) = (store.clone(), big.clone(), p.clone());
    let task = tokio::spawn(async move { s2.upload(&b2, "_ferry/tmp/big.1.0", p2).await });
    while p.bytes() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // The abort runs in the background, and again while parts that were in flight still
    // land (up to six tries, 0.25 s apart doubling: under 16 s plus the requests).
    let gone = Instant::now() + Duration::from_secs(60);
    while !store.abandoned_uploads(chrono_now_ms() + 60_000).await.unwrap().is_empty() {
        assert!(Instant::now() < gone, "the cut-off upload aborted itself");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(store.head("_ferry/tmp/big.1.0").await.unwrap().is_none(), "never completed");
}

/// A crashed uploader's multipart upload (created with object_store directly through `raw`,
/// then left): gc lists it and aborts it, once old enough; another tool's upload under the
/// same root is listed, never taken.
async fn crashed_uploads_are_collected(store: &Store, raw: &dyn object_store::multipart::MultipartStore, prefix: &str) {
    let key = object_store::path::Path::from(format!("{prefix}/_ferry/landed/t/c/part-crashed.parquet"));
    let id = raw.create_multipart(&key).await.unwrap();
    raw.put_part(&key, &id, 0, vec![7u8; 5 << 20].into()).await.unwrap();
    let foreign = object_store::path::Path::from(format!("{prefix}/backups/dump.tar"));
    let foreign_id = raw.create_multipart(&foreign).await.unwrap();
    let found = store.abandoned_uploads(chrono_now_ms() + 60_000).await.unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(store.abandoned_uploads(0).await.unwrap().is_empty(), "too young to count as abandoned");
    let ferrys = store.abandoned("t", chrono_now_ms() + 60_000).await.unwrap();
    assert_eq!(ferrys.len(), 1, "{ferrys:?}");
    assert!(ferrys[0].rel.ends_with("part-crashed.parquet") && ferrys[0].upload.as_deref() == Some(id.as_str()));
    assert_eq!(ferrys[0].chunk, "c");
    assert_eq!(store.remove_abandoned(&ferrys).await.unwrap(), 1, "gc aborted it");
    let left = store.abandoned_uploads(chrono_now_ms() + 60_000).await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].0.ends_with("backups/dump.tar") && left[0].1 == foreign_id, "the foreign upload is untouched");
    raw.abort_multipart(&foreign, &foreign_id).await.unwrap();
}

fn root_ca(pem: &std::path::Path) -> object_store::ClientOptions {
    object_store::ClientOptions::new().with_root_certificate(object_store::Certificate::from_pem(&std::fs::read(pem).unwrap()).unwrap())
}

#[test]
fn s3_conditional_create_and_abandoned_multipart() {
    let s3 = S3Server::from_env();
    let prefix = format!("mp-{}", chrono_now_ms());
    let opts = s3_opts(&s3, &s3.endpoint);
    rt().block_on(async {
        let store = Store::open(&format!("s3://{}/{prefix}", s3.bucket), &opts).unwrap();
        conditional_create_and_cut_off_uploads(&store).await;
        let raw = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(&s3.bucket)
            .with_endpoint(&s3.endpoint)
            .with_region("us-east-1")
            .with_access_key_id(&s3.access_key)
            .with_secret_access_key(&s3.secret_key)
            .with_client_options(root_ca(&s3.ca))
            .build()
            .unwrap();
        crashed_uploads_are_collected(&store, &raw, &prefix).await;
    });
}

#[test]
fn gcs_conditional_create_and_abandoned_multipart() {
    let gcs = GcsServer::from_env();
    let prefix = format!("mp-{}", chrono_now_ms());
    let mut opts = gcs.store_options(&gcs.endpoint);
    opts.gcs.part_size = ferry_common::config::ByteSize(5 << 20);
    rt().block_on(async {
        let store = Store::open(&format!("gs://{}/{prefix}", gcs.bucket), &opts).unwrap();
        conditional_create_and_cut_off_uploads(&store).await;
        let raw = object_store::gcp::GoogleCloudStorageBuilder::new()
            .with_bucket_name(&gcs.bucket)
            .with_base_url(&gcs.endpoint)
            .with_service_account_path(gcs.service_account.display().to_string())
            .with_client_options(root_ca(&gcs.ca))
            .build()
            .unwrap();
        crashed_uploads_are_collected(&store, &raw, &prefix).await;
    });
}

#[test]
fn azure_conditional_create_and_refused_uploads() {
    // Azure's uncommitted blocks have no upload to list: gc finds none, and none is needed.
    let az = AzureServer::from_env();
    let mut opts = az.store_options(&az.addr.to_string());
    opts.azure.part_size = ferry_common::config::ByteSize(5 << 20);
    rt().block_on(async {
        let store = Store::open(&format!("az://{}/mp-{}", az.container, chrono_now_ms()), &opts).unwrap();
        conditional_create_and_cut_off_uploads(&store).await;
    });
}

/// Seed 000 and seed 001 in miniature: the server accepts the TCP connection and then says
/// nothing (no TLS handshake, no RPC reply). Every call ends at its deadline.
#[test]
fn hung_servers_never_hang_a_call() {
    let nn = MiniDfs::start("H");
    let s3 = S3Server::from_env();
    let nn_proxy = FaultProxy::start(nn.addr, 1);
    let s3_proxy = FaultProxy::start(s3.addr, 2);
    for p in [&nn_proxy, &s3_proxy] {
        p.set(Faults { hang: 1.0, ..Faults::default() });
    }
    let hopts = StoreOptions { call_timeout: HumanDuration(Duration::from_secs(2)), ..Default::default() };
    let mut sopts = s3_opts(&s3, &format!("https://{}", s3_proxy.addr));
    sopts.s3.connect_timeout = HumanDuration(Duration::from_secs(1));
    sopts.s3.max_retries = 1;
    sopts.s3.retry_timeout = HumanDuration(Duration::from_secs(5));
    rt().block_on(async {
        let h = Store::open(&format!("hdfs://{}/x", nn_proxy.addr), &hopts).unwrap();
        let s = Store::open(&format!("s3://{}/x", s3.bucket), &sopts).unwrap();
        let d = tempfile::tempdir().unwrap();
        let f = random_file(d.path(), "f", 1 << 20, 4);
        for (name, store) in [("hdfs", h), ("s3", s)] {
            let t = Instant::now();
            let e = store.head("a").await.unwrap_err();
            assert!(t.elapsed() < Duration::from_secs(12), "{name} head took {:?}", t.elapsed());
            assert!(e.is_transient(), "{name}: {e}");
            let t = Instant::now();
            let e = store.upload(&f, "_ferry/tmp/f.1.0", Progress::default()).await.unwrap_err();
            assert!(t.elapsed() < Duration::from_secs(12), "{name} upload took {:?}", t.elapsed());
            assert!(e.is_transient(), "{name}: {e}");
            eprintln!("{name}: hung server -> {e}");
        }
    });
    assert!(nn_proxy.counters().hangs.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert!(s3_proxy.counters().hangs.load(std::sync::atomic::Ordering::SeqCst) >= 1);
}
