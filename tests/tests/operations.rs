//! How the binaries behave as services: SIGTERM in --watch, source disposition, marker files,
//! config errors.

use std::time::{Duration, Instant};

use ferry_tests::{Pipeline, STAGES};

#[test]
fn sigterm_stops_a_watching_stage_cleanly() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    for s in STAGES {
        let mut child = p.command(s).args(["--watch", "--poll", "100ms"]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(400));
        assert!(child.try_wait().unwrap().is_none(), "{s} --watch exited on its own");
        let started = Instant::now();
        assert!(std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "{s} ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{s} exit {status:?}");
    }
}

#[test]
fn delete_disposition_and_marker_files() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    let cfg = std::fs::read_to_string(&p.config)
        .unwrap()
        .replace("settle = \"0s\"", "settle = \"0s\"\nmarker = \".done\"\ndisposition = \"delete\"");
    std::fs::write(&p.config, cfg).unwrap();
    p.generate("in", "jsonl", "null", 2, 300, 5);
    let files: Vec<_> = std::fs::read_dir(p.path("in")).unwrap().flatten().map(|e| e.path()).collect();
    // Only the first file is marked finished.
    std::fs::write(format!("{}.done", files[0].display()), "").unwrap();
    let out = p.stage("ferry-extract");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(p.sql("SELECT COUNT(*) FROM source_files"), "1", "the unmarked file waits");
    assert!(!files[0].exists(), "a chunked file is deleted (disposition = delete)");
    assert!(files[1].exists());
}

#[test]
fn bad_config_names_the_key_and_exits_2() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    let cfg = std::fs::read_to_string(&p.config).unwrap().replace("max_bad_records = 5", "max_bad_record = 5");
    std::fs::write(&p.config, cfg).unwrap();
    for s in STAGES {
        let out = p.stage(s);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{s}: {err}");
        assert!(err.contains("max_bad_record") && err.contains("ferry.toml"), "{s}: {err}");
    }
}

#[test]
fn bad_store_settings_name_the_key_and_exit_2() {
    let cases = [
        ("[destination.store.s3]\nca_bundel = \"x\"\n", "s3://b/p", "ca_bundel"),
        ("[destination.store.s3]\nca_bundle = \"/nonexistent/ca.pem\"\n", "s3://b/p", "ca_bundle"),
        ("[destination.store]\ncall_timeout = \"soon\"\n", "hdfs://127.0.0.1:1/w", "call_timeout"),
        ("", "s3:///nobucket", "bucket"),
        ("", "gopher://x/y", "gopher"),
    ];
    for (extra, url, key) in cases {
        let p = Pipeline::new("1MiB", "30s", "0s");
        let cfg = std::fs::read_to_string(&p.config).unwrap();
        let dest = format!("url = \"{}/wh\"", p.dir.path().display());
        assert!(cfg.contains(&dest));
        let cfg = cfg.replace(&dest, &format!("url = \"{url}\"\n{extra}"));
        std::fs::write(&p.config, cfg).unwrap();
        for s in ["ferry-copy", "ferry-load"] {
            let out = p.stage(s);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{s} with {url} {extra:?}: {err}");
            assert!(err.contains(key), "{s}: the error names {key:?}: {err}");
        }
    }
}
