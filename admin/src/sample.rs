//! Deterministic sample events for `ferry gen`, shaped like the stress test of seed 000:
//! records of 200 B to 1 KB with an event id, a timestamp, a host, a kind, a user id, a
//! payload and a nullable score. The same seed always gives the same bytes.

use std::io::Write;

use ferry_common::config::Format;
use ferry_formats::avro::{self, write_bytes, write_long};

pub const EVENT_AVRO_SCHEMA: &str = r#"{"type":"record","name":"Event","namespace":"ferry.sample","fields":[{"name":"event_id","type":"string"},{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},{"name":"host","type":"string"},{"name":"kind","type":"string"},{"name":"user_id","type":"long"},{"name":"payload","type":"string"},{"name":"score","type":["null","double"],"default":null}]}"#;

/// The table columns of the sample events, as `[[table.columns]]` would declare them.
pub const EVENT_COLUMNS: &[(&str, &str, bool)] = &[
    ("event_id", "string", false),
    ("ts", "timestamp", false),
    ("host", "string", false),
    ("kind", "string", false),
    ("user_id", "long", false),
    ("payload", "string", false),
    ("score", "double", true),
];

const KINDS: &[&str] = &["click", "view", "purchase", "login", "logout", "search", "error"];

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub event_id: String,
    pub ts_ms: i64,
    pub host: String,
    pub kind: &'static str,
    pub user_id: i64,
    pub payload: String,
    pub score: Option<f64>,
}

/// splitmix64: tiny, fast, and stable across releases (unlike a library RNG's stream).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// What payloads are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Payload {
    /// Words of a fixed 4,096-word vocabulary: compresses the way log lines and JSON do (zstd
    /// keeps about 36% of the Avro bytes, close to the 373 MB per ~1 GB of the issue's
    /// reference run).
    #[default]
    Words,
    /// Random lowercase letters: only entropy coding helps, the hardest case for a codec.
    Letters,
}

/// The vocabulary of [`Payload::Words`]: the same for every seed, 2 to 10 letters a word.
fn vocabulary() -> &'static [String] {
    static WORDS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    WORDS.get_or_init(|| {
        let mut rng = Rng::new(0x5eed_0f70_c4b0_1a00);
        (0..4096).map(|_| (0..2 + rng.below(9)).map(|_| (b'a' + rng.below(26) as u8) as char).collect()).collect()
    })
}

/// Generates `n` events with word payloads; see [`events_with`].
pub fn events(seed: u64, n: usize, start_ms: i64) -> impl Iterator<Item = Event> {
    events_with(seed, n, start_ms, Payload::Words)
}

/// Generates `n` events; `start_ms` is the first timestamp, and timestamps advance so that
/// a file spans a few days (several `dt` partitions).
pub fn events_with(seed: u64, n: usize, start_ms: i64, kind: Payload) -> impl Iterator<Item = Event> {
    events_spread(seed, n, start_ms, kind, DEFAULT_GAP_MS)
}

/// The mean time between two events: a day holds ~300k events, so big runs span a few `dt`
/// partitions.
pub const DEFAULT_GAP_MS: u64 = 300;

/// [`events_with`], with `gap_ms` the mean time between two events (a larger gap spreads each
/// file, and each chunk of it, over more `dt` partitions).
pub fn events_spread(seed: u64, n: usize, start_ms: i64, kind: Payload, gap_ms: u64) -> impl Iterator<Item = Event> {
    let words = vocabulary();
    let mut rng = Rng::new(seed);
    let mut ts = start_ms;
    let span = (2 * gap_ms).max(1);
    (0..n).map(move |i| {
        ts += rng.below(span) as i64;
        let payload_len = 120 + rng.below(800) as usize;
        let mut payload = String::with_capacity(payload_len + 12);
        while payload.len() < payload_len {
            // Mostly text; now and then a comma, a quote or a newline, so CSV quoting is real.
            let c = match rng.below(200) {
                0 => ',',
                1 => '"',
                2 if i % 97 == 0 => '\n',
                _ => match kind {
                    Payload::Letters => (b'a' + rng.below(26) as u8) as char,
                    Payload::Words => ' ',
                },
            };
            payload.push(c);
            if kind == Payload::Words {
                payload.push_str(&words[rng.below(words.len() as u64) as usize]);
            }
        }
        payload.truncate(payload_len); // ASCII: any length is a character boundary
        Event {
            event_id: format!("{:016x}{:016x}", seed, rng.next_u64() ^ i as u64),
            ts_ms: ts,
            host: format!("host-{:03}", rng.below(64)),
            kind: KINDS[rng.below(KINDS.len() as u64) as usize],
            user_id: rng.below(1_000_000) as i64,
            payload,
            score: if rng.below(5) == 0 { None } else { Some(rng.below(1_000_000) as f64 / 1000.0) },
        }
    })
}

/// Avro object container codec for `ferry gen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AvroCodec {
    Null,
    Deflate,
    Snappy,
    Zstandard,
}

