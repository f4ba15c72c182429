//! What `deploy/` ships, checked by the tools that will read it: `systemd-analyze verify` on
//! the units (after `deploy/install.sh` put them and the binaries in place), `promtool check
//! rules` on the alerts, `kubernetes-validate` on the manifests, and the cron file's lines.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferry_tests::clusters::repo_root;
use ferry_tests::{bin, output_within};

fn deploy() -> PathBuf {
    repo_root().join("deploy")
}

fn ok(out: &Output, what: &str) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what}: {text}");
    text
}

#[test]
fn install_puts_binaries_units_and_config_in_place_and_systemd_accepts_the_units() {
    let root = tempfile::tempdir().unwrap();
    let prefix = root.path().join("usr/local");
    let bins = bin("ferry").parent().unwrap().to_path_buf();
    let out = Command::new(deploy().join("install.sh"))
        .arg("--root")
        .arg(root.path())
        .arg("--bin-dir")
        .arg(&bins)
        .arg("--prefix")
        // The units name binaries under the prefix; inside the test root they are real files.
        .arg(prefix.strip_prefix(root.path()).map(|p| Path::new("/").join(p)).unwrap())
        .output()
        .unwrap();
    ok(&out, "install.sh");
    for b in ["ferry", "ferry-extract", "ferry-transform", "ferry-copy", "ferry-load"] {
        assert!(prefix.join("bin").join(b).is_file(), "{b} installed");
    }
    let etc = root.path().join("etc");
    assert!(etc.join("ferry/ferry.toml").is_file());
    let env_mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(etc.join("ferry/ferry.env")).unwrap().permissions());
    assert_eq!(env_mode & 0o077, 0, "the secrets file is private");
    let toml_mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(etc.join("ferry/ferry.toml")).unwrap().permissions());
    assert_eq!(toml_mode & 0o007, 0, "the configuration (it may hold secrets) is not world-readable");
    // The installed skeleton is a valid configuration.
    let out = Command::new(bin("ferry")).args(["check-config", "--config"]).arg(etc.join("ferry/ferry.toml")).output().unwrap();
    let text = ok(&out, "check-config of the skeleton");
    assert!(text.contains("sqlite:///var/lib/ferry/ledger.db"), "{text}");

    // systemd's own checker, on the units as installed: their ExecStart points at the binaries
    // just installed under the test root.
    let units: Vec<PathBuf> = std::fs::read_dir(etc.join("systemd/system")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(
        units.len(),
        17,
        "service, timer and watch service per stage, gc's and prune's service and timer, and migrate's service: {units:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut rewritten = Vec::new();
    for u in &units {
        let text = std::fs::read_to_string(u).unwrap().replace("/usr/local/bin/", &format!("{}/bin/", prefix.display()));
        if u.extension().is_some_and(|e| e == "service") {
            assert!(text.contains(&prefix.display().to_string()), "{}: binaries under the prefix", u.display());
        }
        let p = dir.path().join(u.file_name().unwrap());
        std::fs::write(&p, text).unwrap();
        rewritten.push(p);
    }
    let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).args(&rewritten).output().unwrap();
    let text = ok(&out, "systemd-analyze verify");
    // Warnings (unknown keys, bad values) come out without failing the command: none allowed.
    let noise: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(noise.is_empty(), "systemd-analyze verify: {noise:?}");
    for st in ["extract", "transform", "copy", "load"] {
        let once = std::fs::read_to_string(dir.path().join(format!("ferry-{st}.service"))).unwrap();
        for want in [
            "Type=oneshot",
            "SuccessExitStatus=3",
            "flock",
            "User=ferry",
            "EnvironmentFile=",
            "ProtectSystem=strict",
            "NoNewPrivileges=yes",
            "ReadWritePaths=/var/spool/ferry",
        ] {
            assert!(once.contains(want), "ferry-{st}.service lacks {want}");
        }
        let watch = std::fs::read_to_string(dir.path().join(format!("ferry-{st}-watch.service"))).unwrap();
        for want in ["Type=notify", "WatchdogSec=", "Restart=on-failure", "SuccessExitStatus=3", "--metrics-addr"] {
            assert!(watch.contains(want), "ferry-{st}-watch.service lacks {want}");
        }
        let timer = std::fs::read_to_string(dir.path().join(format!("ferry-{st}.timer"))).unwrap();
        assert!(timer.contains("Persistent=true") && timer.contains("OnCalendar="), "{timer}");
    }
    // And the checker does catch a broken unit.
    let bad = dir.path().join("ferry-broken.service");
    std::fs::write(&bad, "[Service]\nType=oneshot\nExecStart=/nonexistent/ferry-extract --once\n").unwrap();
    let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&bad).output().unwrap();
    assert!(!out.status.success(), "a unit whose binary is missing fails verification");
}

