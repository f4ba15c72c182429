//! `ferry gen` output read back by independent readers (fastavro, Python's csv and json), and
//! `ferry check-config` on good and bad files.

use std::process::Command;

fn ferry(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ferry")).args(args).env_remove("FERRY_LEDGER").output().unwrap()
}

const READ_BACK: &str = r#"
import sys, json, csv, glob, fastavro
fmt, d = sys.argv[1], sys.argv[2]
rows = []
for p in sorted(glob.glob(d + "/*." + fmt)):
    with (open(p, "rb") if fmt == "avro" else open(p, "r", newline="")) as f:
        if fmt == "avro":
            rows += [dict(r, ts=int(r["ts"].timestamp() * 1000)) for r in fastavro.reader(f)]
        elif fmt == "jsonl":
            rows += [json.loads(l) for l in f]
        else:
            rows += list(csv.DictReader(f))
print(json.dumps({"n": len(rows), "ids": sorted(r["event_id"] for r in rows),
                  "nulls": sum(1 for r in rows if r["score"] in (None, "")),
                  "newlines": sum(1 for r in rows if "\n" in r["payload"])}))
"#;

fn read_back(fmt: &str, dir: &std::path::Path) -> serde_json::Value {
    let out = Command::new("python3").args(["-c", READ_BACK, fmt, dir.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "python reader failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn gen_is_readable_by_independent_readers_and_identical_across_formats() {
    let mut ids = Vec::new();
    for (fmt, codec) in
        [("avro", "null"), ("avro", "deflate"), ("avro", "snappy"), ("avro", "zstandard"), ("jsonl", "null"), ("csv", "null")]
    {
        let dir = tempfile::tempdir().unwrap();
        let out = ferry(&[
            "gen",
            "--format",
            fmt,
            "--codec",
            codec,
            "--out",
            dir.path().to_str().unwrap(),
            "--files",
            "3",
            "--records",
            "700",
            "--block-records",
            "128",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v = read_back(fmt, dir.path());
        assert_eq!(v["n"], 2100, "{fmt}/{codec}");
        assert!(v["nulls"].as_u64().unwrap() > 0);
        assert!(v["newlines"].as_u64().unwrap() > 0, "{fmt}: some payloads carry newlines");
        ids.push(v["ids"].clone());
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "every format holds the same events");
}

#[test]
fn check_config_never_prints_a_secret() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.example.toml");
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken-from-a-file").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["--ledger", "postgres://ferry:hunter2@db.example.com/ferry", "check-config", "--config", example])
        .env("FERRY_DESTINATION_STORE_S3_ACCESS_KEY_ID", "AKIAEXAMPLE")
        .env("FERRY_DESTINATION_STORE_S3_SECRET_ACCESS_KEY", "wJalrXUtnFEMI")
        .env("FERRY_DESTINATION_STORE_S3_SESSION_TOKEN_FILE", &token)
        .env("FERRY_DESTINATION_STORE_AZURE_ACCESS_KEY", "azUr3sh4redKey==")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    for secret in ["hunter2", "wJalrXUtnFEMI", "t0ken-from-a-file", "azUr3sh4redKey=="] {
        assert!(!text.contains(secret), "{secret} printed:\n{text}");
    }
    assert!(text.contains("postgres://ferry:***@db.example.com"), "{text}");
    assert!(text.contains("secret_access_key = \"***\"") && text.contains("session_token = \"***\""), "{text}");
    assert!(text.contains("access_key = \"***\""), "the Azure key is shown redacted: {text}");
    assert!(text.contains("AKIAEXAMPLE"), "the key id is not a secret: {text}");
    // A bad URL's error does not print the password either.
    let out = Command::new(env!("CARGO_BIN_EXE_ferry")).args(["--ledger", "mysql://root:hunter2@db/x", "status"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains("hunter2") && err.contains("root:***@db"), "{err}");
}

#[test]
fn check_config_prints_resolved_config_and_names_bad_keys() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.example.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["check-config", "--config", example])
        .env("FERRY_COPY_CONCURRENCY", "11")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("concurrency = 11"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let good = std::fs::read_to_string(example).unwrap();
    for (patch, needle) in [
        (good.replace("stall_timeout = \"30s\"", "stall_timeout = \"30 parsecs\""), "stall_timeout"),
        (good.replace("[copy]", "[copy]\nretries_please = 3"), "retries_please"),
        (good.replace("[spool]", "[spoool]"), "spool"),
        (good.replace("type = \"long\"", "type = \"bigint\""), "bigint"),
    ] {
        std::fs::write(&bad, patch).unwrap();
        let out = ferry(&["check-config", "--config", bad.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(needle) && err.contains("bad.toml"), "error must name {needle} and the file: {err}");
    }
}
