//! Fixtures for the tests of this crate and of the crates built on it (not for production use).

use crate::{Ledger, NewChunk, NewSourceFile, RangeKind, Stage, chunk_id};

/// The tests' clock starts here (2027-01-15).
pub const T0: i64 = 1_800_000_000_000;

/// Registers one file with `n` chunks, each with a `transform` task.
pub async fn seed(ledger: &Ledger, name: &str, n: i64) -> Vec<String> {
    let hash = blake3::hash(name.as_bytes()).to_hex().to_string();
    let f = ledger
        .register_file(&NewSourceFile {
            uri: format!("file:///src/{name}"),
            size: n * 100,
            mtime_ms: T0,
            content_hash: hash.clone(),
            format: Some(ferry_common::config::Format::Jsonl),
            change_token: None,
        })
        .await
        .unwrap();
    let chunks: Vec<NewChunk> = (0..n)
        .map(|seq| NewChunk {
            id: chunk_id("default", &hash, seq),
            seq,
            range_kind: RangeKind::Bytes,
            range_start: seq * 100,
            range_end: seq * 100 + 100,
            records: Some(10),
            bytes: 100,
            content_hash: format!("h{seq}"),
            location: format!("file:///staging/{name}.{seq}"),
        })
        .collect();
    ledger.record_chunks(f.id, &chunks, Stage::Transform).await.unwrap();
    chunks.into_iter().map(|c| c.id).collect()
}
