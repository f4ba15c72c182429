//! Ferry as an operator watches it: the four stages as --watch services scraped by a real
//! Prometheus server, the textfile of a --once run read by promtool, /healthz, systemd's notify
//! protocol, `--help` and `--version`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ferry_tests::{Pipeline, STAGES, bin};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A server of its own (it cannot be handed a bound socket) started by `start` on a port found
/// free; tried again on another, five times at most, when `start` says None (something took
/// the port before the server bound it).
fn on_a_free_port<T>(what: &str, mut start: impl FnMut(u16) -> Option<T>) -> T {
    (0..5).find_map(|_| start(free_port())).unwrap_or_else(|| panic!("{what} did not start on any of five ports"))
}

fn sigterm(c: &mut Child) {
    let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
}

/// GET http://127.0.0.1:port/path -> (status code, body).
fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (code, body)
}

/// A Prometheus server (Debian's `prometheus`, installed by the test command) scraping `targets`
/// every second; killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Prometheus (a server of its own: it cannot be handed a bound socket) on a port found
    /// free; started again on another if something took that port before it bound it.
    fn start(targets: &[u16]) -> Prometheus {
        on_a_free_port("prometheus", |port| Prometheus::start_on(targets, port))
    }

    fn start_on(targets: &[u16], port: u16) -> Option<Prometheus> {
        let dir = tempfile::tempdir().unwrap();
        let targets: Vec<String> = targets.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: ferry\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("prometheus is installed by scripts/test.sh (Debian's prometheus package)");
        let mut p = Prometheus { child, port, _dir: dir };
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if p.child.try_wait().unwrap().is_some() {
                return None; // its port was taken: it exits at once
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "prometheus did not start");
            std::thread::sleep(Duration::from_millis(200));
        }
        Some(p)
    }

    /// An instant query: (status, result vector as (labels, value)).
    fn query(&self, q: &str) -> (String, Vec<(serde_json::Value, f64)>) {
        let enc: String = q
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        let (_, body) = get(self.port, &format!("/api/v1/query?query={enc}"));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{q}: {e}: {body}"));
        let status = v["status"].as_str().unwrap_or("").to_string();
        let result = v["data"]["result"]
            .as_array()
            .map(|r| r.iter().map(|s| (s["metric"].clone(), s["value"][1].as_str().unwrap_or("nan").parse().unwrap_or(f64::NAN))).collect())
            .unwrap_or_default();
        if status != "success" {
            return (format!("{status}: {}", v["error"]), result);
        }
        (status, result)
    }

    /// The value of a query that returns one series, once Prometheus has it equal to `want`.
    fn wait_for(&self, q: &str, want: f64, within: Duration) -> f64 {
        let t0 = Instant::now();
        loop {
            let (status, r) = self.query(q);
            assert_eq!(status, "success", "{q}");
            let got = r.first().map(|x| x.1);
            if got == Some(want) || t0.elapsed() > within {
                return got.unwrap_or(f64::NAN);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn four_watch_services_under_a_real_prometheus_scrape() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "avro", "deflate", 3, 2000, 7);
    let m = Command::new(bin("ferry")).args(["--ledger", &p.ledger_url(), "migrate"]).output().unwrap();
    assert!(m.status.success());
    // Each service binds a free port itself and says which (see `watch_started`); Prometheus
    // is then told where to scrape.
    let services: Vec<ferry_tests::Service> = STAGES.iter().map(|s| p.watch_started(s, &["--progress-interval", "1s"])).collect();
    let ports: Vec<u16> = services.iter().map(|s| s.metrics_port.unwrap()).collect();
    let prom = Prometheus::start(&ports);

    // Everything published: the load stage's view of the ledger says so, as scraped.
    let chunks = {
        let t0 = Instant::now();
        loop {
            let done = p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state = 'done'");
            let total = p.count("SELECT COUNT(*) FROM chunks");
            if total > 0 && done == total && p.count("SELECT COUNT(*) FROM source_files WHERE state = 'registered'") == 0 {
                break total;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "pipeline did not drain");
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    let c = chunks as f64;
    let got = prom.wait_for(r#"sum(ferry_chunks_total{stage="load",outcome="done"})"#, c, Duration::from_secs(30));
    assert_eq!(got, c, "load's counter of done chunks");
    let got = prom.wait_for(r#"sum(ferry_records_total{stage="transform"})"#, 6000.0, Duration::from_secs(10));
    assert_eq!(got, 6000.0, "records transformed");
    // Every stage reports the ledger's view; the copy stage's gauge of done load tasks:
    let q = format!(r#"ferry_backlog_chunks{{stage="load",state="done",instance="127.0.0.1:{}"}}"#, ports[2]);
    assert_eq!(prom.wait_for(&q, c, Duration::from_secs(30)), c);
    assert_eq!(prom.wait_for(r#"max(ferry_backlog_chunks{state="quarantined"})"#, 0.0, Duration::from_secs(5)), 0.0);
    assert_eq!(prom.wait_for("min(ferry_healthy)", 1.0, Duration::from_secs(5)), 1.0);
    assert_eq!(prom.wait_for(r#"count(ferry_last_success_timestamp_seconds{stage="load"})"#, 4.0, Duration::from_secs(30)), 4.0);
    assert_eq!(prom.wait_for(r#"sum(ferry_files_total{outcome="chunked"})"#, 3.0, Duration::from_secs(10)), 3.0);
    // Waited for like the others: each target is scraped on its own schedule, so copy's last
    // scrape can predate its last chunk even after load's has shown that chunk done.
    let q = r#"sum(ferry_attempt_duration_seconds_count{stage="copy",outcome="done"})"#;
    assert_eq!(prom.wait_for(q, c, Duration::from_secs(30)), c, "an attempt duration per copied chunk");
    // /healthz of every service, and the HTTP basics.
    for port in &ports {
        assert_eq!(get(*port, "/healthz"), (200, "ok\n".into()));
        assert_eq!(get(*port, "/nope").0, 404);
    }
    // What deploy/ ships must evaluate against these series: every alert expression and every
    // dashboard query.
    let rules: serde_json::Value = {
        let out = Command::new("python3")
            .args(["-c", "import json,sys,yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))"])
            .arg(ferry_tests::clusters::repo_root().join("deploy/prometheus/alerts.yml"))
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let mut exprs: Vec<String> =
        rules["groups"][0]["rules"].as_array().unwrap().iter().map(|r| r["expr"].as_str().unwrap().to_string()).collect();
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(ferry_tests::clusters::repo_root().join("deploy/grafana/ferry-dashboard.json")).unwrap(),
    )
    .unwrap();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for e in &exprs {
        assert_eq!(prom.query(e).0, "success", "{e}");
    }
    // The quarantine alert's expression is quiet on a clean run.
    let (_, firing) = prom.query(rules["groups"][0]["rules"][0]["expr"].as_str().unwrap());
    assert!(firing.is_empty(), "{firing:?}");

    for (name, s) in STAGES.iter().zip(services) {
        let (code, _, err) = s.stop();
        assert_eq!(code, Some(0), "{name}: {err}");
        assert!(err.contains("stage starting") && err.contains("stage stopped"), "{name}: {err}");
        let term = err.lines().find(|l| l.contains("shutdown requested")).unwrap_or_else(|| panic!("{name}: {err}"));
        assert!(term.contains(" INFO "), "{name}: SIGTERM is INFO, not a warning: {term}");
        assert!(err.contains("progress"), "{name} logs progress under --watch: {err}");
    }
}

#[test]
fn a_once_run_leaves_a_textfile_node_exporter_reads() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 2, 500, 3);
    let dir = p.path("textfile");
    std::fs::create_dir_all(&dir).unwrap();
    for s in STAGES {
        let out = p.command(s).args(["--once", "--metrics-textfile"]).arg(&dir).output().unwrap();
        assert!(out.status.success(), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
    for s in ["extract", "transform", "copy", "load"] {
        let f = dir.join(format!("ferry_{s}.prom"));
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(text.contains(&format!("ferry_last_run_exit_code{{pipeline=\"default\",stage=\"{s}\"}} 0")), "{text}");
        assert!(text.contains("ferry_last_run_timestamp_seconds"), "{text}");
        // node_exporter's parser, by way of promtool (lint included).
        let mut check = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        check.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = check.wait_with_output().unwrap();
        assert!(out.status.success(), "{s}: {}{}\n{text}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    let load = std::fs::read_to_string(dir.join("ferry_load.prom")).unwrap();
    let chunks = p.count("SELECT COUNT(*) FROM chunks");
    assert!(load.contains(&format!("ferry_chunks_total{{pipeline=\"default\",stage=\"load\",outcome=\"done\"}} {chunks}")), "{load}");
    assert!(load.contains("ferry_backlog_chunks{pipeline=\"default\",stage=\"load\",state=\"done\"}"), "{load}");
    // Nothing but the files: the temp names are gone.
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
}

/// A Prometheus Pushgateway (Debian's `prometheus-pushgateway`, installed by the test command),
/// on a port found free (started again on another if something took it first); killed on drop.
struct Pushgateway {
    child: Child,
    port: u16,
}

impl Pushgateway {
    fn start() -> Pushgateway {
        on_a_free_port("the pushgateway", |port| {
            let child = Command::new("prometheus-pushgateway")
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("prometheus-pushgateway is installed by scripts/test.sh (Debian's package)");
            let mut g = Pushgateway { child, port };
            let t0 = Instant::now();
            loop {
                if g.child.try_wait().unwrap().is_some() {
                    return None; // its port was taken: it exits at once
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() && get(port, "/-/ready").0 == 200 {
                    return Some(g);
                }
                assert!(t0.elapsed() < Duration::from_secs(30), "the pushgateway did not start");
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    }
}

impl Drop for Pushgateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--metrics-push`: each --once run (a Kubernetes CronJob's, which nothing scrapes) leaves its
/// metrics in a Pushgateway, one group per stage and pipeline that the next run replaces; a
/// Pushgateway that is down or hangs is logged and costs the run nothing else.
#[test]
fn once_runs_push_their_metrics_to_a_pushgateway() {
    let gw = Pushgateway::start();
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 2, 500, 3);
    let url = format!("http://127.0.0.1:{}", gw.port);
    for s in STAGES {
        let out = p.command(s).arg("--once").env("FERRY_METRICS_PUSH", &url).output().unwrap();
        assert!(out.status.success(), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // A series of `name` carrying every one of `labels` (the Pushgateway adds its own, such as
    // instance=""), with `value` when given.
    let has = |text: &str, name: &str, labels: &[String], value: Option<&str>| {
        text.lines().any(|l| {
            l.starts_with(&format!("{name}{{"))
                && labels.iter().all(|x| l.contains(x.as_str()))
                && value.is_none_or(|v| l.rsplit(' ').next() == Some(v))
        })
    };
    let (code, text) = get(gw.port, "/metrics");
    assert_eq!(code, 200);
    let chunks = p.count("SELECT COUNT(*) FROM chunks").to_string();
    let of = |s: &str| vec![format!("job=\"ferry_{s}\""), "pipeline=\"default\"".to_string()];
    for s in ["extract", "transform", "copy", "load"] {
        let mut labels = of(s);
        labels.push(format!("stage=\"{s}\""));
        assert!(has(&text, "ferry_last_run_exit_code", &labels, Some("0")), "{s}'s exit code in\n{text}");
        assert!(has(&text, "push_time_seconds", &of(s), None), "{s} pushed:\n{text}");
    }
    let mut done = of("load");
    done.extend(["stage=\"load\"".to_string(), "outcome=\"done\"".to_string()]);
    assert!(has(&text, "ferry_chunks_total", &done, Some(&chunks)), "load's {chunks} chunks done in\n{text}");
    // The next run replaces its group: load again, nothing to do, no chunk done this time.
    let out = p.command("ferry-load").arg("--once").env("FERRY_METRICS_PUSH", &url).output().unwrap();
    assert!(out.status.success());
    let (_, again) = get(gw.port, "/metrics");
    assert!(!has(&again, "ferry_chunks_total", &done, Some(&chunks)), "the second load run's group replaced the first's:\n{again}");
    assert!(has(&again, "push_time_seconds", &of("load"), None), "{again}");
    // Gone, or hanging: the run ends as it would have, and says why there are no metrics.
    let gone = ferry_tests::ClosedPort::new();
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    for (what, at) in [("refused", gone.port), ("hung", hung.local_addr().unwrap().port())] {
        let t0 = Instant::now();
        let out = p.command("ferry-load").arg("--once").env("FERRY_METRICS_PUSH", format!("http://127.0.0.1:{at}")).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {err}");
        assert!(err.contains("cannot push the metrics"), "{what}: {err}");
        assert!(t0.elapsed() < Duration::from_secs(30), "{what}: the push is bounded: {:?}", t0.elapsed());
    }
    // A URL that is not one is refused at start, naming the flag.
    let out = p.command("ferry-load").args(["--once", "--metrics-push", "https://gw:9091"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics-push"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn systemd_hears_ready_watchdog_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let p = Pipeline::new("64KiB", "30s", "0s");
    let sock_path = p.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut child = p
        .command("ferry-copy")
        .args(["--watch", "--poll", "200ms"])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    let t0 = Instant::now();
    while !(seen.iter().any(|m| m == "READY=1") && seen.iter().filter(|m| *m == "WATCHDOG=1").count() >= 2) {
        assert!(t0.elapsed() < Duration::from_secs(20), "{seen:?}");
        let n = sock.recv(&mut buf).unwrap();
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert_eq!(seen[0], "READY=1", "{seen:?}");
    sigterm(&mut child);
    let t0 = Instant::now();
    loop {
        let n = sock.recv(&mut buf).unwrap();
        if &buf[..n] == b"STOPPING=1" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20));
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn help_lists_exit_codes_and_environment_and_version_the_schema() {
    for b in STAGES {
        let out = Command::new(bin(b)).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        for want in ["Exit codes:", "3  finished, but", "FERRY_CONFIG", "FERRY_METRICS_ADDR", "RUST_LOG", "--metrics-textfile"] {
            assert!(help.contains(want), "{b} --help lacks {want:?}:\n{help}");
        }
        let out = Command::new(bin(b)).arg("--version").output().unwrap();
        let v = String::from_utf8_lossy(&out.stdout);
        assert!(v.contains(&format!(", ledger schema {})", ferry_ledger::SCHEMA_VERSION)) && v.contains("(commit "), "{b}: {v}");
    }
    let help = String::from_utf8_lossy(&Command::new(bin("ferry")).args(["status", "--help"]).output().unwrap().stdout).into_owned();
    assert!(help.contains("--json") && help.contains("--check") && help.contains("--watch"), "{help}");
}
