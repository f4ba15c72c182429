//! Table-driven: one case is input bytes (JSON lines, CSV or Avro) and what must come of
//! them: rows with exact values, a rejected record with its reason, or a file set aside with
//! its reason. All cases run through the four real binaries in one pipeline (one file per
//! case; every record's `id` starts with its case's name), and the table is read back by two
//! independent readers, pyarrow and DuckDB, which must agree with each other and with the case.

use std::process::Command;

use ferry_tests::Pipeline;
use serde_json::{Value, json};

enum Expect {
    /// These rows (only the keys given are compared), nothing rejected.
    Rows(Value),
    /// One record rejected with a reason containing this, nothing published from the file.
    Reject(&'static str),
    /// These rows published and one record rejected with this reason.
    RowsAndReject(Value, &'static str),
    /// The whole file set aside (quarantined at extract or transform) with this reason.
    SetAside(&'static str),
}

enum Input {
    Text(&'static str),
    Bytes(Vec<u8>),
    /// fastavro: fields and records as Python literals, and the codec.
    Avro(&'static str, &'static str, &'static str),
}

struct Case {
    name: &'static str,
    ext: &'static str,
    input: Input,
    expect: Expect,
}

const COLUMNS: &str = r#"  { name = "id", type = "string", nullable = false },
  { name = "ts", type = "timestamp", nullable = false },
  { name = "n", type = "long" },
  { name = "i", type = "int" },
  { name = "d", type = "double" },
  { name = "f", type = "float" },
  { name = "b", type = "boolean" },
  { name = "day", type = "date" },
  { name = "s", type = "string" },
  { name = "ms", type = "timestamp_ms" },
  { name = "ns", type = "timestamp_ns" },
  { name = "e", type = "timestamp_ms", epoch = "s" },"#;

/// 2026-11-30T12:00:00Z in microseconds.
const T_US: i64 = 1_796_040_000_000_000;

fn cases() -> Vec<Case> {
    use Expect::*;
    use Input::*;
    let j = |name, line, expect| Case { name, ext: "jsonl", input: Text(line), expect };
    let c = |name, text, expect| Case { name, ext: "csv", input: Text(text), expect };
    let a = |name, fields, records, codec, expect| Case { name, ext: "avro", input: Avro(fields, records, codec), expect };
    vec![
        j(
            "json-exact",
            r#"{"id":"json-exact","ts":"2026-11-30T12:00:00.123456Z","n":-9223372036854775808,"i":-2147483648,"d":0.1,"f":1.5,"b":true,"day":"1900-01-01","s":"é🙂","ms":"2026-11-30T12:00:00.123Z","ns":"2026-11-30T12:00:00.123456789Z","e":1796040000}"#,
            Rows(json!([{"id": "json-exact", "ts": (T_US + 123_456) * 1000, "n": i64::MIN, "i": i32::MIN, "d": 0.1, "f": 1.5, "b": true,
                "day": "1900-01-01", "s": "é🙂", "ms": (T_US + 123_000) * 1000, "ns": T_US * 1000 + 123_456_789, "e": T_US * 1000}])),
        ),
        j("json-int-wraps-not", r#"{"id":"x","ts":"2026-11-30T12:00:00Z","i":3000000000}"#, Reject("out of the range of an int")),
        j("json-fraction", r#"{"id":"x","ts":"2026-11-30T12:00:00Z","n":1.9}"#, Reject("not a whole number")),
        j("json-not-a-number", r#"{"id":"x","ts":"2026-11-30T12:00:00Z","n":"abc"}"#, Reject("is not a number")),
        j("json-long-overflow", r#"{"id":"x","ts":"2026-11-30T12:00:00Z","n":9223372036854775808}"#, Reject("out of the range of a long")),
        j(
            "json-number-as-text",
            r#"{"id":"json-number-as-text","ts":"2026-11-30T12:00:00Z","s":18446744073709551615}"#,
            Rows(json!([{"s": "18446744073709551615"}])),
        ),
        j(
            "json-nested-as-text",
            r#"{"id":"json-nested-as-text","ts":"2026-11-30T12:00:00Z","s":{"a":[1,2.50]}}"#,
            Rows(json!([{"s": "{\"a\":[1,2.50]}"}])),
        ),
        j("json-ms-too-precise", r#"{"id":"x","ts":"2026-11-30T12:00:00Z","ms":"2026-11-30T12:00:00.1234Z"}"#, Reject("more precision")),
        j("json-us-too-precise", r#"{"id":"x","ts":"2026-11-30T12:00:00.1234567Z"}"#, Reject("more precision")),
        j(
            "json-before-1970",
            r#"{"id":"json-before-1970","ts":"1969-12-31T23:59:59.999999Z"}"#,
            Rows(json!([{"ts": -1000, "dt": "1969-12-31"}])),
        ),
        j(
            "json-offset",
            r#"{"id":"json-offset","ts":"2026-11-30T17:30:00+05:30"}"#,
            Rows(json!([{"ts": T_US * 1000, "dt": "2026-11-30"}])),
        ),
        j("json-epoch-unset", r#"{"id":"x","ts":1796040000}"#, Reject("set the column's `epoch`")),
        j("json-ns-range", r#"{"id":"x","ts":"2026-11-30T12:00:00Z","ns":"2300-01-01T00:00:00Z"}"#, Reject("out of the range")),
        j("json-float-overflow", r#"{"id":"x","ts":"2026-11-30T12:00:00Z","f":1e39}"#, Reject("out of the range of a float")),
        j("json-double-overflow", r#"{"id":"x","ts":"2026-11-30T12:00:00Z","d":1e400}"#, Reject("out of the range of a double")),
        j("json-bool-text", r#"{"id":"json-bool-text","ts":"2026-11-30T12:00:00Z","b":"TRUE"}"#, Rows(json!([{"b": true}]))),
        j("json-bool-bad", r#"{"id":"x","ts":"2026-11-30T12:00:00Z","b":"yes"}"#, Reject("true or false")),
        j("json-date-bad", r#"{"id":"x","ts":"2026-11-30T12:00:00Z","day":"2026/11/30"}"#, Reject("a date YYYY-MM-DD")),
        j("json-required-missing", r#"{"ts":"2026-11-30T12:00:00Z"}"#, Reject("\"id\" is required")),
        j("json-required-null", r#"{"id":null,"ts":"2026-11-30T12:00:00Z"}"#, Reject("\"id\" is required")),
        j(
            "json-bad-line-among-good",
            "{\"id\":\"json-bad-line-among-good\",\"ts\":\"2026-11-30T12:00:00Z\"}\n{not json\n",
            RowsAndReject(json!([{"id": "json-bad-line-among-good"}]), "invalid JSON"),
        ),
        j(
            "json-bom-crlf-blank",
            "\u{feff}{\"id\":\"json-bom-crlf-blank#1\",\"ts\":\"2026-11-30T12:00:00Z\"}\r\n\r\n{\"id\":\"json-bom-crlf-blank#2\",\"ts\":\"2026-11-30T12:00:00Z\"}\r\n",
            Rows(json!([{"id": "json-bom-crlf-blank#1"}, {"id": "json-bom-crlf-blank#2"}])),
        ),
        j(
            "json-escapes",
            r#"{"id":"json-escapes","ts":"2026-11-30T12:00:00Z","s":"a\u0000b\n\"c\"\ud83d\ude42"}"#,
            Rows(json!([{"s": "a\u{0}b\n\"c\"🙂"}])),
        ),
        j("json-array-file", r#"[{"id":"x","ts":"2026-11-30T12:00:00Z"}]"#, SetAside("JSON array")),
        Case {
            name: "json-gzip",
            ext: "jsonl",
            input: Bytes(vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            expect: SetAside("gzip"),
        },
        c(
            "csv-exact",
            "id,ts,n,s,b,day,e\ncsv-exact,2026-11-30T12:00:00Z,42,007,false,2026-11-30,1796040000\n",
            Rows(json!([{"n": 42, "s": "007", "b": false, "day": "2026-11-30", "e": T_US * 1000}])),
        ),
        c(
            "csv-quoted",
            "id,ts,s\ncsv-quoted,2026-11-30T12:00:00Z,\"two\nlines, \"\"quoted\"\"\"\n",
            Rows(json!([{"s": "two\nlines, \"quoted\""}])),
        ),
        c("csv-empty-fields", "id,ts,n,s\ncsv-empty-fields,2026-11-30T12:00:00Z,,\n", Rows(json!([{"n": null, "s": ""}]))),
        c("csv-field-count", "id,ts,n\nx,2026-11-30T12:00:00Z\n", Reject("fields")),
        c("csv-int-overflow", "id,ts,i\nx,2026-11-30T12:00:00Z,2147483648\n", Reject("out of the range of an int")),
        c("csv-header-lacks-required", "a,b\n1,2\n", SetAside("CSV header has no column \"id\"")),
        a(
            "avro-exact",
            "[{'name': 'id', 'type': 'string'}, {'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}},
              {'name': 'n', 'type': 'long'}, {'name': 'i', 'type': 'int'}, {'name': 'd', 'type': 'double'}, {'name': 'f', 'type': 'float'},
              {'name': 'b', 'type': 'boolean'}, {'name': 'day', 'type': {'type': 'int', 'logicalType': 'date'}},
              {'name': 's', 'type': ['null', 'string']}, {'name': 'ms', 'type': {'type': 'long', 'logicalType': 'timestamp-millis'}}]",
            "[{'id': 'avro-exact', 'ts': 1796040000123456, 'n': -5, 'i': 7, 'd': 0.1, 'f': 0.5, 'b': True, 'day': -1,
               's': 'é', 'ms': 1796040000123}]",
            "deflate",
            Rows(json!([{"ts": (T_US + 123_456) * 1000, "n": -5, "i": 7, "d": 0.1, "f": 0.5, "b": true, "day": "1969-12-31", "s": "é",
                "ms": (T_US + 123_000) * 1000}])),
        ),
        a(
            "avro-one-bad-record",
            "[{'name': 'id', 'type': 'string'}, {'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}},
              {'name': 'i', 'type': 'long'}]",
            "[{'id': 'avro-one-bad-record#1', 'ts': 1796040000000000, 'i': 1}, {'id': 'x', 'ts': 1796040000000000, 'i': 3000000000},
              {'id': 'avro-one-bad-record#3', 'ts': 1796040000000000, 'i': -1}]",
            "snappy",
            RowsAndReject(json!([{"id": "avro-one-bad-record#1", "i": 1}, {"id": "avro-one-bad-record#3", "i": -1}]), "does not fit"),
        ),
        a(
            "avro-micros-into-ms",
            "[{'name': 'id', 'type': 'string'}, {'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}},
              {'name': 'ms', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}}]",
            "[{'id': 'x', 'ts': 1796040000000000, 'ms': 1796040000000001}]",
            "null",
            Reject("does not fit"),
        ),
        a(
            "avro-null-into-required",
            "[{'name': 'id', 'type': ['null', 'string']}, {'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}}]",
            "[{'id': None, 'ts': 1796040000000000}]",
            "zstandard",
            Reject("\"id\" is required"),
        ),
        a(
            "avro-array-into-string",
            "[{'name': 'id', 'type': 'string'}, {'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}},
              {'name': 's', 'type': {'type': 'array', 'items': 'long'}}]",
            "[{'id': 'x', 'ts': 1796040000000000, 's': [1, 2]}]",
            "null",
            Reject("column \"s\": a List"),
        ),
        a(
            "avro-map-into-string",
            "[{'name': 'id', 'type': 'string'}, {'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}},
              {'name': 's', 'type': {'type': 'map', 'values': 'long'}}]",
            "[{'id': 'x', 'ts': 1796040000000000, 's': {'a': 1}}]",
            "deflate",
            Reject("column \"s\": a Map"),
        ),
        a(
            "avro-record-into-string",
            "[{'name': 'id', 'type': 'string'}, {'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}},
              {'name': 's', 'type': {'type': 'record', 'name': 'R', 'fields': [{'name': 'x', 'type': 'long'}]}}]",
            "[{'id': 'x', 'ts': 1796040000000000, 's': {'x': 1}}]",
            "null",
            Reject("column \"s\": a Struct"),
        ),
        a(
            "avro-union-into-string",
            "[{'name': 'id', 'type': 'string'}, {'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}},
              {'name': 's', 'type': ['null', 'long', 'string']}]",
            "[{'id': 'x', 'ts': 1796040000000000, 's': 5}]",
            "null",
            Reject("column \"s\": a Union"),
        ),
        a(
            "avro-missing-required-column",
            "[{'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}}]",
            "[{'ts': 1796040000000000}]",
            "null",
            SetAside("no required column \"id\""),
        ),
    ]
}

/// Both readers' rows, timestamps as integer nanoseconds (`T_US * 1000`), dates as text, keyed by `id`.
fn read_back(p: &Pipeline) -> (Value, Value) {
    let script = r#"
import sys, json, duckdb, pyarrow as pa, pyarrow.dataset as ds
root = sys.argv[1]
t = ds.dataset(root, format="parquet", partitioning="hive").to_table()
cols = {}
for f in t.schema:
    c = t.column(f.name)
    if pa.types.is_timestamp(f.type):
        c = c.cast(pa.timestamp("ns", f.type.tz)).cast(pa.int64())
    elif pa.types.is_date(f.type) or pa.types.is_dictionary(f.type):
        c = c.cast(pa.string())
    cols[f.name] = c.to_pylist()
arrow_rows = [dict(zip(cols, v)) for v in zip(*cols.values())]
rel = duckdb.sql(f"SELECT * FROM read_parquet('{root}/**/*.parquet', hive_partitioning = true, union_by_name = true)")
exprs = []
for name, ty in zip(rel.columns, rel.types):
    ty = str(ty)
    if ty.startswith("TIMESTAMP"):
        exprs.append(f'epoch_ns("{name}") AS "{name}"')
    elif ty == "DATE":
        exprs.append(f'CAST("{name}" AS VARCHAR) AS "{name}"')
    else:
        exprs.append(f'"{name}"')
res = duckdb.sql(f"SELECT {', '.join(exprs)} FROM read_parquet('{root}/**/*.parquet', hive_partitioning = true, union_by_name = true)")
duck_rows = [dict(zip(res.columns, r)) for r in res.fetchall()]
key = lambda r: r["id"]
print(json.dumps([sorted(arrow_rows, key=key), sorted(duck_rows, key=key)], default=str))
"#;
    let out = Command::new("python3").arg("-c").arg(script).arg(p.path("wh/events")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (v[0].clone(), v[1].clone())
}

#[test]
fn every_case_gets_its_exact_answer() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.set_columns(COLUMNS, "derive = { dt = \"date(ts)\" }");
    let cases = cases();
    for case in &cases {
        let path = p.path(&format!("in/{}.{}", case.name, case.ext));
        match &case.input {
            Input::Text(t) => std::fs::write(&path, format!("{t}\n")).unwrap(),
            Input::Bytes(b) => std::fs::write(&path, b).unwrap(),
            Input::Avro(fields, records, codec) => {
                let script = format!(
                    "import sys, fastavro\nfastavro.writer(open(sys.argv[1], 'wb'), {{'type': 'record', 'name': 'r', 'fields': {fields}}}, {records}, codec='{codec}')\n"
                );
                let out = Command::new("python3").arg("-c").arg(script).arg(&path).output().unwrap();
                assert!(out.status.success(), "{}: {}", case.name, String::from_utf8_lossy(&out.stderr));
            }
        }
    }
    for s in ferry_tests::STAGES {
        let out = p.stage(s);
        assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let (arrow_rows, duck_rows) = read_back(&p);
    assert_eq!(arrow_rows, duck_rows, "pyarrow and DuckDB read the same table");
    let rows = arrow_rows.as_array().unwrap();
    let mut failures = Vec::new();
    for case in &cases {
        let file = format!("{}.{}", case.name, case.ext);
        let mine: Vec<&Value> = rows.iter().filter(|r| r["id"].as_str().is_some_and(|id| id.starts_with(case.name))).collect();
        let rejects = p.sql(&format!(
            "SELECT COALESCE(group_concat(r.reason, ' | '), '') FROM rejects r JOIN chunks c ON c.id = r.chunk_id \
             JOIN source_files f ON f.id = c.file_id WHERE f.uri LIKE '%/{file}'"
        ));
        let set_aside = p.sql(&format!(
            "SELECT COALESCE(f.error, '') || ' ' || COALESCE((SELECT group_concat(t.last_error) FROM tasks t JOIN chunks c \
             ON c.id = t.chunk_id WHERE c.file_id = f.id AND t.state = 'quarantined'), '') FROM source_files f WHERE f.uri LIKE '%/{file}'"
        ));
        let rows_match = |want: &Value| -> Result<(), String> {
            let want = want.as_array().unwrap();
            if want.len() != mine.len() {
                return Err(format!("{} rows, want {}: {mine:?}", mine.len(), want.len()));
            }
            for (w, got) in want.iter().zip(&mine) {
                for (k, v) in w.as_object().unwrap() {
                    let g = &got[k];
                    let same = match (g.as_f64(), v.as_f64()) {
                        (Some(a), Some(b)) if !g.is_i64() || !v.is_i64() => a == b,
                        _ => g == v,
                    };
                    if !same {
                        return Err(format!("{k} = {g}, want {v}"));
                    }
                }
            }
            Ok(())
        };
        let verdict = match &case.expect {
            Expect::Rows(want) => {
                rows_match(want).and_then(|_| if rejects.is_empty() { Ok(()) } else { Err(format!("unexpected rejects: {rejects}")) })
            }
            Expect::Reject(why) => {
                if !mine.is_empty() {
                    Err(format!("rows published: {mine:?}"))
                } else if !rejects.contains(why) {
                    Err(format!("rejects {rejects:?} do not say {why:?} (set aside: {set_aside})"))
                } else {
                    Ok(())
                }
            }
            Expect::RowsAndReject(want, why) => rows_match(want).and_then(|_| {
                if rejects.contains(why) && rejects.matches(" | ").count() == 0 {
                    Ok(())
                } else {
                    Err(format!("want one reject saying {why:?}, got {rejects:?}"))
                }
            }),
            Expect::SetAside(why) => {
                if !mine.is_empty() || !set_aside.contains(why) {
                    Err(format!("want the file set aside for {why:?}; set aside: {set_aside:?}, rows: {mine:?}"))
                } else {
                    Ok(())
                }
            }
        };
        if let Err(e) = verdict {
            failures.push(format!("{}: {e}", case.name));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
    // The DDL names every column the files hold, with the recorded schema's types.
    let ddl = std::fs::read_to_string(p.path("wh/events/_ferry/ddl.sql")).unwrap();
    for col in ["`ns` TIMESTAMP", "`i` INT", "`f` FLOAT", "`day` DATE", "`e` TIMESTAMP", "PARTITIONED BY (`dt` DATE)"] {
        assert!(ddl.contains(col), "{col}:\n{ddl}");
    }
}
