//! Several hosts on one Postgres ledger, each in its own network namespace with its own spool
//! directory and spool node, all four stages running as services on each. One host is cut off
//! mid-run (its link down, its processes left running: a zombie): the others take over its
//! leases and publish everything that does not need its spool; the Parquet on its spool waits
//! for it. When its link comes back it ships that, its late ledger writes for chunks that were
//! taken over are refused, and the table holds every input record exactly once.
//!
//! Needs root for `ip netns` (the test command runs as root).

use std::time::Duration;

use ferry_tests::netns::{Host, Hosts};
use ferry_tests::postgres::Postgres;
use ferry_tests::{Pipeline, STAGES, Service, input_digest, temp_files, wait_until};

/// `stages` as services on `host`, with its own spool.
fn start_host(p: &Pipeline, host: &Host, stages: &[&str]) -> Vec<Service> {
    let spool = p.path(&format!("spool-{}", host.name));
    stages
        .iter()
        .map(|s| {
            p.watch_on(s, &[], |mut c| {
                c.env("FERRY_SPOOL_DIR", &spool).env("FERRY_SPOOL_NODE", &host.name);
                host.run(&c)
            })
        })
        .collect()
}

/// `lease_owner LIKE` patterns matching the workers of `services` (a worker name holds its pid).
fn owned_by(column: &str, services: &[Service]) -> String {
    let any: Vec<String> = services.iter().map(|s| format!("{column} LIKE '%:{}:%'", s.child.id())).collect();
    format!("({})", any.join(" OR "))
}

