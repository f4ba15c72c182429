//! `ferry doctor` against the real servers of the suite (local dirs, SQLite, Postgres, the S3
//! test server behind TLS, MiniDFS), one failure of each kind, and `--watch` stages whose
//! endpoint is wrong at start (they exit after `--start-wait`, instead of probing for ever).

use std::process::Output;
use std::time::{Duration, Instant};

use ferry_tests::clusters::{MiniDfs, S3Server};
use ferry_tests::proxy::{FaultProxy, Faults};
use ferry_tests::{ClosedPort, Pipeline, files_under};

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn doctor(p: &Pipeline, extra: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let out: Output = p.command("ferry").args(["doctor", "--json", "--timeout", "4s"]).args(extra).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let v: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("doctor --json printed no JSON ({e}): {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), v, stdout)
}

fn hop<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["hops"].as_array().unwrap().iter().find(|h| h["hop"] == name).unwrap_or_else(|| panic!("no hop {name} in {v}"))
}

/// Replaces the whole `[destination]` section (the last section but `[table]`...) of the config.
fn set_destination(p: &Pipeline, section: &str) {
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    let start = cfg.find("[destination]").unwrap();
    let end = cfg.find("[table]").unwrap();
    std::fs::write(&p.config, format!("{}{section}\n{}", &cfg[..start], &cfg[end..])).unwrap();
}

/// The hop failed, and its error and fix say what the test expects.
#[track_caller]
fn failed_with(v: &serde_json::Value, name: &str, error_has: &str, fix_starts: &str) {
    let h = hop(v, name);
    assert_eq!(h["ok"], false, "{name} should fail: {h}");
    assert_eq!(v["ok"], false, "{v}");
    let error = h["error"].as_str().unwrap_or_default().to_ascii_lowercase();
    assert!(error.contains(&error_has.to_ascii_lowercase()), "{name}'s error should mention {error_has:?}: {h}");
    let fix = h["fix"].as_str().unwrap_or_default();
    assert!(fix.starts_with(fix_starts), "{name}'s fix should start with {fix_starts:?}: {h}");
}

#[test]
fn doctor_walks_every_hop_of_a_local_pipeline_and_leaves_nothing_behind() {
    let p = Pipeline::new("1MiB", "5s", "0s");
    // Before the ledger exists (a fresh install): the first stage run will create it, so the
    // hop passes and says so; doctor itself creates nothing.
    let (code, v, _) = doctor(&p, &[]);
    assert_eq!(code, Some(0), "{v}");
    for name in ["ledger", "source", "staging", "spool", "destination"] {
        assert_eq!(hop(&v, name)["ok"], true, "{v}");
    }
    assert!(hop(&v, "ledger")["steps"].to_string().contains("not created yet"), "{v}");
    assert!(!p.path("ledger.db").exists(), "doctor must not create the ledger");
    let entries = |d: &std::path::Path| std::fs::read_dir(d).unwrap().count();
    let before = entries(&p.path(""));
    // A ledger whose directory is missing would never be created: that fails, naming it.
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    let ledger_url = format!("sqlite://{}", p.path("ledger.db").display());
    assert!(cfg.contains(&ledger_url), "{cfg}");
    std::fs::write(&p.config, cfg.replace(&ledger_url, &format!("sqlite://{}", p.path("no-such-dir/ledger.db").display()))).unwrap();
    let (code, v, _) = doctor(&p, &[]);
    assert_eq!(code, Some(1), "{v}");
    failed_with(&v, "ledger", "no-such-dir", "");
    std::fs::write(&p.config, &cfg).unwrap();
    assert_eq!(entries(&p.path("")), before, "doctor left a file next to the ledger");

    assert!(p.command("ferry").arg("migrate").status().unwrap().success());
    let (code, v, _) = doctor(&p, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["ok"], true);
    let hops: Vec<_> = v["hops"].as_array().unwrap().iter().map(|h| h["hop"].as_str().unwrap().to_string()).collect();
    assert_eq!(hops, ["ledger", "source", "staging", "spool", "destination"]);
    // A store that Ferry writes to got the whole round: write, read back, hash, rename, delete.
    let steps = hop(&v, "destination")["steps"].to_string();
    for step in ["list", "write", "read back", "hash on the store", "rename", "delete", "check it is gone"] {
        assert!(steps.contains(step), "{step} missing from {steps}");
    }
    // The source is only listed (disposition keep: Ferry never writes there).
    assert_eq!(hop(&v, "source")["steps"].as_array().unwrap().len(), 1, "{v}");
    assert!(hop(&v, "ledger")["steps"].to_string().contains("write transaction"), "{v}");
    // No probe file anywhere.
    for d in ["in", "staging", "spool", "wh"] {
        let left: Vec<_> = files_under(&p.path(d)).into_iter().filter(|f| f.to_string_lossy().contains(".doctor-")).collect();
        assert!(left.is_empty(), "{d}: {left:?}");
    }
    // The text form: one line per hop, and the count.
    let out = p.command("ferry").arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.lines().filter(|l| l.starts_with("ok ")).count() == 5 && text.contains("5 hop(s): 5 ok, 0 failed"), "{text}");

    // With disposition = "delete" Ferry removes source files: the source gets the whole round.
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replace("[source]\n", "[source]\ndisposition = \"delete\"\n")).unwrap();
    let (code, v, _) = doctor(&p, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert!(hop(&v, "source")["steps"].to_string().contains("rename"), "{v}");

    // A destination under a regular file: the write fails, and the hop says which step.
    std::fs::write(p.path("not-a-dir"), b"x").unwrap();
    set_destination(&p, &format!("[destination]\nurl = \"{}\"\n", p.path("not-a-dir/wh").display()));
    let (code, v, _) = doctor(&p, &[]);
    assert_eq!(code, Some(1), "{v}");
    let h = hop(&v, "destination");
    assert_eq!(h["ok"], false, "{v}");
    assert!(h["error"].as_str().unwrap().starts_with("list:") || h["error"].as_str().unwrap().starts_with("write:"), "{h}");
    assert_eq!(hop(&v, "staging")["ok"], true, "one failed hop does not stop the others: {v}");
}

