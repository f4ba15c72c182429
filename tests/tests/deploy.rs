//! What `deploy/` ships, checked by the tools that will read it: `systemd-analyze verify` on
//! the units (after `deploy/install.sh` put them and the binaries in place), `promtool check
//! rules` on the alerts, `kubernetes-validate` on the manifests, and the cron file's lines.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferry_tests::bin;
use ferry_tests::clusters::repo_root;

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
    assert_eq!(units.len(), 16, "service, timer and watch service per stage, and gc's and prune's service and timer: {units:?}");
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

#[test]
fn kubernetes_manifests_pass_the_schema_check() {
    let files: Vec<PathBuf> = std::fs::read_dir(deploy().join("kubernetes")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 3);
    let out = Command::new("kubernetes-validate").arg("--strict").args(&files).output().unwrap();
    let text = ok(&out, "kubernetes-validate");
    for kind in [
        "configmap/",
        "secret/",
        "persistentvolumeclaim/",
        "cronjob/ferry-extract",
        "cronjob/ferry-load",
        "cronjob/ferry-gc",
        "cronjob/ferry-prune",
        "deployment/ferry",
    ] {
        assert!(text.contains(&format!("passed for resource {kind}")), "{kind}: {text}");
    }
    let cron = std::fs::read_to_string(deploy().join("kubernetes/ferry-cronjobs.yaml")).unwrap();
    assert_eq!(cron.matches("concurrencyPolicy: Forbid").count(), 6);
    // The validator is strict: a misspelt field fails.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, cron.replacen("concurrencyPolicy: Forbid", "concurrencyPolcy: Forbid", 1)).unwrap();
    let out = Command::new("kubernetes-validate").arg("--strict").arg(&bad).output().unwrap();
    assert!(!out.status.success(), "a misspelt field is caught");
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
