//! Every input gets an exact answer: kept as written, or rejected with its reason. Values
//! that do not fit their column (range, precision, a null where one is required) are
//! rejected one record at a time, for Avro as for JSON lines and CSV, and the rest of the
//! chunk is published; read back by pyarrow, the kept values are the input's, digit for digit.

use std::process::Command;

use ferry_tests::Pipeline;

fn set_columns(p: &Pipeline, columns: &str, derive: &str) {
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    let start = cfg.find("columns = [").unwrap();
    let end = start + cfg[start..].find("]\n").unwrap() + 2;
    let cfg = format!("{}columns = [\n{columns}\n]\n{}", &cfg[..start], &cfg[end..]);
    let cfg = cfg.replace("derive = { dt = \"date(ts)\" }", derive);
    std::fs::write(&p.config, cfg).unwrap();
}

fn run(p: &Pipeline) {
    for s in ferry_tests::STAGES {
        let out = p.stage(s);
        assert_eq!(out.status.code(), Some(0), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// The published table as JSON rows (pyarrow), timestamps as integers in their unit.
fn table(p: &Pipeline) -> Vec<serde_json::Value> {
    let script = r#"
import sys, json, pyarrow as pa, pyarrow.dataset as ds
t = ds.dataset(sys.argv[1], format="parquet", partitioning="hive").to_table()
cols = {}
for f in t.schema:
    c = t.column(f.name)
    if pa.types.is_timestamp(f.type):
        c = c.cast(pa.int64())
    elif pa.types.is_date(f.type) or pa.types.is_dictionary(f.type):
        c = c.cast(pa.string())
    cols[f.name] = c.to_pylist()
rows = [dict(zip(cols, vals)) for vals in zip(*cols.values())]
print(json.dumps(sorted(rows, key=lambda r: str(r.get("id")))))
"#;
    let out = Command::new("python3").arg("-c").arg(script).arg(p.path("wh/events")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn avro_values_that_do_not_fit_reject_their_record_only() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    set_columns(
        &p,
        r#"  { name = "id", type = "string", nullable = false },
  { name = "n", type = "int" },
  { name = "ts", type = "timestamp_ms", nullable = false },
  { name = "name", type = "string", nullable = false },"#,
        "derive = { dt = \"date(ts)\" }",
    );
    let writer = r#"
import sys, fastavro
schema = {"type": "record", "name": "e", "fields": [
    {"name": "id", "type": "string"},
    {"name": "n", "type": "long"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "name", "type": ["null", "string"]}]}
recs = [
    {"id": "a-ok", "n": 5, "ts": 1796040000123000, "name": "x"},
    {"id": "b-wide", "n": 3000000000, "ts": 1796040000123000, "name": "x"},
    {"id": "c-fine", "n": 1, "ts": 1796040000123456, "name": "x"},
    {"id": "d-null", "n": 1, "ts": 1796040000000000, "name": None},
    {"id": "e-old", "n": -7, "ts": -1000, "name": "y"},
]
with open(sys.argv[1], "wb") as f:
    fastavro.writer(f, schema, recs)
"#;
    let out = Command::new("python3").arg("-c").arg(writer).arg(p.path("in/e.avro")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    run(&p);
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'"), 0, "one bad record does not quarantine the chunk");
    let rows = table(&p);
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a-ok", "e-old"], "{rows:?}");
    assert_eq!(rows[0]["ts"], 1_796_040_000_123i64);
    assert_eq!(rows[1]["ts"], -1, "-1000 microseconds is -1 millisecond exactly");
    assert_eq!(rows[1]["dt"], "1969-12-31", "before 1970: its own day");
    let reasons = p.sql("SELECT group_concat(reason, ' | ') FROM (SELECT reason FROM rejects ORDER BY position)");
    assert!(reasons.contains("\"n\"") && reasons.contains("3000000000"), "{reasons}");
    assert!(reasons.contains("\"ts\"") && reasons.contains("exactly"), "{reasons}");
    assert!(reasons.contains("\"name\" is required"), "{reasons}");
    assert_eq!(p.count("SELECT COUNT(*) FROM rejects"), 3);
}

#[test]
fn json_and_csv_values_are_published_as_written() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    set_columns(
        &p,
        r#"  { name = "id", type = "string", nullable = false },
  { name = "big", type = "string" },
  { name = "ts", type = "timestamp", nullable = false },
  { name = "at", type = "timestamp_ms", epoch = "s" },
  { name = "n", type = "long" },"#,
        "derive = { dt = \"date(ts)\" }",
    );
    std::fs::write(
        p.path("in/a.jsonl"),
        concat!(
            "{\"id\":\"1\",\"big\":18446744073709551615,\"ts\":\"2026-11-30T12:00:00.123456Z\",\"at\":1796040000,\"n\":1}\n",
            "{\"id\":\"2\",\"big\":\"x\",\"ts\":\"1969-12-31T23:59:59.999999Z\",\"n\":9223372036854775807}\n",
            "{\"id\":\"3\",\"big\":\"x\",\"ts\":\"2026-11-30T12:00:00Z\",\"n\":1.5}\n",
            "{\"id\":\"4\",\"big\":\"x\",\"ts\":\"2026-11-30T12:00:00.1234567Z\",\"n\":2}\n",
        ),
    )
    .unwrap();
    std::fs::write(
        p.path("in/b.csv"),
        "\u{feff}id,big,ts,at,n\n5,007,2026-11-30T00:00:00Z,1796040000,\n6,x,2026-11-30T00:00:00Z,,99999999999999999999\n",
    )
    .unwrap();
    run(&p);
    let rows = table(&p);
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["1", "2", "5"], "{rows:?}");
    assert_eq!(rows[0]["big"], "18446744073709551615", "number text kept digit for digit");
    assert_eq!(rows[0]["ts"], 1_796_040_000_123_456i64, "microseconds kept");
    assert_eq!(rows[0]["at"], 1_796_040_000_000i64, "epoch seconds taken as seconds");
    assert_eq!(rows[1]["ts"], -1);
    assert_eq!(rows[1]["dt"], "1969-12-31");
    assert_eq!(rows[1]["n"], 9_223_372_036_854_775_807i64);
    assert_eq!(rows[2]["big"], "007", "CSV text stays text");
    assert_eq!(p.count("SELECT COUNT(*) FROM rejects"), 3, "{}", p.sql("SELECT group_concat(reason, ' | ') FROM rejects"));
}