#[test]
fn alert_rules_pass_promtool() {
    let out = Command::new("promtool").args(["check", "rules"]).arg(deploy().join("prometheus/alerts.yml")).output().unwrap();
    let text = ok(&out, "promtool check rules");
    assert!(text.contains("SUCCESS: 10 rules found"), "{text}");
}

/// Every alert rule is shown to fire on the series of its failure and to resolve after it
/// (`promtool test rules`); a rule without such a test fails here.
#[test]
fn every_alert_rule_fires_and_resolves_in_its_unit_test() {
    let out = Command::new("promtool").args(["test", "rules"]).arg(deploy().join("prometheus/alerts.test.yml")).output().unwrap();
    ok(&out, "promtool test rules");
    let rules = std::fs::read_to_string(deploy().join("prometheus/alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(deploy().join("prometheus/alerts.test.yml")).unwrap();
    let names: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
    assert_eq!(names.len(), 10);
    for name in names {
        // One evaluation where it fires (its labels expected) and one where it does not.
        let evals: Vec<&str> = tests.split("- eval_time: ").filter(|e| e.contains(&format!("alertname: {name}\n"))).collect();
        assert!(evals.iter().any(|e| e.contains("exp_labels")), "{name}: no test shows it firing");
        assert!(evals.iter().any(|e| e.contains("exp_alerts: []")), "{name}: no test shows it resolved");
    }
}

/// What the manifests must hold beyond the schema: no ReadWriteMany volume (clusters that
/// offer only ReadWriteOnce leave such a claim Pending), memory requests and limits on every
/// container, a Job that migrates the ledger, and every pod that runs a stage, gc or prune
/// waiting for that migration first. Prints the violations, one per line.
const K8S_POLICIES: &str = r#"
import sys, yaml
bad = []
jobs_migrate = 0
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if not doc:
            continue
        kind, name = doc["kind"], doc["metadata"]["name"]
        where = f"{path.rsplit('/', 1)[-1]} {kind}/{name}"
        def walk(o):
            if isinstance(o, dict):
                if "accessModes" in o and "ReadWriteMany" in o["accessModes"]:
                    bad.append(f"{where}: ReadWriteMany")
                for v in o.values():
                    walk(v)
            elif isinstance(o, list):
                for v in o:
                    walk(v)
        walk(doc)
        pod = {"StatefulSet": lambda d: d["spec"]["template"]["spec"],
               "Deployment": lambda d: d["spec"]["template"]["spec"],
               "Job": lambda d: d["spec"]["template"]["spec"],
               "CronJob": lambda d: d["spec"]["jobTemplate"]["spec"]["template"]["spec"]}.get(kind)
        if pod is None:
            continue
        spec = pod(doc)
        inits, containers = spec.get("initContainers", []), spec["containers"]
        for c in inits + containers:
            r = c.get("resources", {})
            if not r.get("limits", {}).get("memory") or not r.get("requests", {}).get("memory"):
                bad.append(f"{where}: container {c['name']} without a memory request and limit")
        commands = [" ".join(c.get("command", []) + c.get("args", [])) for c in inits + containers]
        if kind == "Job" and any(cmd.endswith("ferry migrate") for cmd in commands):
            jobs_migrate += 1
            continue
        runs_stages = any(("ferry-" in cmd) or (" gc" in cmd) or (" prune" in cmd) for cmd in commands)
        first = " ".join(inits[0].get("command", []) + inits[0].get("args", [])) if inits else ""
        if runs_stages and "ferry migrate --check" not in first:
            bad.append(f"{where}: runs stages without waiting for the ledger's migration first")
        if kind == "CronJob" and doc["spec"].get("concurrencyPolicy") != "Forbid":
            bad.append(f"{where}: runs may overlap")
if jobs_migrate != 1:
    bad.append(f"{jobs_migrate} Jobs run ferry migrate, not one")
print("\n".join(bad))
"#;

fn k8s_violations(files: &[PathBuf]) -> String {
    let out = Command::new("python3").args(["-c", K8S_POLICIES]).args(files).output().unwrap();
    ok(&out, "the manifests' policies").trim().to_string()
}

#[test]
fn kubernetes_manifests_pass_the_schema_check_and_the_policies() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy().join("kubernetes")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert_eq!(files.len(), 3);
    let out = Command::new("kubernetes-validate").arg("--strict").args(&files).output().unwrap();
    let text = ok(&out, "kubernetes-validate");
    for kind in [
        "configmap/ferry-config",
        "secret/ferry-secrets",
        "job/ferry-migrate",
        "persistentvolumeclaim/ferry-spool",
        "cronjob/ferry-stages",
        "cronjob/ferry-gc",
        "cronjob/ferry-prune",
        "statefulset/ferry",
    ] {
        assert!(text.contains(&format!("passed for resource {kind}")), "{kind}: {text}");
    }
    assert_eq!(k8s_violations(&files), "", "the shipped manifests break no policy");
    // The validator is strict: a misspelt field fails; and each policy catches its breach.
    let cron = std::fs::read_to_string(deploy().join("kubernetes/ferry-cronjobs.yaml")).unwrap();
    let sts = std::fs::read_to_string(deploy().join("kubernetes/ferry-statefulset.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, cron.replacen("concurrencyPolicy: Forbid", "concurrencyPolcy: Forbid", 1)).unwrap();
    let out = Command::new("kubernetes-validate").arg("--strict").arg(&bad).output().unwrap();
    assert!(!out.status.success(), "a misspelt field is caught");
    for (text, breach, want) in [
        (&cron, ("accessModes: [\"ReadWriteOnce\"]", "accessModes: [\"ReadWriteMany\"]"), "ReadWriteMany"),
        (&sts, ("memory: 256Mi", "cpu: 1"), "without a memory request and limit"),
        (&sts, ("migrate --check", "status"), "without waiting for the ledger"),
        (&cron, ("concurrencyPolicy: Forbid", "concurrencyPolicy: Allow"), "may overlap"),
    ] {
        std::fs::write(&bad, text.replacen(breach.0, breach.1, 1)).unwrap();
        let mut with_job = vec![bad.clone()];
        with_job.push(deploy().join("kubernetes/ferry-config.yaml"));
        let said = k8s_violations(&with_job);
        assert!(said.contains(want), "{breach:?} is caught: {said}");
    }
}

#[test]
fn cron_lines_lock_and_run_each_stage_once() {
    let cron = std::fs::read_to_string(deploy().join("cron/ferry")).unwrap();
    let jobs: Vec<&str> = cron.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty() && !l.contains('=')).collect();
    assert_eq!(jobs.len(), 6, "{jobs:?}");
    assert!(jobs[4].contains("flock -n /var/lib/ferry/gc.lock") && jobs[4].contains("exec ferry gc"), "{}", jobs[4]);
    assert!(jobs[5].contains("flock -n /var/lib/ferry/prune.lock") && jobs[5].contains("exec ferry prune --older-than 30d"), "{}", jobs[5]);
    for (job, st) in jobs.iter().zip(["extract", "transform", "copy", "load"]) {
        let fields: Vec<&str> = job.split_whitespace().collect();
        assert_eq!(&fields[..6], ["*", "*", "*", "*", "*", "ferry"], "minute, hour, day, month, weekday, user: {job}");
        assert!(job.contains(&format!("flock -n /var/lib/ferry/{st}.lock")) && job.contains(&format!("ferry-{st} --once")), "{job}");
        // The command is valid shell.
        let cmd = fields[6..].join(" ");
        let out = Command::new("sh").args(["-n", "-c", &cmd]).output().unwrap();
        ok(&out, &cmd);
    }
}

#[test]
fn the_grafana_dashboard_is_json_over_ferry_series() {
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(deploy().join("grafana/ferry-dashboard.json")).unwrap()).unwrap();
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            assert!(t["expr"].as_str().unwrap().contains("ferry_"), "{t}");
        }
    }
}

