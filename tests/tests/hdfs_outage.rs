//! The outage rules of S3, on HDFS, with the NameNode process really stopped (its port refuses
//! connections; the DataNodes keep running): under the four `--watch` services nothing is
//! quarantined, each stage that met it records one outage row, and everything drains by itself
//! once the NameNode is back. Then the HDFS-only ways a cluster changes under a write: an HA
//! failover while copy and load are busy, and a DataNode lost during writes.
//!
//! `FERRY_TEST_OUTAGE_SECS` (default 180) sets how long a NameNode stays down.

use std::time::{Duration, Instant};

use ferry_tests::clusters::MiniDfs;
use ferry_tests::{Pipeline, STAGES, held_within, input_digest, table_digest, wait_until};

fn outage() -> Duration {
    Duration::from_secs(std::env::var("FERRY_TEST_OUTAGE_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(180))
}

/// `[<section>]` on `cluster` at `path`, with short deadlines (an outage is found in seconds).
fn hdfs_section(section: &str, url: &str, path: &str, conf_dir: Option<&std::path::Path>) -> String {
    let mut s = format!("[{section}]\nurl = \"{url}{path}\"\n[{section}.store]\ncall_timeout = \"3s\"\nread_stall = \"5s\"\n");
    if let Some(d) = conf_dir {
        s.push_str(&format!("[{section}.store.hdfs]\nconf_dir = \"{}\"\n", d.display()));
    }
    s
}

/// Few attempts per chunk, so that an outage mistaken for chunk failures would quarantine
/// chunks within the test, and quick probes while a store is down.
fn short_budget(p: &Pipeline) {
    let mut cfg = std::fs::read_to_string(&p.config).unwrap();
    cfg = cfg.replace("lease = \"30s\"", "lease = \"30s\"\nmax_attempts = 3\noutage_probe_max = \"5s\"");
    cfg.push_str("\n[copy]\ndeadline = \"20s\"\nstall_timeout = \"5s\"\nconcurrency = 4\n");
    std::fs::write(&p.config, cfg).unwrap();
}

/// The last `n` lines of a service's log, without the retry chatter.
fn last_lines(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.contains("ferry_storage::retry")).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn outage_rows(p: &Pipeline) -> String {
    p.sql("SELECT COALESCE(group_concat(stage || ' ' || store || ' ' || started_at || '-' || COALESCE(ended_at, 'open'), '; '), 'none') FROM outages")
}

/// The table under `/wh/events` on `cluster`, read back by Hadoop's own client.
fn table_on(cluster: &MiniDfs, p: &Pipeline) -> serde_json::Value {
    let local = p.path("table-copy");
    let _ = std::fs::remove_dir_all(&local);
    cluster.fs(&["-get", "/wh/events", local.to_str().unwrap()]);
    table_digest(&local)
}

fn assert_exactly_once(got: &serde_json::Value, p: &Pipeline) {
    let want = input_digest("jsonl", &p.path("in"));
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}: every record published exactly once ({got} vs {want})");
    }
}

