//! Ferry on a kerberized HDFS: a MiniDFS cluster with a KDC of its own (Hadoop's MiniKdc, one
//! realm, EXAMPLE.COM), NameNode and DataNodes requiring Kerberos, block access tokens, RPC and
//! data transfer protection `privacy`. Staging and destination are both on it (one realm: the
//! client library reads one krb5.conf per process). Ferry logs in from its keytab; no ticket
//! cache is used (KRB5CCNAME points nowhere).

use std::time::{Duration, Instant};

use ferry_tests::clusters::MiniDfs;
use ferry_tests::{Pipeline, STAGES, input_digest, output_within, table_digest};

/// Longest any command here may run before it fails the test (they take seconds).
const LIMIT: Duration = Duration::from_secs(300);

/// A local source, staging and destination on the kerberized cluster `k`, every binary told
/// where the KDC is.
fn kerberized_pipeline(k: &MiniDfs, prefix: &str) -> Pipeline {
    let staging = k.kerberized_section("staging", &format!("/{prefix}/staging"));
    let destination = k.kerberized_section("destination", &format!("/{prefix}/wh"));
    // Leases of 30 s: a privacy-wrapped write from a debug build on a loaded 2-core machine can
    // take longer than a few seconds, and an expired lease is not what these tests are about.
    let p = Pipeline::with_stores("256KiB", "30s", "0s", Some(staging), Some(destination));
    for b in STAGES.iter().copied().chain(["ferry"]) {
        p.stage_env(b, "KRB5_CONFIG", k.krb5_conf().to_str().unwrap());
        // No ticket cache to fall back on: the keytab alone logs in.
        p.stage_env(b, "KRB5CCNAME", "FILE:/nonexistent/ferry-krb5cc");
    }
    p
}

fn ok(o: &std::process::Output, what: &str) {
    assert!(o.status.success(), "{what}: exit {:?}\n{}", o.status.code(), String::from_utf8_lossy(&o.stderr));
}

fn table_on(k: &MiniDfs, p: &Pipeline, prefix: &str) -> serde_json::Value {
    let local = p.path("table-copy");
    let _ = std::fs::remove_dir_all(&local);
    k.kerberized_fs(&["-get", &format!("/{prefix}/wh/events"), local.to_str().unwrap()]);
    table_digest(&local)
}

/// The attempts that did not end `done`, with their errors, for a failure message.
fn failed_attempts(p: &Pipeline) -> String {
    p.sql("SELECT group_concat(stage || ' ' || outcome || ': ' || coalesce(error, ''), char(10)) FROM attempts WHERE outcome <> 'done'")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[test]
fn the_four_stages_gc_verify_and_doctor_on_a_kerberized_cluster_exactly_once() {
    let k = MiniDfs::start_with("K", &["--kerberos"]);
    let prefix = format!("krb-{}", now_ms());
    let p = kerberized_pipeline(&k, &prefix);
    p.add_jsonl_batch("a", 4, 3000, 41);
    p.generate("in", "avro", "deflate", 2, 3000, 42);
    let t = Instant::now();
    for o in p.drain(10) {
        ok(&o, "a stage");
    }
    eprintln!("kerberized pipeline drained in {:?}", t.elapsed());
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), 0, "everything done");
    assert_eq!(p.count("SELECT COUNT(*) FROM attempts WHERE outcome <> 'done'"), 0, "no attempt failed: {}", failed_attempts(&p));
    // Staged chunks on the cluster, seen by Hadoop's own client as the same principal.
    let ls = String::from_utf8_lossy(&k.kerberized_fs(&["-ls", "-R", &format!("/{prefix}/staging")]).stdout).to_string();
    assert!(ls.contains(".jsonl") && ls.contains(".avro"), "{ls}");

    // The table, read back by Hadoop's client, holds every record once.
    let got = table_on(&k, &p, &prefix);
    let mut want_rows = 0;
    for fmt in ["jsonl", "avro"] {
        want_rows += input_digest(fmt, &p.path("in"))["rows"].as_i64().unwrap();
    }
    assert_eq!(got["rows"].as_i64().unwrap(), want_rows, "{got}");
    assert_eq!(got["distinct"], got["rows"], "exactly once: {got}");

    ok(&output_within(p.command("ferry").arg("verify"), LIMIT), "ferry verify");
    ok(&output_within(p.command("ferry").args(["gc", "--older-than", "1s"]), LIMIT), "ferry gc");
    let doctor = output_within(p.command("ferry").args(["doctor", "--json"]), LIMIT);
    ok(&doctor, "ferry doctor");
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    // Nothing of the keytab in what Ferry prints: the path, never the keys.
    let keytab = std::fs::read(k.keytab()).unwrap();
    let key_hex: String = keytab[keytab.len() - 16..].iter().map(|b| format!("{b:02x}")).collect();
    let config = output_within(p.command("ferry").arg("check-config"), LIMIT);
    ok(&config, "check-config");
    for out in [&doctor.stdout, &doctor.stderr, &config.stdout] {
        assert!(!String::from_utf8_lossy(out).contains(&key_hex), "key bytes printed");
    }
}

