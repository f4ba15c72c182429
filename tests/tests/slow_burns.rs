//! What grows over weeks of unattended running must stay flat: each test here is one cost that
//! once grew with the history, measured where it would show.

use ferry_tests::{Pipeline, bin};
use std::process::Command;

/// Extract under `--watch` passes over the source every `--poll`; sweeping staging for crashed
/// writers' temp files lists the whole staged table, which grows with every chunk kept. The sweep
/// runs at the first pass only (then hourly), so a pass costs the same on day 1 and day 30.
/// Counted from the system calls: the staged table's directories opened for listing.
#[test]
fn extract_does_not_list_the_staged_table_every_pass() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 4, 300, 31);
    let out = p.stage("ferry-extract");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = p.path("strace.txt");
    // SIGTERM after 4 s, from inside the trace (strace itself would only detach).
    let out = Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=openat", "-o"])
        .arg(&trace)
        .args(["timeout", "--signal=TERM", "4s"])
        .arg(bin("ferry-extract"))
        .arg("--config")
        .arg(&p.config)
        .args(["--watch", "--poll", "100ms"])
        .env_remove("FERRY_LEDGER")
        .output()
        .unwrap();
    assert!(out.status.code().is_some(), "extract ended: {}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&trace).unwrap();
    let staged = p.path("staging/events").display().to_string();
    let source = p.path("in").display().to_string();
    let opened = |dir: &str| text.lines().filter(|l| l.contains(&format!("\"{dir}\"")) && l.contains("O_DIRECTORY")).count();
    let passes = opened(&source);
    assert!(passes >= 10, "the source is listed every pass (100 ms apart for 4 s): {passes}");
    assert_eq!(opened(&staged), 1, "the staged table is listed once, not on each of {passes} passes");
}

/// Health follows bytes moved, not files finished: a file that takes longer to split than the
/// health window keeps `/healthz` at 200 (and the systemd watchdog fed) all the while, so the
/// stage is not killed on it and restarted to split it from the start again, for ever.
#[test]
fn a_file_longer_to_split_than_the_health_window_keeps_the_stage_healthy() {
    use std::io::{Read, Write};
    let p = Pipeline::new("256KiB", "30s", "0s");
    // ~1.2 GiB of JSON lines in ~4,800 chunks of 256 KiB, each written and synced: several
    // seconds to read, hash and split, even on an idle machine.
    let mut w = std::io::BufWriter::new(std::fs::File::create(p.path("in/big.jsonl")).unwrap());
    let payload = "p".repeat(300);
    for i in 0..3_300_000u64 {
        writeln!(
            w,
            "{{\"event_id\":\"e{i:09}\",\"ts\":\"2026-11-30T12:00:00Z\",\"host\":\"h\",\"kind\":\"k\",\"user_id\":{i},\"payload\":\"{payload}\",\"score\":null}}"
        )
        .unwrap();
    }
    w.into_inner().unwrap().sync_all().unwrap();
    // The window is 2 s, not less: the quiet it measures is one step at a time (a chunk's write
    // and sync, one ledger commit), and on a busy 2-core machine a single sync can take a second.
    let svc = p.watch_started("ferry-extract", &["--health-window", "2s"]);
    let port = svc.metrics_port.unwrap();
    let healthz = || -> Option<u16> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(10))).ok()?;
        write!(s, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.split_whitespace().nth(1).and_then(|c| c.parse().ok())
    };
    let t0 = std::time::Instant::now();
    let (mut checks, mut unhealthy) = (0, Vec::new());
    loop {
        // Before extract has made the ledger's tables, the query fails: not chunked yet.
        let chunked = p.try_count("SELECT COUNT(*) FROM source_files WHERE state = 'chunked'") == Some(1);
        if let Some(code) = healthz() {
            checks += 1;
            if code != 200 {
                unhealthy.push(format!("{code} at {:.1} s", t0.elapsed().as_secs_f64()));
            }
        }
        if chunked {
            break;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(600), "the file was not split in 10 minutes");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let took = t0.elapsed();
    let (code, _, log) = svc.stop();
    assert_eq!(code, Some(0), "{log}");
    eprintln!("split in {took:?}, /healthz asked {checks} times");
    assert!(took > std::time::Duration::from_secs(3), "the split must outlast the 2 s window to show anything: {took:?}");
    assert!(unhealthy.is_empty(), "/healthz failed while the file was being split ({took:?}): {unhealthy:?}");
    assert!(checks > 5, "/healthz was asked during the split: {checks}");
}

/// A split cut short (a kill, a crash, a watchdog's restart) goes on from what it staged: the
/// next run finds the chunks already there under their names and does not write them again,
/// so a file too large to finish in one life is not staged from the start for ever. The table
/// still holds every record once.
#[test]
fn a_split_cut_short_goes_on_from_what_is_staged() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let p = Pipeline::new("64KiB", "30s", "0s");
    // ~37 MB of JSON lines in 64 KiB chunks: ~580 chunks, each written and synced.
    let mut w = std::io::BufWriter::new(std::fs::File::create(p.path("in/big.jsonl")).unwrap());
    let payload = "p".repeat(260);
    for i in 0..100_000u64 {
        writeln!(
            w,
            "{{\"event_id\":\"e{i:09}\",\"ts\":\"2026-11-30T12:{:02}:00Z\",\"host\":\"h\",\"kind\":\"k\",\"user_id\":{i},\"payload\":\"{payload}\",\"score\":null}}",
            i % 60
        )
        .unwrap();
    }
    w.into_inner().unwrap().sync_all().unwrap();
    let staged_dir = p.path("staging/events");
    let staged = || -> Vec<(String, u64)> {
        let Ok(rd) = std::fs::read_dir(&staged_dir) else { return vec![] };
        rd.flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| (e.file_name().to_string_lossy().to_string(), e.metadata().unwrap().ino()))
            .collect()
    };
    let mut child = p.command("ferry-extract").arg("--once").spawn().unwrap();
    let t0 = std::time::Instant::now();
    while staged().len() < 40 {
        assert!(child.try_wait().unwrap().is_none(), "extract finished before it could be cut short");
        assert!(t0.elapsed() < std::time::Duration::from_secs(300), "nothing staged in 5 minutes");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = staged();
    assert!(before.len() < 500, "cut short part-way: {} chunks staged", before.len());
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'chunked'"), 0, "the file was not taken in yet");
    let out = p.stage("ferry-extract");
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{said}");
    let kept: usize = said
        .split("; ")
        .find_map(|part| part.trim().strip_suffix(" chunks staged by an interrupted run kept").and_then(|n| n.trim().parse().ok()))
        .unwrap_or_else(|| panic!("the summary says what was kept: {said}"));
    assert!(kept >= before.len(), "every chunk staged before the kill is kept: {kept} of {}", before.len());
    let after: std::collections::HashMap<String, u64> = staged().into_iter().collect();
    let rewritten: Vec<&String> = before.iter().filter(|(n, ino)| after.get(n) != Some(ino)).map(|(n, _)| n).collect();
    assert!(rewritten.is_empty(), "{} chunks were written again: {:?}", rewritten.len(), &rewritten[..rewritten.len().min(5)]);
    for s in ["ferry-transform", "ferry-copy", "ferry-load"] {
        let out = p.stage(s);
        assert!(out.status.success(), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let want = ferry_tests::input_digest("jsonl", &p.path("in"));
    let got = p.table_digest();
    assert_eq!((got["rows"].clone(), got["digest"].clone()), (want["rows"].clone(), want["digest"].clone()));
}