/// The NameNode of the store `role` ("staging" or "destination") stops for [`outage`] while the
/// four services run and files keep landing; the other store is a local dir.
fn namenode_stopped_under_four_watch_services(role: &str, store_label: &str, stages_that_see_it: &[&str]) {
    let mut nn = MiniDfs::start(&format!("{}-down", &role[..1].to_uppercase()));
    let section = hdfs_section(role, &nn.url, if role == "staging" { "/staging" } else { "/wh" }, None);
    let (staging, destination) = if role == "staging" { (Some(section), None) } else { (None, Some(section)) };
    let p = Pipeline::with_stores("32KiB", "30s", "0s", staging, destination);
    short_budget(&p);
    p.add_jsonl_batch("a", 2, 1000, 51);
    let mut services: Vec<_> = STAGES.iter().map(|s| p.watch(s, &[])).collect();
    wait_until("the first batch published", Duration::from_secs(180), || p.drained(2));
    let mut files = 2;
    if role == "staging" {
        // Extract cannot stage anything while staging is down (it waits the pass out), so give
        // transform a backlog to meet the outage with: a file staged while transform is paused
        // (SIGSTOP; a transform started while staging is down would wait at its start check
        // instead, which is another rule).
        services[1].signal("-STOP");
        p.add_jsonl_batch("pre", 1, 1000, 59);
        files += 1;
        wait_until("a chunk staged for transform", Duration::from_secs(120), || {
            p.count("SELECT COUNT(*) FROM source_files WHERE state <> 'registered'") == files
                && p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'transform' AND state <> 'done'") > 0
        });
    }

    let t0 = Instant::now();
    nn.stop_namenode();
    if role == "staging" {
        services[1].signal("-CONT");
    }
    let secs = outage();
    let mut landed = 0;
    while t0.elapsed() < secs {
        // A file lands every so often, as in a landing zone.
        if t0.elapsed() >= secs * landed / 4 && landed < 4 {
            p.add_jsonl_batch(&format!("o{landed}"), 1, 800, 60 + landed as u64);
            landed += 1;
            files += 1;
        }
        for s in services.iter_mut() {
            assert!(s.running(), "{} ended while the {role} NameNode was down", s.name);
        }
        assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0, "the outage quarantined a chunk");
        assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'quarantined'"), 0, "the outage quarantined a file");
        std::thread::sleep(Duration::from_secs(2));
    }
    for stage in stages_that_see_it {
        let open = p.count(&format!("SELECT COUNT(*) FROM open_outages WHERE stage = '{stage}' AND store LIKE '{store_label} %'"));
        if open != 1 {
            let rows = outage_rows(&p);
            let logs: Vec<String> = services.drain(..).map(|s| s.stop().2).collect();
            let said: Vec<&str> = logs.iter().flat_map(|l| l.lines()).filter(|l| !l.contains("ferry_storage::retry")).collect();
            panic!("{stage} did not find the {role} down: outages {rows}\n{}", said.join("\n"));
        }
    }

    let back = Instant::now();
    nn.start_namenode();
    eprintln!("the {role} NameNode was down {:.0}s and took {:.1}s to start", t0.elapsed().as_secs_f64(), back.elapsed().as_secs_f64());
    if !held_within(Duration::from_secs(300), || p.drained(files)) {
        let state = p.sql(
            "SELECT group_concat(x, '; ') FROM (SELECT stage || ' ' || state || ' ' || COUNT(*) AS x FROM tasks GROUP BY stage, state \
             UNION ALL SELECT 'file ' || state || ' ' || COUNT(*) FROM source_files GROUP BY state)",
        );
        let failed = p.sql("SELECT group_concat(stage || ' ' || outcome || ': ' || COALESCE(error, ''), '\n') FROM (SELECT * FROM attempts WHERE outcome <> 'done' ORDER BY id DESC LIMIT 20)");
        let tails: Vec<String> = services
            .drain(..)
            .map(|s| {
                let name = s.name.clone();
                format!("--- {name}\n{}", last_lines(&s.stop().2, 80))
            })
            .collect();
        panic!(
            "not drained 300s after the {role} NameNode came back: {state}\noutages {}\nlast failed attempts:\n{failed}\n{}",
            outage_rows(&p),
            tails.join("\n")
        );
    }
    eprintln!("drained {:.1}s after the NameNode came back", back.elapsed().as_secs_f64());
    for s in services.drain(..) {
        let name = s.name.clone();
        let (code, _, log) = s.stop();
        assert_eq!(code, Some(0), "{name}:\n{log}");
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0);
    assert_eq!(p.count("SELECT COUNT(*) FROM open_outages"), 0, "every outage closed: {}", outage_rows(&p));
    // One row per stage that met it, not one per chunk or per probe.
    let rows = outage_rows(&p);
    for stage in stages_that_see_it {
        let n = p.count(&format!("SELECT COUNT(*) FROM outages WHERE stage = '{stage}' AND store LIKE '{store_label} %'"));
        assert_eq!(n, 1, "{stage}: {rows}");
    }
    assert!(p.count("SELECT COUNT(*) FROM outages") <= 4, "{rows}");
    eprintln!(
        "redone: {} attempts, {} bytes",
        p.sql("SELECT COALESCE(SUM(attempts), 0) FROM redone_work"),
        p.sql("SELECT COALESCE(SUM(bytes), 0) FROM redone_work")
    );
    let got = if role == "destination" { table_on(&nn, &p) } else { p.table_digest() };
    assert_exactly_once(&got, &p);
}

#[test]
fn the_destination_namenode_stopped_for_minutes_under_four_watch_services() {
    namenode_stopped_under_four_watch_services("destination", "destination", &["copy"]);
}

#[test]
fn the_staging_namenode_stopped_for_minutes_under_four_watch_services() {
    namenode_stopped_under_four_watch_services("staging", "staging", &["transform"]);
}