#[test]
fn tickets_that_expire_three_times_over_a_run_cost_no_call() {
    // The client's tickets live a minute (the KDC grants what krb5.conf asks), and idle RPC
    // connections close after 10 s: new connections log in again from the keytab, over and over.
    let k = MiniDfs::start_with("T", &["--kerberos", "--ticket-lifetime", "1m"]);
    let prefix = format!("krbt-{}", now_ms());
    let p = kerberized_pipeline(&k, &prefix);
    let services: Vec<_> = STAGES.iter().map(|s| p.watch(s, &[])).collect();
    let t = Instant::now();
    let mut batch = 0;
    while t.elapsed() < Duration::from_secs(200) {
        p.add_jsonl_batch(&format!("b{batch:02}"), 1, 500, 100 + batch);
        batch += 1;
        std::thread::sleep(Duration::from_secs(10));
    }
    drained_without_a_failed_call(&k, &p, &prefix, services);
    eprintln!("{batch} batches over {:?} with 1-minute tickets", t.elapsed());
}

/// Waits for the services to drain the pipeline, stops them, and checks that no call failed
/// (none on an expired ticket) and that the table holds every input field exactly once.
fn drained_without_a_failed_call(k: &MiniDfs, p: &Pipeline, prefix: &str, services: Vec<ferry_tests::Service>) {
    ferry_tests::wait_until("the pipeline drains", Duration::from_secs(180), || {
        let n = |q: &str| p.try_count(q);
        n("SELECT COUNT(*) FROM tasks WHERE state <> 'done'") == Some(0)
            && n("SELECT COUNT(*) FROM source_files WHERE state = 'registered'") == Some(0)
            && n("SELECT COUNT(*) FROM tasks WHERE stage = 'load'").is_some_and(|l| Some(l) == n("SELECT COUNT(*) FROM chunks"))
    });
    for s in services {
        let (code, _, log) = s.stop();
        assert!(matches!(code, Some(0)), "{log}");
        assert!(!log.to_ascii_lowercase().contains("expired"), "a call failed on an expired ticket:\n{log}");
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM attempts WHERE outcome <> 'done'"), 0, "no attempt failed: {}", failed_attempts(p));
    let got = table_on(k, p, prefix);
    let want = input_digest("jsonl", &p.path("in"));
    assert_eq!(got["rows"], want["rows"], "{got} vs {want}");
    assert_eq!(got["digest"], want["digest"], "every field, exactly once");
}

/// No keytab: the stages read a credential cache (`kerberos_cache`) that someone else keeps
/// fresh, here `kinit -k` every 20 s as a cron job or k5start would, with tickets that live a
/// minute. Every new connection finds a valid ticket; nothing fails.
#[test]
fn a_credential_cache_that_someone_else_renews() {
    let k = MiniDfs::start_with("C", &["--kerberos", "--ticket-lifetime", "1m"]);
    let prefix = format!("krbc-{}", now_ms());
    let p = kerberized_pipeline(&k, &prefix);
    let cache = format!("FILE:{}", p.path("krb5cc_ferry").display());
    let kinit = || {
        let o = output_within(
            std::process::Command::new("kinit")
                .args(["-k", "-t"])
                .arg(k.keytab())
                .args(["-c", &cache, MiniDfs::KERBEROS_PRINCIPAL])
                .env("KRB5_CONFIG", k.krb5_conf()),
            LIMIT,
        );
        ok(&o, "kinit");
    };
    kinit();
    let keytab_line = format!("kerberos_keytab = \"{}\"", k.keytab().display());
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    assert!(cfg.contains(&keytab_line), "{cfg}");
    std::fs::write(&p.config, cfg.replace(&keytab_line, &format!("kerberos_cache = \"{cache}\""))).unwrap();

    let services: Vec<_> = STAGES.iter().map(|s| p.watch(s, &[])).collect();
    let t = Instant::now();
    let mut batch = 0;
    while t.elapsed() < Duration::from_secs(150) {
        p.add_jsonl_batch(&format!("c{batch:02}"), 1, 500, 300 + batch);
        if batch % 2 == 1 {
            kinit();
        }
        batch += 1;
        std::thread::sleep(Duration::from_secs(10));
    }
    drained_without_a_failed_call(&k, &p, &prefix, services);
}

#[test]
fn bad_kerberos_settings_end_the_stage_at_start_with_exit_2() {
    let k = MiniDfs::start_with("B", &["--kerberos"]);
    let prefix = format!("krbb-{}", now_ms());
    let p = kerberized_pipeline(&k, &prefix);
    p.add_jsonl_batch("a", 1, 100, 7);
    ok(&p.stage("ferry-extract"), "extract with good settings");
    let good = std::fs::read_to_string(&p.config).unwrap();
    let keytab = k.keytab().display().to_string();

    let run = |binary: &str, args: &[&str]| {
        let t = Instant::now();
        let o = output_within(p.command(binary).args(args).env("RUST_LOG", "info"), LIMIT);
        (o.status.code(), String::from_utf8_lossy(&o.stderr).to_string(), t.elapsed())
    };
    // A principal that is not in the keytab, a keytab that is not there: configuration, named.
    std::fs::write(&p.config, good.replace("kerberos_principal = \"ferry@EXAMPLE.COM\"", "kerberos_principal = \"etl@EXAMPLE.COM\""))
        .unwrap();
    for binary in ["ferry-transform", "ferry-copy"] {
        let (code, log, _) = run(binary, &["--once"]);
        assert_eq!(code, Some(2), "{binary}: {log}");
        assert!(log.contains("kerberos_principal") && log.contains("etl@EXAMPLE.COM is not in the keytab"), "{log}");
        assert!(log.contains("it holds: ferry@EXAMPLE.COM"), "{log}");
    }
    std::fs::write(&p.config, good.replace(&keytab, "/etc/no-such.keytab")).unwrap();
    let (code, log, _) = run("ferry-load", &["--watch"]);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("kerberos_keytab") && log.contains("cannot read /etc/no-such.keytab"), "{log}");

    // A realm no krb5.conf names: the client cannot find its KDC. The store refuses us at start,
    // under --watch too: exit 2 at once, with what to check, not a retry loop.
    std::fs::write(&p.config, &good).unwrap();
    let empty = p.path("krb5-without-realms.conf");
    std::fs::write(&empty, "[libdefaults]\n    default_realm = EXAMPLE.COM\n").unwrap();
    let t = Instant::now();
    let o = output_within(p.command("ferry-copy").args(["--watch", "--start-wait", "5m"]).env("KRB5_CONFIG", &empty), LIMIT);
    let log = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(log.contains("refused us at start") && log.contains("Cannot find KDC for realm") && log.contains("Kerberos:"), "{log}");
    assert!(t.elapsed() < Duration::from_secs(60), "no retry loop: {:?}", t.elapsed());
    // `ferry doctor` names the failed hops and points at Kerberos; the local hops still pass.
    let o = output_within(p.command("ferry").args(["doctor", "--json", "--timeout", "20s"]).env("KRB5_CONFIG", &empty), LIMIT);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for h in v["hops"].as_array().unwrap() {
        let kerberized = h["hop"] == "staging" || h["hop"] == "destination";
        assert_eq!(h["ok"], !kerberized, "{h}");
        if kerberized {
            assert!(h["fix"].as_str().unwrap_or_default().starts_with("Kerberos:"), "{h}");
        }
    }

    // Clocks too far apart: the client's a day ahead (libfaketime). MIT's library corrects for
    // the offset it sees in the KDC's reply (`kdc_timesync`, on by default), so only a host
    // that turned that off meets the skew; then it is a setting, named, at start.
    let strict = p.path("krb5-no-timesync.conf");
    let conf = std::fs::read_to_string(k.krb5_conf()).unwrap();
    assert!(conf.contains("[libdefaults]"), "{conf}");
    std::fs::write(&strict, conf.replacen("[libdefaults]", "[libdefaults]\n    kdc_timesync = 0", 1)).unwrap();
    let lib = faketime_lib().expect("libfaketime is not installed: the test command installs it (faketime from Debian)");
    let o = output_within(
        p.command("ferry-copy")
            .args(["--watch", "--start-wait", "5m"])
            .env("KRB5_CONFIG", &strict)
            .env("LD_PRELOAD", &lib)
            .env("FAKETIME", "+1d"),
        LIMIT,
    );
    let log = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(log.contains("Clock skew too great") && log.contains("clocks agree"), "{log}");
    // The good settings still work: nothing above left anything behind.
    for o in p.drain(6) {
        ok(&o, "a stage after the bad runs");
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), 0);
}

fn faketime_lib() -> Option<String> {
    ["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .map(str::to_string)
}