/// Makes the user the units and the cron file run the stages as, as `deploy/install.sh` does
/// on a host (once per test process: the two ledgers' tests run at once).
fn ferry_user() {
    static MADE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if *made {
        return;
    }
    if !Command::new("getent").args(["passwd", "ferry"]).output().unwrap().status.success() {
        let _ = Command::new("groupadd").args(["--system", "ferry"]).output().unwrap();
        let out = Command::new("useradd")
            .args(["--system", "--gid", "ferry", "--home-dir", "/var/lib/ferry", "--shell", "/usr/sbin/nologin", "ferry"])
            .output()
            .unwrap();
        ok(&out, "useradd ferry");
    }
    *made = true;
}

/// A host as `deploy/install.sh --root` left it in a scratch root, seen by commands run in a
/// mount namespace where the root's /etc/ferry, /var/lib/ferry, /var/spool/ferry,
/// /var/log/ferry and /usr/local/bin are at their real paths, as user ferry: what the units'
/// ExecStart lines and the cron lines name is what they get. The configuration is the
/// installed skeleton with its directories pointed at this test's (`work`).
struct Host {
    root: tempfile::TempDir,
    work: tempfile::TempDir,
}

/// The directories install.sh makes, bound at their real paths for each command.
const HOST_DIRS: [&str; 5] = ["etc/ferry", "var/lib/ferry", "var/spool/ferry", "var/log/ferry", "usr/local/bin"];

