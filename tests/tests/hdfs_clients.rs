//! HDFS clients do not leak. hdfs-native keeps a client that has written a file alive for ever
//! (its lease-renewal task holds it), so a client Ferry lets go of (one the pool has no room
//! for, one retired after a call timed out or a hedge lost) used to keep its NameNode
//! connection and its tasks: over weeks of a `--watch` service, unbounded. Here rounds of more
//! writers at once than the pool keeps run against a real MiniDFS, and this process's NameNode
//! connections and threads must stay flat from round to round.
//!
//! Alone in its test binary: it counts this process's sockets and threads.

use std::time::Duration;

use ferry_storage::Store;
use ferry_storage::options::StoreOptions;
use ferry_tests::clusters::MiniDfs;

/// Sockets of this process connected to `port` (established), from /proc.
fn connections_to(port: u16) -> usize {
    let mine: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| l.to_string_lossy().strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')).map(str::to_string))
        .collect();
    let mut n = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let remote_port = f[2].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            // State 01: ESTABLISHED.
            if remote_port == Some(port) && f[3] == "01" && mine.contains(f[9]) {
                n += 1;
            }
        }
    }
    n
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn clients_let_go_of_close_their_namenode_connections_and_threads() {
    let nn = MiniDfs::start("L");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let store = Store::open(&format!("{}/leak", nn.url), &StoreOptions::default()).unwrap();
    // More writers at once than the pool keeps (64): the rest are let go of after each round.
    const WRITERS: usize = 100;
    let mut samples = Vec::new();
    for round in 0..4 {
        rt.block_on(async {
            let stores: Vec<Store> = (0..WRITERS).map(|_| store.isolated().unwrap()).collect();
            let names: Vec<String> = (0..WRITERS).map(|i| format!("r{round}/f{i}")).collect();
            let writes = stores.iter().zip(&names).enumerate().map(|(i, (s, name))| s.put_atomic(name, vec![i as u8; 1000]));
            for r in futures::future::join_all(writes).await {
                r.unwrap();
            }
            // A read on each as well: DataNode connections go back to hdfs-native's cache.
            let reads = stores.iter().zip(&names).map(|(s, name)| s.read(name));
            for (i, r) in futures::future::join_all(reads).await.into_iter().enumerate() {
                assert_eq!(r.unwrap(), vec![i as u8; 1000]);
            }
        });
        // A client let go of lingers a few seconds (see ferry_storage's HDFS notes).
        std::thread::sleep(Duration::from_secs(8));
        let sample = (connections_to(nn.addr.port()), threads());
        println!("round {round}: {} NameNode connections, {} threads", sample.0, sample.1);
        samples.push(sample);
    }
    let (first, last) = (samples[0], samples[samples.len() - 1]);
    // Each round lets go of 36 clients that wrote: they must not pile up.
    assert!(last.0 <= first.0 + 2, "NameNode connections grew from {} to {} over the rounds: {samples:?}", first.0, last.0);
    assert!(last.1 <= first.1 + 4, "threads grew from {} to {} over the rounds: {samples:?}", first.1, last.1);
    assert!(last.0 <= 64 + 4, "at most the pool's clients stay connected: {samples:?}");
    // The files are all there, and a fresh client still works.
    let n = rt.block_on(store.list("")).unwrap().len();
    assert_eq!(n, 4 * WRITERS);

    // After the burst, a steady trickle of one chunk at a time: the pooled clients it does not
    // need go once idle for 15 s, and the connections fall back to what it uses.
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        rt.block_on(async { store.isolated().unwrap().put_atomic("trickle", vec![1; 10]).await.unwrap() });
        std::thread::sleep(Duration::from_secs(5));
    }
    std::thread::sleep(Duration::from_secs(8));
    let after = (connections_to(nn.addr.port()), threads());
    println!("after 30 s of one chunk at a time: {} NameNode connections, {} threads", after.0, after.1);
    assert!(after.0 <= 4, "idle pooled clients keep their NameNode connections: {after:?} (after the burst: {samples:?})");
    assert!(after.1 + 50 <= last.1, "idle pooled clients keep their threads: {after:?} (after the burst: {samples:?})");
    // Every round read its files back: the DataNode connections those reads left in
    // hdfs-native's cache must not keep the runtimes of clients let go of alive (each runtime's
    // reactor holds an eventfd and two epoll descriptors), only runtimes with a thread remain.
    let fds_of = |kind: &str| {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains(kind)))
            .count()
    };
    let client_threads = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "ferry-hdfs"))
        .count();
    let reactors = fds_of("eventfd");
    println!("{reactors} reactors (eventfds), {client_threads} client threads, {} descriptors", fds_of(""));
    // The clients' runtimes, this test's own, and slack for one client lingering its last seconds.
    assert!(
        reactors <= client_threads + 3,
        "runtimes without their thread stay alive: {reactors} reactors, {client_threads} client threads"
    );
}
