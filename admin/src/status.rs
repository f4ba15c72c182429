//! `ferry status`: the ledger's overview as a table for people, JSON for scripts, and a
//! Nagios-style check for monitoring.

use std::fmt::Write;
use std::time::Duration;

use ferry_ledger::{Count, FileState, Overview, PartitionStats, TaskState};
use ferry_runtime::runner::human_bytes;
use serde_json::json;

/// Nagios plugin exit codes, used by `ferry status --check`.
pub mod check {
    pub const OK: i32 = 0;
    pub const WARNING: i32 = 1;
    pub const CRITICAL: i32 = 2;
    pub const UNKNOWN: i32 = 3;
}

fn ago(now_ms: i64, t: Option<i64>) -> String {
    match t {
        None => "never".into(),
        Some(t) => format!("{} ago", age((now_ms - t).max(0))),
    }
}

/// 93_000 ms -> "1m33s".
fn age(ms: i64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

fn count(c: Count) -> String {
    if c.chunks == 0 { "0".into() } else { format!("{} ({})", c.chunks, human_bytes(c.bytes as f64)) }
}

/// Seconds until the stage's backlog is gone at the rate of the last window, if it moves.
fn eta_secs(o: &Overview, s: &ferry_ledger::StageOverview) -> Option<i64> {
    let left = s.count(TaskState::Available).bytes + s.count(TaskState::Retryable).bytes + s.count(TaskState::Running).bytes;
    let per_ms = s.recent.2 as f64 / o.window_ms.max(1) as f64;
    (left > 0 && per_ms > 0.0).then(|| (left as f64 / per_ms / 1000.0).ceil() as i64)
}

/// The table `ferry status` prints; `version_label` names what a partition's table version is
/// ("table version" of a Delta log, "snapshot" of an Iceberg table).
pub fn text(o: &Overview, ledger: &str, partitions: &[PartitionStats], version_label: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "ledger: {ledger}");
    let files: Vec<String> = o.files.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let _ = writeln!(out, "source files: {}", if files.is_empty() { "none".into() } else { files.join(", ") });
    let _ = writeln!(
        out,
        "{:<10} {:>16} {:>16} {:>16} {:>16} {:>11} {:>13} {:>22} {:>8}",
        "stage", "pending", "running", "retrying", "quarantined", "oldest due", "last success", "rate (last 5m)", "ETA"
    );
    for s in &o.stages {
        let secs = o.window_ms as f64 / 1000.0;
        let rate =
            if s.recent.0 == 0 { "-".to_string() } else { format!("{} chunks, {}/s", s.recent.0, human_bytes(s.recent.2 as f64 / secs)) };
        let _ = writeln!(
            out,
            "{:<10} {:>16} {:>16} {:>16} {:>16} {:>11} {:>13} {:>22} {:>8}",
            s.stage.as_str(),
            count(s.count(TaskState::Available)),
            count(s.count(TaskState::Running)),
            count(s.count(TaskState::Retryable)),
            count(s.count(TaskState::Quarantined)),
            s.oldest_due_ms.map_or("-".into(), |t| age((o.now_ms - t).max(0))),
            ago(o.now_ms, s.last_success_ms),
            rate,
            eta_secs(o, s).map_or("-".into(), |e| age(e * 1000)),
        );
    }
    if !partitions.is_empty() {
        let _ = writeln!(out, "published:");
        for p in partitions {
            let version = p.table_version.map_or(String::new(), |v| format!("  ({version_label} {v})"));
            let _ = writeln!(out, "  {}/{:<24} {:>5} files {:>10} rows{version}", p.table, p.partition, p.files, p.records);
        }
    }
    let _ = writeln!(out, "open outages: {}", o.outages.len());
    for x in &o.outages {
        let _ = writeln!(
            out,
            "  {} down for {} since {} ({} probes): {}",
            x.store,
            x.stage,
            ago(o.now_ms, Some(x.started_at)),
            x.probes,
            x.last_error.as_deref().unwrap_or("")
        );
    }
    let redone: i64 = o.stages.iter().map(|s| s.redone_attempts).sum();
    let redone_bytes: i64 = o.stages.iter().map(|s| s.redone_bytes).sum();
    let _ = writeln!(out, "redone attempts: {redone} ({redone_bytes} bytes)");
    let _ = writeln!(out, "stuck leases: {}", o.stuck.len());
    for l in &o.stuck {
        let _ = writeln!(
            out,
            "  {} of chunk {} held by {} (task {}), expired {}",
            l.stage,
            l.chunk_id,
            l.lease_owner.as_deref().unwrap_or("?"),
            l.task_id,
            ago(o.now_ms, l.lease_expires_at)
        );
    }
    if !o.recent_failures.is_empty() {
        let _ = writeln!(out, "latest errors:");
        for f in o.recent_failures.iter().take(5) {
            let _ = writeln!(
                out,
                "  {} {} {} of chunk {} (attempt {}, {}): {}",
                ago(o.now_ms, Some(f.ended_at)),
                f.stage,
                f.outcome,
                f.chunk_id,
                f.attempt,
                f.worker,
                f.error.as_deref().unwrap_or("")
            );
        }
    }
    for q in &o.quarantined {
        let _ = writeln!(out, "quarantined {} {}: {}", q.kind, q.what, q.reason.as_deref().unwrap_or_default());
    }
    if !o.quarantined.is_empty() {
        let _ =
            writeln!(out, "{} quarantined: see `SELECT * FROM recent_failures`, fix the cause, then `ferry requeue`", o.quarantined.len());
    }
    for (chunk, stage, reason) in &o.skipped {
        let _ = writeln!(out, "skipped chunk {chunk} at {stage}: {reason}");
    }
    for (uri, times, _) in &o.arrived_again {
        let _ = writeln!(
            out,
            "arrived again ({times}x): {uri} held bytes taken in before under that name; not taken in again (versions = keep)"
        );
    }
    out
}