#[test]
fn hosts_share_the_work_and_a_cut_off_host_is_fenced_off() {
    let hosts = Hosts::new(3);
    let pg = Postgres::start_on(false, &[(&hosts.gateway, &hosts.subnet)]);
    let p = Pipeline::new("48KiB", "3s", "0s");
    // A host that finds the ledger gone probes it again within 2 s, not 5 minutes.
    let cfg = std::fs::read_to_string(&p.config).unwrap().replace("lease = \"3s\"", "lease = \"3s\"\noutage_probe_max = \"2s\"");
    assert!(cfg.contains("outage_probe_max"), "{cfg}");
    std::fs::write(&p.config, cfg).unwrap();
    p.use_ledger(&pg.url_at(&hosts.gateway));
    p.generate("in", "jsonl", "null", 6, 4000, 21);
    let want = input_digest("jsonl", &p.path("in"));
    let (zombie, others) = (&hosts.hosts[0], &hosts.hosts[1..]);

    // The zombie starts alone, without its copy (its cron job has not fired yet), and is cut
    // off once it has transformed a chunk (its Parquet on its own spool) and holds a lease.
    let mut zombie_services = start_host(&p, zombie, &["ferry-extract", "ferry-transform", "ferry-load"]);
    let zombie_workers = owned_by("lease_owner", &zombie_services);
    // The cut must find it holding a lease: what it held is read after the cut, when nothing
    // it does reaches the ledger any more (tried again should it have just finished).
    let mut held = 0;
    for _ in 0..5 {
        wait_until("the first host transformed a chunk and holds a lease", Duration::from_secs(120), || {
            pg.count(&format!("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND node = '{}'", zombie.name)) > 0
                && pg.count(&format!("SELECT COUNT(*) FROM tasks WHERE state = 'running' AND {zombie_workers}")) > 0
        });
        zombie.cut();
        std::thread::sleep(Duration::from_secs(1));
        held = pg.count(&format!("SELECT COUNT(*) FROM tasks WHERE state = 'running' AND {zombie_workers}"));
        if held > 0 {
            break;
        }
        zombie.reconnect();
    }
    assert!(held > 0, "the first host never held a lease when cut off");
    zombie_services.extend(start_host(&p, zombie, &["ferry-copy"]));
    let mut services: Vec<Service> = others.iter().flat_map(|h| start_host(&p, h, &STAGES)).collect();

    // The others finish everything that does not need the zombie's spool, and take over the
    // leases it held: none stays running, and they show in the history as expired attempts of
    // its workers. (Waiting for "none running" rather than a count read at the cut: a
    // statement the server had already received may still commit after it.)
    let zombie_attempts = owned_by("worker", &zombie_services);
    let not_on_zombie = format!("NOT (stage = 'copy' AND node = '{}')", zombie.name);
    wait_until("the other hosts finished what they can", Duration::from_secs(300), || {
        pg.count("SELECT COUNT(*) FROM source_files WHERE state <> 'registered'") == 6
            && pg.count(&format!("SELECT COUNT(*) FROM tasks WHERE state <> 'done' AND {not_on_zombie}")) == 0
            && pg.count(&format!("SELECT COUNT(*) FROM tasks WHERE state = 'running' AND {zombie_workers}")) == 0
    });
    assert!(
        pg.count(&format!("SELECT COUNT(*) FROM attempts WHERE outcome = 'lease_expired' AND {zombie_attempts}")) > 0,
        "the zombie's leases were taken over"
    );
    let waiting = pg.count(&format!("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND node = '{}' AND state <> 'done'", zombie.name));
    assert!(waiting > 0, "the zombie's spooled chunks wait for it");
    assert_eq!(
        pg.count(&format!("SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND node = '{}' AND state = 'done'", zombie.name)),
        0,
        "nobody else copied from the zombie's spool"
    );
    assert!(
        pg.count(&format!("SELECT COUNT(*) FROM attempts WHERE outcome = 'done' AND {zombie_attempts}")) > 0,
        "the zombie did work before the cut"
    );
    let published_while_cut = pg.count("SELECT COUNT(*) FROM published");
    assert!(published_while_cut > 0);

    // The link comes back: the zombie ships its spool, and what it finished for chunks taken
    // over from it is refused.
    zombie.reconnect();
    let t0 = std::time::Instant::now();
    while pg.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'") > 0
        || pg.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load'") < pg.count("SELECT COUNT(*) FROM chunks")
    {
        if t0.elapsed() > Duration::from_secs(180) {
            let left = pg.sql("SELECT stage || ' ' || state || ' ' || COALESCE(node, '-') || ' ' || COALESCE(lease_owner, '-') || ' ' || COALESCE(last_error, '') FROM tasks WHERE state <> 'done'");
            let logs: Vec<String> = zombie_services.drain(..).map(|s| s.stop().2).collect();
            panic!("not everything published after the zombie came back:\n{left}\nzombie logs:\n{}", logs.join("\n---\n"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let other_attempts = owned_by("worker", &services);
    let mut zombie_log = String::new();
    for s in zombie_services.drain(..) {
        let (code, _, log) = s.stop();
        assert_eq!(code, Some(0), "{log}");
        zombie_log += &log;
    }
    for s in services.drain(..) {
        let (code, _, log) = s.stop();
        assert_eq!(code, Some(0), "{log}");
    }
    assert!(zombie_log.contains("lease lost on task"), "the zombie's late writes were refused: {zombie_log}");

    // Exactly once: every record, no chunk done twice in any stage, no published file twice.
    let got = p.table_digest();
    assert_eq!(got["rows"], want["rows"]);
    assert_eq!(got["distinct"], want["distinct"], "each record exactly once");
    assert_eq!(got["digest"], want["digest"]);
    assert_eq!(
        pg.count("SELECT COUNT(*) FROM (SELECT task_id FROM attempts WHERE outcome = 'done' GROUP BY task_id HAVING COUNT(*) > 1) d"),
        0
    );
    assert_eq!(pg.count("SELECT COUNT(*) FROM published"), pg.count("SELECT COUNT(DISTINCT path) FROM published"));
    assert!(
        pg.count(&format!("SELECT COUNT(*) FROM attempts WHERE outcome = 'done' AND {other_attempts}")) > 0,
        "the other hosts did work"
    );

    // gc on each host leaves no temp file and no spool behind.
    for h in &hosts.hosts {
        let spool = p.path(&format!("spool-{}", h.name));
        let out = p.command("ferry").env("FERRY_SPOOL_DIR", &spool).args(["gc", "--older-than", "0s"]).output().unwrap();
        assert!(out.status.success(), "gc: {}", String::from_utf8_lossy(&out.stderr));
        let left: Vec<_> = walk(&spool.join("events"));
        assert!(left.is_empty(), "{}: {left:?}", h.name);
    }
    assert!(temp_files(p.dir.path()).is_empty(), "temp files left: {:?}", temp_files(p.dir.path()));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                out.extend(walk(&e.path()));
            } else {
                out.push(e.path());
            }
        }
    }
    out
}