#[test]
fn doctor_tells_each_kind_of_s3_and_postgres_failure_with_its_fix() {
    let s3 = S3Server::from_env();
    let prefix = format!("doctor-{}", now_ms());
    let good = s3.destination_toml(&prefix, &s3.endpoint, 1, "3s");
    let p = Pipeline::with_stores("1MiB", "5s", "0s", None, Some(good.clone()));
    let pg = std::env::var("FERRY_TEST_POSTGRES").expect("FERRY_TEST_POSTGRES (the test command starts PostgreSQL)");
    p.use_ledger(&pg);

    let (code, v, _) = doctor(&p, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert!(hop(&v, "ledger")["steps"].to_string().contains("postgres"), "{v}");
    assert!(hop(&v, "destination")["url"].as_str().unwrap().starts_with("s3://"), "{v}");

    // Credentials: a secret key that is not the server's.
    set_destination(&p, &good.replace(&format!("secret_access_key = \"{}\"", s3.secret_key), "secret_access_key = \"wrong-secret\""));
    let (code, v, _) = doctor(&p, &[]);
    assert_eq!(code, Some(1), "{v}");
    failed_with(&v, "destination", "list", "credentials");
    assert!(!v.to_string().contains("wrong-secret"), "the secret must not be printed: {v}");

    // TLS: no CA bundle, so the test CA's certificate is not trusted.
    let no_ca = good.lines().filter(|l| !l.starts_with("ca_bundle")).collect::<Vec<_>>().join("\n");
    set_destination(&p, &no_ca);
    let (_, v, _) = doctor(&p, &[]);
    failed_with(&v, "destination", "certificate", "TLS");

    // DNS: a name that cannot resolve (.invalid is reserved for that).
    set_destination(&p, &good.replace(&s3.endpoint, "https://no-such-host.invalid:9443"));
    let (_, v, _) = doctor(&p, &[]);
    failed_with(&v, "destination", "list", "DNS");

    // A port nothing listens on (held so for the test).
    let closed_port = ClosedPort::new();
    set_destination(&p, &good.replace(&s3.endpoint, &format!("https://127.0.0.1:{}", closed_port.port)));
    let (_, v, _) = doctor(&p, &[]);
    failed_with(&v, "destination", "refused", "nothing listens");

    // A server that accepts and never answers: the step's deadline ends the hop.
    let proxy = FaultProxy::start(s3.addr, 7);
    proxy.set(Faults { hang: 1.0, ..Faults::default() });
    set_destination(&p, &good.replace(&s3.endpoint, &format!("https://{}", proxy.addr)));
    let t = Instant::now();
    let (_, v, _) = doctor(&p, &[]);
    failed_with(&v, "destination", "list", "no answer");
    assert!(t.elapsed() < Duration::from_secs(60), "a hung store held doctor for {:?}", t.elapsed());
    set_destination(&p, &good);

    // The ledger: a port nothing listens on, then a database that does not exist.
    let port = pg.rsplit_once(':').unwrap().1.split('/').next().unwrap().to_string();
    let closed = pg.replace(&format!(":{port}/"), &format!(":{}/", closed_port.port));
    let (_, v, _) = doctor(&p, &["--ledger", &closed]);
    failed_with(&v, "ledger", "connect", "nothing listens");
    assert_eq!(hop(&v, "destination")["ok"], true, "{v}");
    let missing = format!("{}/no_such_db", pg.rsplit_once('/').unwrap().0);
    let (_, v, _) = doctor(&p, &["--ledger", &missing]);
    failed_with(&v, "ledger", "does not exist", "missing");
}

#[test]
fn doctor_on_hdfs_does_the_whole_round_and_names_a_permission_it_lacks() {
    // Permissions on (the suite's clusters run without them), so that a user may be refused.
    let nn = MiniDfs::start_with("D", &["--conf", "dfs.permissions.enabled=true"]);
    let prefix = format!("doctor-{}", now_ms());
    let dest = format!("[destination]\nurl = \"{}/{prefix}\"\n", nn.url);
    let p = Pipeline::with_stores("1MiB", "5s", "0s", None, Some(dest.clone()));
    assert!(p.command("ferry").arg("migrate").status().unwrap().success());
    let (code, v, _) = doctor(&p, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert!(hop(&v, "destination")["steps"].to_string().contains("rename"), "{v}");
    let ls = nn.fs(&["-ls", "-R", &format!("/{prefix}")]);
    assert!(!String::from_utf8_lossy(&ls.stdout).contains(".doctor-"), "a probe file was left: {}", String::from_utf8_lossy(&ls.stdout));

    // Another user may not write below a directory the superuser owns with mode 755.
    let locked = format!("/{prefix}-locked");
    assert!(nn.fs(&["-mkdir", "-p", &locked]).status.success());
    assert!(nn.fs(&["-chmod", "755", &locked]).status.success());
    set_destination(&p, &format!("[destination]\nurl = \"{}{locked}\"\n[destination.store.hdfs]\nuser = \"nobody\"\n", nn.url));
    let (code, v, _) = doctor(&p, &[]);
    assert_eq!(code, Some(1), "{v}");
    failed_with(&v, "destination", "write", "permission");
}

/// Runs `binary --watch --start-wait <wait>` and waits for it to exit by itself.
fn exits_at_start(p: &Pipeline, binary: &str, wait: &str, limit: Duration) -> (i32, String, Duration) {
    let t = Instant::now();
    let mut svc = p.watch(binary, &["--start-wait", wait]);
    while svc.running() {
        assert!(t.elapsed() < limit, "{binary} still running after {limit:?}: it should give up at start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, _, log) = svc.stop();
    (code.expect("an exit code"), log, t.elapsed())
}

#[test]
fn a_watch_stage_whose_endpoint_is_wrong_at_start_exits_after_its_start_wait() {
    let s3 = S3Server::from_env();
    let prefix = format!("startwait-{}", now_ms());
    let good = s3.destination_toml(&prefix, &s3.endpoint, 1, "3s");
    let p = Pipeline::with_stores("1MiB", "5s", "0s", None, Some(good.clone()));

    // A name that does not resolve: configuration, exit 2, after the wait.
    set_destination(&p, &good.replace(&s3.endpoint, "https://no-such-host.invalid:9443"));
    let (code, log, took) = exits_at_start(&p, "ferry-copy", "3s", Duration::from_secs(60));
    assert_eq!(code, 2, "{log}");
    assert!(log.contains("destination") && log.contains("did not answer at start") && log.contains("DNS"), "{log}");
    assert!(took >= Duration::from_secs(2), "it should wait a while first: {took:?}");

    // A refused port: exit 1 (a supervisor restarts it: the server may be starting).
    let closed_port = ClosedPort::new();
    set_destination(&p, &good.replace(&s3.endpoint, &format!("https://127.0.0.1:{}", closed_port.port)));
    let (code, log, _) = exits_at_start(&p, "ferry-load", "2s", Duration::from_secs(60));
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("nothing listens"), "{log}");

    // Credentials the server refuses: configuration, exit 2, at once (waiting cannot cure it).
    set_destination(&p, &good.replace(&format!("secret_access_key = \"{}\"", s3.secret_key), "secret_access_key = \"wrong\""));
    let (code, log, took) = exits_at_start(&p, "ferry-copy", "5m", Duration::from_secs(60));
    assert_eq!(code, 2, "{log}");
    // A HEAD answers 403 with no body: a wrong secret and a missing grant look the same.
    assert!(log.contains("refused us at start") && log.contains("secret key"), "{log}");
    assert!(took < Duration::from_secs(30), "a refusal should end it without the 5 minute wait: {took:?}");

    // Extract's staging on S3 with a hung server: no answer, exit 1 after the wait.
    let proxy = FaultProxy::start(s3.addr, 9);
    proxy.set(Faults { hang: 1.0, ..Faults::default() });
    let staging =
        s3.destination_toml(&format!("{prefix}-staging"), &format!("https://{}", proxy.addr), 0, "2s").replace("[destination", "[staging");
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    let (start, end) = (cfg.find("[staging]").unwrap(), cfg.find("[spool]").unwrap());
    std::fs::write(&p.config, format!("{}{staging}\n{}", &cfg[..start], &cfg[end..])).unwrap();
    let (code, log, _) = exits_at_start(&p, "ferry-extract", "3s", Duration::from_secs(120));
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("staging") && log.contains("did not answer at start"), "{log}");

    // The ledger on a port nothing listens on: bounded too.
    let q = Pipeline::new("1MiB", "5s", "0s");
    let cfg = std::fs::read_to_string(&q.config).unwrap();
    let line = cfg.lines().find(|l| l.starts_with("url = \"sqlite://")).unwrap().to_string();
    std::fs::write(&q.config, cfg.replace(&line, &format!("url = \"postgres://postgres@127.0.0.1:{}/postgres\"", closed_port.port)))
        .unwrap();
    let (code, log, _) = exits_at_start(&q, "ferry-transform", "3s", Duration::from_secs(60));
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("ledger") && log.contains("did not answer at start"), "{log}");
}