/// The same as JSON, for scripts.
pub fn to_json(o: &Overview, ledger: &str, partitions: &[PartitionStats]) -> serde_json::Value {
    let stages: Vec<_> = o
        .stages
        .iter()
        .map(|s| {
            let states: serde_json::Map<String, serde_json::Value> =
                s.states.iter().map(|(st, c)| (st.as_str().to_string(), json!({"chunks": c.chunks, "bytes": c.bytes}))).collect();
            json!({
                "stage": s.stage.as_str(),
                "tasks": states,
                "oldest_due_age_seconds": s.oldest_due_ms.map(|t| (o.now_ms - t).max(0) as f64 / 1000.0),
                "last_success_unix_ms": s.last_success_ms,
                "recent": {"window_seconds": o.window_ms / 1000, "chunks": s.recent.0, "records": s.recent.1, "bytes": s.recent.2},
                "eta_seconds": eta_secs(o, s),
                "redone": {"attempts": s.redone_attempts, "bytes": s.redone_bytes},
                "stuck_leases": s.stuck_leases,
            })
        })
        .collect();
    json!({
        "ledger": ledger,
        "now_unix_ms": o.now_ms,
        "files": o.files.iter().map(|(s, n)| (s.as_str().to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "stages": stages,
        "stuck_leases": o.stuck.iter().map(|l| json!({
            "task_id": l.task_id, "stage": l.stage.as_str(), "chunk": l.chunk_id, "owner": l.lease_owner, "expired_unix_ms": l.lease_expires_at,
        })).collect::<Vec<_>>(),
        "latest_errors": o.recent_failures.iter().map(|f| json!({
            "ended_unix_ms": f.ended_at, "stage": f.stage.as_str(), "chunk": f.chunk_id, "attempt": f.attempt,
            "worker": f.worker, "outcome": f.outcome, "error": f.error,
        })).collect::<Vec<_>>(),
        "outages": o.outages.iter().map(|x| json!({
            "store": x.store, "stage": x.stage.as_str(), "since_unix_ms": x.started_at, "probes": x.probes,
            "last_probe_unix_ms": x.last_probe_at, "last_error": x.last_error,
        })).collect::<Vec<_>>(),
        "quarantined": o.quarantined.iter().map(|q| json!({"kind": q.kind, "what": q.what, "reason": q.reason})).collect::<Vec<_>>(),
        "skipped": o.skipped.iter().map(|(c, st, r)| json!({"chunk": c, "stage": st, "reason": r})).collect::<Vec<_>>(),
        "arrived_again": o.arrived_again.iter().map(|(u, n, at)| json!({"uri": u, "times": n, "last_unix_ms": at})).collect::<Vec<_>>(),
        "published": partitions.iter().map(|p| json!({"table": p.table, "partition": p.partition, "files": p.files, "records": p.records, "table_version": p.table_version})).collect::<Vec<_>>(),
    })
}

/// A Nagios-style verdict: CRITICAL when anything is quarantined, WARNING for a store that is
/// down (it heals by itself, but someone should know), stuck leases or work due for longer than
/// `max_age`, else OK. Returns the exit code and the one-line report.
pub fn verdict(o: &Overview, max_age: Duration) -> (i32, String) {
    let mut critical = Vec::new();
    let mut warning = Vec::new();
    let files = o.files.iter().find(|(s, _)| *s == FileState::Quarantined).map_or(0, |f| f.1);
    if files > 0 {
        critical.push(format!("{files} source file(s) quarantined"));
    }
    for x in &o.outages {
        warning.push(format!("{} down for {} since {}", x.store, x.stage, ago(o.now_ms, Some(x.started_at))));
    }
    for s in &o.stages {
        let q = s.count(TaskState::Quarantined).chunks;
        if q > 0 {
            critical.push(format!("{q} {} chunk(s) quarantined", s.stage));
        }
        if s.stuck_leases > 0 {
            warning.push(format!("{} {} lease(s) stuck", s.stuck_leases, s.stage));
        }
        if let Some(t) = s.oldest_due_ms {
            let waited = (o.now_ms - t).max(0);
            if waited > max_age.as_millis() as i64 {
                warning.push(format!("{} work due for {}", s.stage, age(waited)));
            }
        }
    }
    let perf: Vec<String> = o
        .stages
        .iter()
        .map(|s| {
            let due = s.count(TaskState::Available).chunks + s.count(TaskState::Retryable).chunks;
            format!("{}_due={due} {}_quarantined={}", s.stage, s.stage, s.count(TaskState::Quarantined).chunks)
        })
        .collect();
    let (code, word, what) = if !critical.is_empty() {
        critical.extend(warning);
        (check::CRITICAL, "CRITICAL", critical.join("; "))
    } else if !warning.is_empty() {
        (check::WARNING, "WARNING", warning.join("; "))
    } else {
        (check::OK, "OK", "nothing quarantined, nothing stuck, nothing waiting too long".to_string())
    };
    (code, format!("FERRY {word} - {what} | {}", perf.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_durations() {
        assert_eq!(age(5_400), "5s");
        assert_eq!(age(93_000), "1m33s");
        assert_eq!(age(7_260_000), "2h01m");
        assert_eq!(age(90_000_000), "1d01h");
    }
}