impl AvroCodec {
    fn codec(self) -> avro::Codec {
        match self {
            AvroCodec::Null => avro::Codec::Null,
            AvroCodec::Deflate => avro::Codec::Deflate,
            AvroCodec::Snappy => avro::Codec::Snappy,
            AvroCodec::Zstandard => avro::Codec::Zstandard,
        }
    }
}

/// Writes events in `format` to `out`. Avro blocks hold `block_records` records each.
pub fn write_events(
    out: &mut impl Write,
    format: Format,
    events: impl Iterator<Item = Event>,
    codec: AvroCodec,
    block_records: usize,
) -> std::io::Result<u64> {
    match format {
        Format::Jsonl => {
            let mut n = 0;
            for e in events {
                let v = serde_json::json!({
                    "event_id": e.event_id,
                    "ts": chrono::DateTime::from_timestamp_millis(e.ts_ms).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
                    "host": e.host,
                    "kind": e.kind,
                    "user_id": e.user_id,
                    "payload": e.payload,
                    "score": e.score,
                });
                serde_json::to_writer(&mut *out, &v)?;
                out.write_all(b"\n")?;
                n += 1;
            }
            Ok(n)
        }
        Format::Csv => {
            let mut w = csv::Writer::from_writer(out);
            w.write_record(EVENT_COLUMNS.iter().map(|c| c.0))?;
            let mut n = 0;
            for e in events {
                let ts = chrono::DateTime::from_timestamp_millis(e.ts_ms)
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                    .unwrap_or_default();
                let score = e.score.map(|s| s.to_string()).unwrap_or_default();
                w.write_record([e.event_id.as_str(), &ts, &e.host, e.kind, &e.user_id.to_string(), &e.payload, &score])?;
                n += 1;
            }
            w.flush()?;
            Ok(n)
        }
        Format::Avro => write_avro(out, events, codec, block_records),
    }
}

/// The sync marker of the files `ferry gen` writes: fixed, so the same seed gives the same bytes.
pub fn sync_marker() -> [u8; 16] {
    *blake3::hash(b"ferry sample sync").as_bytes().first_chunk().expect("32 bytes")
}

/// An Avro object container file of events, `block_records` records a block.
fn write_avro(out: &mut impl Write, events: impl Iterator<Item = Event>, codec: AvroCodec, block_records: usize) -> std::io::Result<u64> {
    let mut w = avro::Writer::new(out, EVENT_AVRO_SCHEMA, codec.codec(), sync_marker())?;
    let mut total = 0;
    for e in events {
        w.record(|block| {
            write_bytes(block, e.event_id.as_bytes());
            write_long(block, e.ts_ms);
            write_bytes(block, e.host.as_bytes());
            write_bytes(block, e.kind.as_bytes());
            write_long(block, e.user_id);
            write_bytes(block, e.payload.as_bytes());
            match e.score {
                None => write_long(block, 0),
                Some(s) => {
                    write_long(block, 1);
                    block.extend_from_slice(&s.to_le_bytes());
                }
            }
        });
        total += 1;
        if w.pending() as usize >= block_records.max(1) {
            w.end_block()?;
        }
    }
    w.finish()?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_sized_like_seed_000() {
        let a: Vec<Event> = events(7, 500, 0).collect();
        let b: Vec<Event> = events(7, 500, 0).collect();
        assert_eq!(a, b);
        for e in &a {
            let size = e.event_id.len() + e.host.len() + e.kind.len() + e.payload.len() + 24;
            assert!((150..=1100).contains(&size), "{size}");
        }
        assert!(a.iter().any(|e| e.score.is_none()));
        assert!(a.iter().any(|e| e.payload.contains('\n')));
        // Words come from a small vocabulary, so they repeat: text that compresses.
        let tokens: Vec<&str> = a.iter().flat_map(|e| e.payload.split(' ')).collect();
        let distinct: std::collections::HashSet<&str> = tokens.iter().copied().collect();
        assert!(distinct.len() * 5 < tokens.len(), "{} of {}", distinct.len(), tokens.len());
        let letters: Vec<Event> = events_with(7, 500, 0, Payload::Letters).collect();
        assert!(letters.iter().all(|e| !e.payload.contains(' ') && (120..920).contains(&e.payload.len())));
    }

    #[test]
    fn avro_container_layout() {
        for codec in [AvroCodec::Null, AvroCodec::Deflate, AvroCodec::Snappy, AvroCodec::Zstandard] {
            let mut out = Vec::new();
            let n = write_events(&mut out, Format::Avro, events(1, 250, 0), codec, 100).unwrap();
            assert_eq!(n, 250);
            assert_eq!(&out[..4], b"Obj\x01");
            let sync = sync_marker();
            // three blocks (100, 100, 50), each ending with the sync marker, plus the header's
            let marks = out.windows(16).filter(|w| *w == sync).count();
            assert_eq!(marks, 4, "{codec:?}");
        }
    }
}