impl Host {
    fn install(ledger_url: Option<&str>) -> Host {
        ferry_user();
        let root = tempfile::tempdir().unwrap();
        let bins = bin("ferry").parent().unwrap().to_path_buf();
        let out = Command::new(deploy().join("install.sh")).arg("--root").arg(root.path()).arg("--bin-dir").arg(&bins).output().unwrap();
        ok(&out, "install.sh --root");
        let r = root.path();
        // What install.sh does on a host besides --root's files: ownership for user ferry.
        for (path, owner, mode) in [
            ("var/lib/ferry", "ferry:ferry", None),
            ("var/lib/ferry/metrics", "ferry:ferry", None),
            ("var/spool/ferry", "ferry:ferry", None),
            ("var/log/ferry", "ferry:ferry", None),
            ("etc/ferry/ferry.toml", "root:ferry", None),
            ("etc/ferry/ferry.env", "root:ferry", Some("0640")),
        ] {
            if !r.join(path).exists() {
                continue;
            }
            ok(&Command::new("chown").arg(owner).arg(r.join(path)).output().unwrap(), "chown");
            if let Some(m) = mode {
                ok(&Command::new("chmod").arg(m).arg(r.join(path)).output().unwrap(), "chmod");
            }
        }
        let work = tempfile::tempdir().unwrap();
        let w = work.path();
        std::fs::set_permissions(w, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        for d in ["in", "staging", "wh"] {
            std::fs::create_dir_all(w.join(d)).unwrap();
            ok(&Command::new("chown").args(["ferry:ferry"]).arg(w.join(d)).output().unwrap(), "chown");
        }
        // The skeleton, edited as a user would: where the data is, files taken as they land.
        let cfg = r.join("etc/ferry/ferry.toml");
        let text = std::fs::read_to_string(&cfg).unwrap();
        assert!(text.contains("url = \"sqlite:///var/lib/ferry/ledger.db\""), "the skeleton's ledger: {text}");
        let text = text
            .replace("url = \"/data/incoming\"", &format!("url = \"{}/in\"", w.display()))
            .replace("url = \"/data/staging\"", &format!("url = \"{}/staging\"", w.display()))
            .replace("url = \"/data/warehouse\"", &format!("url = \"{}/wh\"", w.display()))
            .replace("settle = \"10s\"", "settle = \"0s\"");
        assert!(!text.contains("\"/data/"), "every data directory pointed at the test's");
        std::fs::write(&cfg, text).unwrap();
        if let Some(url) = ledger_url {
            // The secret goes in the environment file, as its comment says.
            let env = r.join("etc/ferry/ferry.env");
            let mut text = std::fs::read_to_string(&env).unwrap();
            text.push_str(&format!("FERRY_LEDGER={url}\n"));
            std::fs::write(&env, text).unwrap();
        }
        Host { root, work }
    }

    /// `argv` as user ferry with exactly `env`, in the host's mount namespace.
    fn run(&self, env: &[(String, String)], argv: &[String]) -> Output {
        // node_exporter's directories (this machine has Prometheus's tools) are hidden: a host
        // without node_exporter.
        let script = format!(
            "set -e\nR=$1; shift\nfor d in {}; do\n  mkdir -p \"/$d\"; mount --bind \"$R/$d\" \"/$d\"\ndone\n\
             if [ -d /var/lib/prometheus ]; then mount -t tmpfs none /var/lib/prometheus; fi\n\
             exec setpriv --reuid=ferry --regid=ferry --init-groups -- \"$@\"",
            HOST_DIRS.join(" ")
        );
        output_within(
            Command::new("unshare")
                .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
                .arg(self.root.path())
                .args(["env", "-i"])
                .args(env.iter().map(|(k, v)| format!("{k}={v}")))
                .args(argv),
            std::time::Duration::from_secs(300),
        )
    }

    /// The variables of the installed environment file, as systemd's EnvironmentFile= and the
    /// cron lines' `. /etc/ferry/ferry.env` read them.
    fn env_file(&self) -> Vec<(String, String)> {
        std::fs::read_to_string(self.root.path().join("etc/ferry/ferry.env"))
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.trim().to_string(), v.trim().to_string())))
            .collect()
    }

    /// Runs installed unit `name`'s ExecStart as systemd would: its Environment= and
    /// EnvironmentFile= variables, its StateDirectory= made for user ferry; success is exit 0
    /// or one of its SuccessExitStatus=.
    fn unit(&self, name: &str) -> Output {
        let text = std::fs::read_to_string(self.root.path().join("etc/systemd/system").join(name)).unwrap().replace("\\\n", " ");
        let mut env = vec![("PATH".to_string(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string())];
        let mut success = vec![0];
        let mut exec = None;
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("Environment=") {
                let (k, v) = v.split_once('=').unwrap();
                env.push((k.to_string(), v.to_string()));
            } else if let Some(v) = line.strip_prefix("EnvironmentFile=") {
                assert_eq!(v, "-/etc/ferry/ferry.env", "{name}");
                env.extend(self.env_file());
            } else if let Some(v) = line.strip_prefix("StateDirectory=") {
                for d in v.split_whitespace() {
                    let dir = self.root.path().join("var/lib").join(d);
                    assert!(dir.starts_with(self.root.path().join("var/lib/ferry")), "{name}: {d} is under a directory the host binds");
                    std::fs::create_dir_all(&dir).unwrap();
                    ok(&Command::new("chown").arg("ferry:ferry").arg(&dir).output().unwrap(), "chown");
                }
            } else if let Some(v) = line.strip_prefix("SuccessExitStatus=") {
                success.extend(v.split_whitespace().map(|c| c.parse::<i32>().unwrap()));
            } else if let Some(v) = line.strip_prefix("ExecStart=") {
                exec = Some(v.split_whitespace().map(str::to_string).collect::<Vec<_>>());
            }
        }
        let out = self.run(&env, &exec.unwrap_or_else(|| panic!("{name} has no ExecStart")));
        assert!(
            out.status.code().is_some_and(|c| success.contains(&c)),
            "{name} as installed: {:?}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs the cron file's job `index` as cron would: its user, the file's variables, /bin/sh.
    fn cron_job(&self, index: usize) -> Output {
        let text = std::fs::read_to_string(self.root.path().join("usr/local/share/ferry/cron/ferry")).unwrap();
        let mut env = vec![("HOME".to_string(), "/var/lib/ferry".to_string()), ("LOGNAME".to_string(), "ferry".to_string())];
        let mut jobs = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            match line.split_once('=') {
                Some((k, v)) if !k.contains(' ') => env.push((k.to_string(), v.to_string())),
                _ => jobs.push(line),
            }
        }
        let fields: Vec<&str> = jobs[index].splitn(7, ' ').collect();
        assert_eq!(fields[5], "ferry", "the job's user: {}", jobs[index]);
        let out = self.run(&env, &["/bin/sh".into(), "-c".into(), fields[6].into()]);
        let log = std::fs::read_dir(self.root.path().join("var/log/ferry"))
            .unwrap()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect::<String>();
        assert!(out.status.success(), "cron job {index} as installed: {:?}\n{log}", out.status);
        out
    }

    fn generate(&self, batch: &str, seed: u64) {
        let dir = self.work.path().join(format!("gen-{batch}"));
        let out = Command::new(bin("ferry"))
            .args(["gen", "--format", "avro", "--files", "3", "--records", "2000", "--seed", &seed.to_string(), "--out"])
            .arg(&dir)
            .output()
            .unwrap();
        ok(&out, "ferry gen");
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            std::fs::rename(e.path(), self.work.path().join("in").join(format!("{batch}-{}", e.file_name().to_string_lossy()))).unwrap();
        }
    }
}