/// The destination is an HA pair behind a nameservice; the active NameNode fails over twice
/// while copy and load are busy with a backlog. Nothing is quarantined, the table is exact,
/// and the work redone because of it is reported.
#[test]
fn an_ha_failover_of_the_destination_while_copy_and_load_are_busy() {
    let mut ha = MiniDfs::start_ha("HA-dest", "nsdest");
    let p = Pipeline::with_stores("16KiB", "30s", "0s", None, Some(hdfs_section("destination", &ha.url, "/wh", Some(&ha.conf_dir))));
    short_budget(&p);
    p.add_jsonl_batch("a", 8, 1500, 81);
    p.stages_ok(&["ferry-extract", "ferry-transform"]);
    let chunks = p.count("SELECT COUNT(*) FROM chunks");
    assert!(chunks >= 40, "a backlog: {chunks} chunks");
    let mut copy = p.watch("ferry-copy", &[]);
    let mut load = p.watch("ferry-load", &[]);
    wait_until("copy and load under way", Duration::from_secs(120), || {
        p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state = 'done'") >= 2
    });
    let mut failovers = Vec::new();
    for _ in 0..2 {
        let before = p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state = 'done'");
        failovers.push((ha.failover(), before));
        assert!(copy.running() && load.running(), "a failover ended a service");
        std::thread::sleep(Duration::from_secs(3));
    }
    wait_until("everything published", Duration::from_secs(300), || p.drained(8));
    let busy = failovers.iter().filter(|(_, done)| *done < chunks).count();
    assert!(busy >= 1, "no failover happened while chunks were left: {failovers:?} of {chunks}");
    for s in [copy, load] {
        let name = s.name.clone();
        let (code, _, log) = s.stop();
        assert_eq!(code, Some(0), "{name}:\n{log}");
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0);
    eprintln!(
        "failovers {failovers:?}; redone: {} attempts, {} bytes; attempts that failed: {}",
        p.sql("SELECT COALESCE(SUM(attempts), 0) FROM redone_work"),
        p.sql("SELECT COALESCE(SUM(bytes), 0) FROM redone_work"),
        p.count("SELECT COUNT(*) FROM attempts WHERE outcome <> 'done'")
    );
    let out = p.command("ferry").args(["status", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_exactly_once(&table_on(&ha, &p), &p);
}

/// Three DataNodes, three replicas, small blocks: one DataNode stops for good while copy
/// writes. Each write goes on with the two left or is resent; nothing is quarantined and the
/// table is exact. The client reads the cluster's hdfs-site.xml (`conf_dir`), as it should:
/// its replace-datanode-on-failure policy must match the NameNode's.
#[test]
fn a_datanode_lost_during_writes() {
    let mut dn = MiniDfs::start_with(
        "DN-loss",
        &[
            "--datanodes",
            "3",
            "--conf",
            "dfs.replication=3",
            "--conf",
            "dfs.blocksize=1048576",
            // The NameNode finds the lost DataNode dead in ~15 s instead of 10 minutes.
            "--conf",
            "dfs.namenode.heartbeat.recheck-interval=5000",
        ],
    );
    let p = Pipeline::with_stores("4MiB", "30s", "0s", None, Some(hdfs_section("destination", &dn.url, "/wh", Some(&dn.conf_dir))));
    short_budget(&p);
    p.add_jsonl_batch("a", 12, 40_000, 91);
    p.stages_ok(&["ferry-extract", "ferry-transform"]);
    let mut copy = p.watch("ferry-copy", &[]);
    wait_until("copy under way", Duration::from_secs(120), || {
        p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND state = 'done'") >= 1
    });
    let left = p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND state <> 'done'");
    dn.stop_datanode(1);
    assert!(left >= 1, "copy had finished before the DataNode went");
    assert!(copy.running());
    let t = Instant::now();
    while p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND state <> 'done'") > 0 {
        if t.elapsed() > Duration::from_secs(300) {
            let attempts = p.sql(
                "SELECT group_concat(chunk_id || ' ' || outcome || ': ' || coalesce(error, ''), char(10)) FROM attempts WHERE outcome <> 'done'",
            );
            let states = p.sql("SELECT group_concat(state || ' ' || n, ', ') FROM (SELECT state, COUNT(*) n FROM tasks WHERE stage = 'copy' GROUP BY state)");
            let (_, _, log) = copy.stop();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            panic!(
                "copy not done in 5 min after DataNode 1 stopped: {states}\nattempts:\n{attempts}\ncopy log (last lines, newest first):\n{}",
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let (code, _, log) = copy.stop();
    assert_eq!(code, Some(0), "{log}");
    let o = p.stage("ferry-load");
    assert!(o.status.success(), "load: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), 0);
    eprintln!(
        "{left} copies left when DataNode 1 stopped; attempts that failed: {}; redone bytes: {}",
        p.count("SELECT COUNT(*) FROM attempts WHERE outcome <> 'done'"),
        p.sql("SELECT COALESCE(SUM(bytes), 0) FROM redone_work")
    );
    assert_exactly_once(&table_on(&dn, &p), &p);
    let ok = p.command("ferry").arg("verify").output().unwrap();
    assert!(ok.status.success(), "verify: {}", String::from_utf8_lossy(&ok.stderr));
}
