//! A bounded-time mutation fuzzer for everything that reads input bytes: extract's splitters
//! (Avro blocks, JSON lines, CSV records) and the decoders transform runs (the flat Avro
//! decoder, the arrow-avro path, JSON lines, CSV).
//!
//! Seeds are valid files of every format and Avro codec (flat and nested schemas); each round
//! mutates one (bit flips, boundary bytes, huge varints, cut, duplicated and spliced ranges)
//! and runs every reader on it. A reader may reject the bytes, never panic, hang or allocate
//! what a length merely claims (the readers run with a 1 MiB record limit). A panicking input
//! is written to `$CARGO_TARGET_TMPDIR/fuzz-crashes/` and fails the test; copied into
//! `tests/fuzz-regressions/` it is replayed by every run after.
//!
//! `FERRY_FUZZ_SECS` (default 20) bounds the time, `FERRY_FUZZ_SEED` picks the sequence
//! (default: from the clock, printed so a failure can be replayed).

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;

use ferry_admin::sample::{AvroCodec, events, write_events};
use ferry_common::config::{ColumnSpec, ColumnType, CsvOptions, Format};

const LIMIT: usize = 1 << 20;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds() -> Vec<(Format, Vec<u8>)> {
    let mut out = Vec::new();
    for codec in [AvroCodec::Null, AvroCodec::Deflate, AvroCodec::Snappy, AvroCodec::Zstandard] {
        let mut f = Vec::new();
        write_events(&mut f, Format::Avro, events(1, 40, 0), codec, 7).unwrap();
        out.push((Format::Avro, f));
    }
    for format in [Format::Jsonl, Format::Csv] {
        let mut f = Vec::new();
        write_events(&mut f, format, events(2, 30, 0), AvroCodec::Null, 7).unwrap();
        out.push((format, f));
    }
    // Nested: an array of strings, a map and a record (the arrow-avro path).
    let schema = r#"{"type":"record","name":"R","fields":[{"name":"a","type":{"type":"array","items":"string"}},
        {"name":"m","type":{"type":"map","values":"long"}},{"name":"r","type":{"type":"record","name":"I","fields":[{"name":"x","type":["null","string"]}]}}]}"#;
    let mut w = ferry_formats::avro::Writer::new(Vec::new(), schema, ferry_formats::avro::Codec::Deflate, [1; 16]).unwrap();
    for i in 0..20i64 {
        w.record(|b| {
            use ferry_formats::avro::{write_bytes, write_long};
            write_long(b, 2);
            write_bytes(b, b"ab");
            write_bytes(b, "é".as_bytes());
            write_long(b, 0);
            write_long(b, 1);
            write_bytes(b, b"k");
            write_long(b, i);
            write_long(b, 0);
            write_long(b, 1);
            write_bytes(b, b"x");
        });
        if i % 6 == 5 {
            w.end_block().unwrap();
        }
    }
    out.push((Format::Avro, w.finish().unwrap()));
    out
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    for _ in 0..1 + rng.below(4) {
        let len = data.len().max(1);
        match rng.below(8) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = [0, 0xff, 0x7f, 0x80, b'\n', b'"', b',', b'{'][rng.below(8)];
            }
            2 => {
                // A varint claiming a huge or negative length.
                let i = rng.below(len);
                let v: &[u8] =
                    [&[0xff, 0xff, 0xff, 0xff, 0x0f][..], &[0x01], &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02]][rng.below(3)];
                data.splice(i.min(data.len())..(i + v.len()).min(data.len()), v.iter().copied());
            }
            3 => data.truncate(rng.below(len)),
            4 if !data.is_empty() => {
                let a = rng.below(data.len());
                let b = (a + rng.below(64)).min(data.len());
                data.drain(a..b);
            }
            5 if !data.is_empty() => {
                let a = rng.below(data.len());
                let b = (a + rng.below(256)).min(data.len());
                let piece = data[a..b].to_vec();
                let at = rng.below(data.len());
                data.splice(at..at, piece);
            }
            6 if !other.is_empty() => {
                let a = rng.below(other.len());
                let b = (a + rng.below(512)).min(other.len());
                let at = rng.below(len).min(data.len());
                data.splice(at..at, other[a..b].iter().copied());
            }
            _ => {
                let at = rng.below(len).min(data.len());
                data.insert(at, rng.next() as u8);
            }
        }
    }
}