/// The kit as a newcomer installs it on a host with no node_exporter: install.sh, the ledger
/// made by ferry-migrate.service, every timer's service run as written (the stages, then gc and
/// prune), then the cron file's lines on new files; every record is in the table once, the
/// textfiles for node_exporter are written, and nothing exits with a configuration error.
fn installed_kit_runs_a_full_cycle(ledger_url: Option<&str>) {
    let host = Host::install(ledger_url);
    host.unit("ferry-migrate.service");
    host.generate("a", 1);
    for _ in 0..2 {
        for st in ["extract", "transform", "copy", "load"] {
            host.unit(&format!("ferry-{st}.service"));
        }
    }
    host.unit("ferry-gc.service");
    host.unit("ferry-prune.service");
    let w = host.work.path();
    let table = ferry_tests::table_digest(&w.join("wh/events"));
    let input = ferry_tests::input_digest("avro", &w.join("in"));
    assert_eq!(input["rows"], 6000, "three files of 2,000 records");
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(table[k], input[k], "the units' cycle: {k}");
    }
    for st in ["extract", "transform", "copy", "load"] {
        let prom = host.root.path().join(format!("var/lib/ferry/metrics/ferry_{st}.prom"));
        let text = std::fs::read_to_string(&prom).unwrap_or_else(|e| panic!("{}: {e}", prom.display()));
        assert!(text.contains("ferry_last_run_exit_code"), "{text}");
    }
    // The same host driven by the cron file instead: new files, each line as written.
    host.generate("b", 2);
    for _ in 0..2 {
        for job in 0..4 {
            host.cron_job(job);
        }
    }
    host.cron_job(4);
    host.cron_job(5);
    let table = ferry_tests::table_digest(&w.join("wh/events"));
    let input = ferry_tests::input_digest("avro", &w.join("in"));
    assert_eq!(input["rows"], 12000, "six files of 2,000 records");
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(table[k], input[k], "the cron lines' cycle: {k}");
    }
    let mut env = host.env_file();
    env.push(("FERRY_CONFIG".into(), "/etc/ferry/ferry.toml".into()));
    let out = host.run(&env, &["/usr/local/bin/ferry".into(), "status".into()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "ferry status: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_installed_kit_runs_a_full_cycle_on_sqlite() {
    installed_kit_runs_a_full_cycle(None);
}

#[test]
fn the_installed_kit_runs_a_full_cycle_on_postgres() {
    let pg = ferry_tests::postgres::Postgres::start(false);
    installed_kit_runs_a_full_cycle(Some(&pg.url()));
}

/// `scripts/deb.sh` packages what install.sh installs (binaries in /usr/bin, units in
/// /usr/lib/systemd/system, man pages, completions, conffiles); dpkg installs it into a clean
/// root, keeps the configuration on remove and drops it on purge.
#[test]
fn the_debian_package_installs_into_a_clean_root_keeps_its_configuration_on_remove_and_purges() {
    let out = tempfile::tempdir().unwrap();
    let bins = bin("ferry").parent().unwrap().to_path_buf();
    let made = Command::new(repo_root().join("scripts/deb.sh"))
        .arg("--bin-dir")
        .arg(&bins)
        .arg("--out")
        .arg(out.path())
        .env("FERRY_DEB_COMPRESSION", "none")
        .output()
        .unwrap();
    let deb = PathBuf::from(ok(&made, "scripts/deb.sh").trim());
    assert!(deb.is_file() && deb.extension().is_some_and(|e| e == "deb"), "{}", deb.display());
    let info = ok(&Command::new("dpkg-deb").arg("--info").arg(&deb).output().unwrap(), "dpkg-deb --info");
    assert!(info.contains("Package: ferry") && info.contains("conffiles"), "{info}");

    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "").unwrap();
    let dpkg = |args: &[&str]| {
        // Maintainer scripts run here with DPKG_ROOT set (the root has no shell to chroot
        // into); the package's postinst then only lays out files. The root has none of the
        // packages it depends on.
        let out = Command::new("dpkg")
            .arg(format!("--root={}", r.display()))
            .args(["--force-script-chrootless", "--force-depends"])
            .args(args)
            .output()
            .unwrap();
        ok(&out, &format!("dpkg {args:?}"))
    };
    dpkg(&["-i", deb.to_str().unwrap()]);
    assert!(dpkg(&["-s", "ferry"]).contains("Status: install ok installed"));
    let version = ok(&Command::new(r.join("usr/bin/ferry")).arg("--version").output().unwrap(), "ferry --version");
    assert!(version.starts_with("ferry ") && version.contains("(commit "), "{version}");
    for b in ["ferry-extract", "ferry-transform", "ferry-copy", "ferry-load"] {
        assert!(r.join("usr/bin").join(b).is_file(), "{b}");
        let unit = std::fs::read_to_string(r.join(format!("usr/lib/systemd/system/{b}.service"))).unwrap();
        assert!(unit.contains(&format!("/usr/bin/{b} --once")), "{b}.service runs the packaged binary: {unit}");
        let page = std::fs::read_to_string(r.join(format!("usr/share/man/man1/{b}.1"))).unwrap();
        assert!(page.contains(&format!(".TH {b} 1")) && page.contains("\\-\\-config"), "{b}.1");
        assert!(r.join(format!("usr/share/bash-completion/completions/{b}.bash")).is_file());
        assert!(r.join(format!("usr/share/zsh/site-functions/_{b}")).is_file());
    }
    assert!(r.join("usr/share/man/man1/ferry-status.1").is_file(), "a page per ferry subcommand");
    let conffiles = std::fs::read_to_string(r.join("var/lib/dpkg/info/ferry.conffiles")).unwrap();
    assert_eq!(conffiles.lines().collect::<Vec<_>>(), ["/etc/ferry/ferry.toml", "/etc/ferry/ferry.env"]);
    // A host's edits survive a remove; a purge takes them.
    std::fs::write(r.join("etc/ferry/ferry.toml"), "# edited\n").unwrap();
    dpkg(&["-r", "ferry"]);
    assert!(!r.join("usr/bin/ferry").exists(), "the binaries went");
    assert_eq!(std::fs::read_to_string(r.join("etc/ferry/ferry.toml")).unwrap(), "# edited\n", "the configuration stays");
    dpkg(&["--purge", "ferry"]);
    assert!(!r.join("etc/ferry/ferry.toml").exists(), "purged");
}
