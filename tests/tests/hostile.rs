//! Files built to make a reader allocate what they claim cost bounded memory: extract and
//! transform stay under 256 MiB of peak RSS on them, each file ends in a recorded decision
//! with its reason, and a good file next to them is published.
//!
//! Alone in its test binary: peak RSS is read with `getrusage(RUSAGE_CHILDREN)`, the largest
//! child this process has waited for, so no other test's children may share the process.

use ferry_formats::avro::{Codec, Writer, write_bytes, write_long};
use ferry_tests::{Pipeline, children_max_rss_kib};

const LIMIT_KIB: i64 = 256 << 10;

/// A container file's header (a file with no records, as Ferry's writer writes it).
fn header(schema: &str, codec: &str) -> Vec<u8> {
    Writer::new(Vec::new(), schema, Codec::parse(codec).unwrap(), SYNC).unwrap().finish().unwrap()
}

const SYNC: [u8; 16] = [3; 16];

/// Raw deflate of `data` ending byte-aligned (a full flush), or finished when `last`:
/// such pieces concatenate into one valid stream.
fn deflate_piece(data: &[u8], last: bool) -> Vec<u8> {
    let mut z = flate2::Compress::new(flate2::Compression::best(), false);
    let mut out = Vec::with_capacity(data.len() / 100 + 1024);
    let flush = if last { flate2::FlushCompress::Finish } else { flate2::FlushCompress::Full };
    z.compress_vec(data, &mut out, flush).unwrap();
    out
}

/// A container file of one deflate block holding one record: `prefix`, a string of `mib`
/// MiB of zero characters, `suffix` (the record's other bytes). A thousandfold smaller
/// than what it expands to: the same compressed MiB of zeros, repeated.
fn deflate_bomb(schema: &str, prefix: &[u8], mib: usize, suffix: &[u8]) -> Vec<u8> {
    let mut head = prefix.to_vec();
    write_long(&mut head, (mib << 20) as i64);
    let mut block = deflate_piece(&head, false);
    let zeros = deflate_piece(&vec![b'0'; 1 << 20], false);
    for _ in 0..mib {
        block.extend_from_slice(&zeros);
    }
    block.extend_from_slice(&deflate_piece(suffix, true));
    let mut f = header(schema, "deflate");
    write_long(&mut f, 1);
    write_bytes(&mut f, &block);
    f.extend_from_slice(&SYNC);
    f
}

#[test]
fn hostile_files_cost_bounded_memory_and_get_a_reason_each() {
    let p = Pipeline::new("1MiB", "30s", "0s");
    p.set_columns(
        r#"  { name = "s", type = "string" },
  { name = "ts", type = "timestamp_ms", nullable = false },"#,
        "derive = { dt = \"date(ts)\" }",
    );
    let ts = r#"{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}}"#;
    let mut ts_value = Vec::new();
    write_long(&mut ts_value, 1_796_040_000_000);
    // A few bytes that claim a 2^50-byte block.
    let mut claim = header(r#"{"type":"record","name":"r","fields":[{"name":"s","type":"string"}]}"#, "null");
    write_long(&mut claim, 1);
    write_long(&mut claim, 1 << 50);
    claim.extend_from_slice(b"0123456789");
    std::fs::write(p.path("in/claim.avro"), &claim).unwrap();
    // A 600 MB string deflated to under a megabyte: a flat schema (Ferry's own decoder) and a
    // nested one (arrow-avro's path).
    let flat = format!(r#"{{"type":"record","name":"r","fields":[{{"name":"s","type":"string"}},{ts}]}}"#);
    std::fs::write(p.path("in/bomb.avro"), deflate_bomb(&flat, b"", 600, &ts_value)).unwrap();
    let nested = format!(r#"{{"type":"record","name":"r","fields":[{{"name":"s","type":{{"type":"array","items":"string"}}}},{ts}]}}"#);
    let mut after = vec![0u8];
    after.extend_from_slice(&ts_value);
    std::fs::write(p.path("in/nested-bomb.avro"), deflate_bomb(&nested, &[2], 600, &after)).unwrap();
    // A 100 MB JSON "line" and a CSV whose quote never closes.
    let mut line = b"{\"s\":\"".to_vec();
    line.resize(100 << 20, b'x');
    std::fs::write(p.path("in/line.jsonl"), &line).unwrap();
    let mut csv = b"s,ts\n\"".to_vec();
    csv.resize(100 << 20, b'y');
    std::fs::write(p.path("in/quote.csv"), &csv).unwrap();
    std::fs::write(p.path("in/good.jsonl"), "{\"s\":\"fine\",\"ts\":\"2026-11-30T12:00:00Z\"}\n").unwrap();

    let out = p.stage("ferry-extract");
    assert_eq!(out.status.code(), Some(3), "files quarantined: {}", String::from_utf8_lossy(&out.stderr));
    let extract_kib = children_max_rss_kib();
    let out = p.stage("ferry-transform");
    assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "{}", String::from_utf8_lossy(&out.stderr));
    let transform_kib = children_max_rss_kib();
    println!("peak RSS: extract {} MiB, extract and transform {} MiB", extract_kib >> 10, transform_kib >> 10);
    assert!(extract_kib < LIMIT_KIB, "extract peaked at {} MiB", extract_kib >> 10);
    assert!(transform_kib < LIMIT_KIB, "transform peaked at {} MiB", transform_kib >> 10);

    let file = |f: &str| p.sql(&format!("SELECT state || ': ' || COALESCE(error, '') FROM source_files WHERE uri LIKE '%/{f}'"));
    assert!(file("claim.avro").contains("limit"), "{}", file("claim.avro"));
    assert!(file("line.jsonl").contains("max_record_size"), "{}", file("line.jsonl"));
    assert!(file("quote.csv").contains("max_record_size"), "{}", file("quote.csv"));
    for bomb in ["bomb.avro", "nested-bomb.avro"] {
        let why = p.sql(&format!(
            "SELECT t.state || ': ' || t.last_error FROM tasks t JOIN chunks c ON c.id = t.chunk_id \
             JOIN source_files f ON f.id = c.file_id WHERE f.uri LIKE '%/{bomb}' AND t.stage = 'transform'"
        ));
        assert!(why.starts_with("quarantined") && why.contains("limit") && why.contains("block 0"), "{bomb}: {why}");
    }
    for s in ["ferry-copy", "ferry-load"] {
        assert_eq!(p.stage(s).status.code(), Some(0));
    }
    assert_eq!(p.count("SELECT SUM(records) FROM published"), 1, "the good file is published");
}