/// Every reader on `data`; the result does not matter, only that each returns.
fn run_all(data: &[u8]) {
    let dialect = CsvOptions::default();
    for format in [Format::Avro, Format::Jsonl, Format::Csv] {
        let mut pieces = Vec::new();
        let _ = ferry_formats::split(format, data, ferry_formats::Cut::Size(4096), LIMIT, &dialect, &mut Vec::new(), |p| {
            pieces.push(p.bytes.to_vec());
            Ok::<(), String>(())
        });
        if format == Format::Avro {
            for p in pieces.iter().chain([&data.to_vec()]) {
                let _ = ferry_formats::avro::decode::decode(&p[..], 16, LIMIT, &mut |_, _| Ok(()));
            }
        }
    }
    let specs: Vec<ColumnSpec> = [("event_id", ColumnType::String), ("ts", ColumnType::Timestamp), ("user_id", ColumnType::Long)]
        .into_iter()
        .map(|(name, ty)| ColumnSpec { name: name.into(), ty, nullable: true, epoch: None })
        .collect();
    for format in [Format::Jsonl, Format::Csv] {
        let how = ferry_formats::decode::Decoding {
            path: "fuzz",
            columns: &specs,
            names: ferry_formats::decode::Names::Exact,
            csv: &dialect,
            first_record: 0,
            batch_size: 16,
            max_bad: u64::MAX,
            max_record_size: LIMIT,
            size_hint: 0,
        };
        let _ = ferry_formats::decode::decoder(format).decode(&mut &data[..], &how, &mut |_, _| Ok(()));
    }
}

fn regressions() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions")
}

#[test]
fn every_reader_survives_mutated_input() {
    // Every input that once crashed a reader, first.
    let mut replayed = 0;
    for e in std::fs::read_dir(regressions()).unwrap() {
        let path = e.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        assert!(std::panic::catch_unwind(|| run_all(&data)).is_ok(), "regression {} panics again", path.display());
        replayed += 1;
    }
    let secs: u64 = std::env::var("FERRY_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    // A fixed seed by default: the suite's run is the same every time, so a red run reproduces
    // and a green one is not luck. New ground is walked with FERRY_FUZZ_SEED (and
    // FERRY_FUZZ_SECS), e.g. `FERRY_FUZZ_SEED=$RANDOM FERRY_FUZZ_SECS=600`; an input that
    // crashes a reader goes into tests/fuzz-regressions, replayed above on every run.
    let seed: u64 = std::env::var("FERRY_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_f022_0001);
    println!("fuzz: seed {seed} (FERRY_FUZZ_SEED), {secs} s, {replayed} regressions replayed");
    let seeds = seeds();
    let mut rng = Rng(seed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let crashes = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-crashes");
    let mut rounds = 0u64;
    let mut failed = Vec::new();
    // Panics are caught and counted; keep their messages out of the output.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    while std::time::Instant::now() < deadline {
        let (_, base) = &seeds[rng.below(seeds.len())];
        let (_, other) = &seeds[rng.below(seeds.len())];
        let mut data = base.clone();
        mutate(&mut rng, &mut data, other);
        let started = std::time::Instant::now();
        let ok = std::panic::catch_unwind(AssertUnwindSafe(|| run_all(&data))).is_ok();
        let slow = started.elapsed() > std::time::Duration::from_secs(5);
        if !ok || slow {
            std::fs::create_dir_all(&crashes).unwrap();
            let path = crashes.join(format!("{}-{rounds}.bin", if ok { "slow" } else { "panic" }));
            std::fs::write(&path, &data).unwrap();
            failed.push(path);
        }
        rounds += 1;
    }
    std::panic::set_hook(hook);
    println!("fuzz: {rounds} inputs");
    assert!(rounds > 100, "too few rounds to mean anything: {rounds}");
    assert!(failed.is_empty(), "inputs that panicked or took over 5 s (seed {seed}): {failed:?}");
}
