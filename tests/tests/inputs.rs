//! Every input gets an exact answer: kept as written, or rejected with its reason. Values
//! that do not fit their column (range, precision, a null where one is required) are
//! rejected one record at a time, for Avro as for JSON lines and CSV, and the rest of the
//! chunk is published; read back by pyarrow, the kept values are the input's, digit for digit.

use std::process::Command;

use ferry_tests::Pipeline;

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
    p.set_columns(
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
    p.set_columns(
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

/// A name holding a backtick (here from `transform.rename`) is quoted, not pasted: the DDL
/// still holds one CREATE statement with the column named as configured.
#[test]
fn names_in_the_ddl_are_quoted_whatever_they_hold() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.set_columns(
        r#"  { name = "id", type = "string", nullable = false },
  { name = "ts", type = "timestamp", nullable = false },
  { name = "n", type = "long" },"#,
        "derive = { dt = \"date(ts)\" }\nrename = { n = \"n`) STORED AS TEXTFILE; --\" }",
    );
    std::fs::write(p.path("in/a.jsonl"), "{\"id\":\"1\",\"ts\":\"2026-11-30T12:00:00Z\",\"n\":1}\n").unwrap();
    run(&p);
    let ddl = std::fs::read_to_string(p.path("wh/events/_ferry/ddl.sql")).unwrap();
    assert!(ddl.contains("  `n``) STORED AS TEXTFILE; --` BIGINT\n"), "{ddl}");
    assert_eq!(ddl.matches("STORED AS").count(), 2, "the name's text plus the one real clause:\n{ddl}");
    assert!(ddl.contains("\nSTORED AS PARQUET\n"), "{ddl}");
}

/// The DDL describes the files exactly: every column the Parquet files hold (derived ones
/// too) with its type, the partition columns typed as declared, partition values unescaped,
/// and an empty or null value in the default partition, as Hive and Spark write it.
#[test]
fn the_ddl_matches_the_parquet_files() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.set_columns(
        r#"  { name = "id", type = "string", nullable = false },
  { name = "ts", type = "timestamp", nullable = false },
  { name = "kind", type = "string" },
  { name = "n", type = "long" },"#,
        "derive = { dt = \"date(ts)\", hr = \"hour(ts)\" }",
    );
    let cfg = std::fs::read_to_string(&p.config).unwrap().replace("partition_by = [\"dt\"]", "partition_by = [\"dt\", \"kind\"]");
    std::fs::write(&p.config, cfg).unwrap();
    std::fs::write(
        p.path("in/a.jsonl"),
        concat!(
            "{\"id\":\"1\",\"ts\":\"2026-11-30T12:00:00Z\",\"kind\":\"a/b\",\"n\":1}\n",
            "{\"id\":\"2\",\"ts\":\"2026-11-30T13:00:00Z\",\"kind\":\"\",\"n\":2}\n",
            "{\"id\":\"3\",\"ts\":\"2026-11-30T14:00:00Z\",\"n\":3}\n",
            "{\"id\":\"4\",\"ts\":\"2026-11-30T15:00:00Z\",\"kind\":\"it's\",\"n\":4}\n",
        ),
    )
    .unwrap();
    run(&p);
    let ddl = std::fs::read_to_string(p.path("wh/events/_ferry/ddl.sql")).unwrap();
    let check = r#"
import sys, re, json, pyarrow.parquet as pq, glob
ddl = open(sys.argv[1]).read()
body = re.search(r"CREATE EXTERNAL TABLE IF NOT EXISTS `events` \((.*?)\n\)\n", ddl, re.S).group(1)
cols = [re.match(r"\s*`(\w+)` (\w+)", l).groups() for l in body.strip().split(",\n")]
parts = re.search(r"PARTITIONED BY \((.*?)\)\n", ddl).group(1)
pcols = re.findall(r"`(\w+)` (\w+)", parts)
specs = re.findall(r"PARTITION \((.*?)\) LOCATION", ddl)
files = glob.glob(sys.argv[2] + "/**/*.parquet", recursive=True)
schemas = {tuple((f.name, str(f.type)) for f in pq.read_schema(f)) for f in files}
print(json.dumps({"cols": cols, "pcols": pcols, "specs": specs, "file_schemas": [list(s) for s in schemas]}))
"#;
    let out =
        Command::new("python3").arg("-c").arg(check).arg(p.path("wh/events/_ferry/ddl.sql")).arg(p.path("wh/events")).output().unwrap();
    assert!(out.status.success(), "{ddl}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cols: Vec<(String, String)> = serde_json::from_value(v["cols"].clone()).unwrap();
    let files: Vec<Vec<(String, String)>> = serde_json::from_value(v["file_schemas"].clone()).unwrap();
    assert_eq!(files.len(), 1, "every file has one schema: {files:?}");
    let names: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
    let file_names: Vec<&str> = files[0].iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, file_names, "the DDL lists the files' columns, in order:\n{ddl}");
    assert!(cols.contains(&("hr".into(), "INT".into())), "a derived column is in the DDL:\n{ddl}");
    assert!(cols.contains(&("ts".into(), "TIMESTAMP".into())) && cols.contains(&("n".into(), "BIGINT".into())), "{ddl}");
    assert_eq!(v["pcols"], serde_json::json!([["dt", "DATE"], ["kind", "STRING"]]), "{ddl}");
    let specs: Vec<String> = serde_json::from_value(v["specs"].clone()).unwrap();
    assert!(specs.iter().any(|s| s.contains("`kind`='a/b'")), "values unescaped in the spec: {specs:?}");
    assert!(specs.iter().any(|s| s.contains("`kind`='it\\'s'")), "quotes escaped for SQL: {specs:?}");
    assert_eq!(specs.iter().filter(|s| s.contains("__HIVE_DEFAULT_PARTITION__")).count(), 1, "empty and null share it: {specs:?}");
    assert!(p.path("wh/events/dt=2026-11-30/kind=a%2Fb").is_dir());
    assert!(p.path("wh/events/dt=2026-11-30/kind=__HIVE_DEFAULT_PARTITION__").is_dir());
}

/// One odd entry in the source never stops the scan: links are not followed (a link to a file
/// outside the source is not published, a loop is not walked), a name that is not UTF-8 is
/// skipped with a warning, and the good file next to them flows.
#[test]
fn odd_entries_in_the_source_are_skipped_and_the_scan_goes_on() {
    use std::os::unix::ffi::OsStrExt;
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 1, 50, 14);
    p.generate("elsewhere", "jsonl", "null", 1, 50, 15);
    let outside = std::fs::read_dir(p.path("elsewhere")).unwrap().next().unwrap().unwrap().path();
    std::os::unix::fs::symlink(&outside, p.path("in/outside.jsonl")).unwrap();
    std::os::unix::fs::symlink(p.path("in"), p.path("in/loop")).unwrap();
    let odd = p.path("in").join(std::ffi::OsStr::from_bytes(b"bad-\xff.jsonl"));
    std::fs::copy(&outside, &odd).unwrap();
    let out = p.command("ferry-extract").env("RUST_LOG", "warn").arg("--once").output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "the odd entries are set aside: {log}");
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'chunked'"), 1, "the real file goes on: {log}");
    assert!(log.contains("symbolic link") && log.contains("not UTF-8"), "each is named in the log: {log}");
    assert!(log.lines().all(|l| !l.is_empty()), "{log}");
    // Each is recorded once in the ledger with its reason, also over later passes.
    let reasons =
        || p.sql("SELECT group_concat(error, ' | ') FROM (SELECT error FROM source_files WHERE state = 'quarantined' ORDER BY uri)");
    let first = reasons();
    assert!(first.contains("bad-\u{fffd}.jsonl: its name is not UTF-8") && first.contains("outside.jsonl: a symbolic link"), "{first}");
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'quarantined'"), 3, "{first}");
    let again = p.command("ferry-extract").arg("--once").output().unwrap();
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files"), 4, "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(reasons(), first);
}

/// Each odd file is a recorded decision with its reason, and the good files flow: a
/// compressed file under a text name, a JSON array where JSON lines were promised, a line
/// longer than max_record_size; a stray quote in a CSV field frames as transform reads it.
#[test]
fn odd_files_are_decided_one_by_one() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    let cfg =
        std::fs::read_to_string(&p.config).unwrap().replace("chunk_size = \"64KiB\"", "chunk_size = \"64KiB\"\nmax_record_size = \"4KiB\"");
    std::fs::write(&p.config, cfg).unwrap();
    let line = |i: u32| {
        format!(
            "{{\"event_id\":\"e{i}\",\"ts\":\"2026-11-30T10:00:00Z\",\"host\":\"h\",\"kind\":\"k\",\"user_id\":{i},\"payload\":\"p\",\"score\":1.5}}\n"
        )
    };
    let good: String = (0..10).map(line).collect();
    std::fs::write(p.path("in/good.jsonl"), &good).unwrap();
    let gz = Command::new("gzip").arg("-c").arg(p.path("in/good.jsonl")).output().unwrap().stdout;
    std::fs::write(p.path("in/zipped.jsonl"), gz).unwrap();
    std::fs::write(p.path("in/array.jsonl"), format!("[{}]\n", line(99).trim_end())).unwrap();
    std::fs::write(p.path("in/long.jsonl"), format!("{}{}", line(50), "x".repeat(10_000))).unwrap();
    std::fs::write(p.path("in/empty.jsonl"), "").unwrap();
    std::fs::write(
        p.path("in/quote.csv"),
        "event_id,ts,host,kind,user_id,payload,score\nq1,2026-11-30T10:00:00Z,h,k,1,say \"hi\" twice,\nq2,2026-11-30T10:00:00Z,h,k,2,\"multi\nline\",\n",
    )
    .unwrap();
    for s in ferry_tests::STAGES {
        let out = p.stage(s);
        assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let reason = |f: &str| p.sql(&format!("SELECT COALESCE(error, state) FROM source_files WHERE uri LIKE '%/{f}'"));
    assert!(reason("zipped.jsonl").contains("gzip-compressed"), "{}", reason("zipped.jsonl"));
    assert!(reason("array.jsonl").contains("JSON array"), "{}", reason("array.jsonl"));
    assert!(reason("long.jsonl").contains("max_record_size"), "{}", reason("long.jsonl"));
    assert_eq!(reason("empty.jsonl"), "chunked", "an empty file is done, with nothing to load");
    assert_eq!(p.count("SELECT SUM(records) FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.uri LIKE '%quote.csv'"), 2);
    assert_eq!(p.table_digest()["rows"], 12, "the good file and both CSV records");
}

/// The same bytes delivered twice under two names are loaded once; the second is set aside
/// with the name of the first, not marked done with nothing said.
#[test]
fn identical_bytes_under_another_name_are_loaded_once_and_said() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 1, 100, 16);
    run(&p);
    let first = std::fs::read_dir(p.path("in")).unwrap().next().unwrap().unwrap().path();
    std::fs::copy(&first, p.path("in/redelivered.jsonl")).unwrap();
    let out = p.stage("ferry-extract");
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let reason = p.sql("SELECT error FROM source_files WHERE uri LIKE '%redelivered.jsonl'");
    assert!(reason.contains("the same bytes as") && reason.contains(first.file_name().unwrap().to_str().unwrap()), "{reason}");
    for s in ["ferry-transform", "ferry-copy", "ferry-load"] {
        p.stage(s);
    }
    let expect = p.path("expect");
    std::fs::create_dir_all(&expect).unwrap();
    std::fs::copy(&first, expect.join("first.jsonl")).unwrap();
    ferry_tests::assert_same_rows(&p.table_digest(), &ferry_tests::input_digest("jsonl", &expect), "loaded once, not twice");
}

/// Two devices send the same file under two names at once: in one pass, whatever the timing,
/// the first name is taken in and the second is set aside naming it, the same decision as when
/// the two come in two passes. Run a few times, with a few files split at once.
#[test]
fn identical_bytes_in_one_pass_get_the_same_recorded_decision_every_time() {
    for round in 0..4 {
        let p = Pipeline::new("8KiB", "30s", "0s");
        let cfg = std::fs::read_to_string(&p.config).unwrap();
        std::fs::write(&p.config, cfg.replacen("[extract]\n", "[extract]\nconcurrency = 4\n", 1)).unwrap();
        p.generate("gen", "jsonl", "null", 3, 200, 30 + round);
        let mut made: Vec<_> = std::fs::read_dir(p.path("gen")).unwrap().map(|e| e.unwrap().path()).collect();
        made.sort();
        // Two names for the first file's bytes (the later one by name is the second copy).
        std::fs::copy(&made[0], p.path("in/device-a.jsonl")).unwrap();
        std::fs::copy(&made[0], p.path("in/device-b.jsonl")).unwrap();
        for g in &made[1..] {
            std::fs::copy(g, p.path(&format!("in/{}", g.file_name().unwrap().to_string_lossy()))).unwrap();
        }
        let out = p.stage("ferry-extract");
        assert_eq!(out.status.code(), Some(3), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
        let state = |name: &str| p.sql(&format!("SELECT state || ' ' || COALESCE(error, '') FROM source_files WHERE uri LIKE '%/{name}'"));
        assert_eq!(state("device-a.jsonl").trim(), "chunked", "round {round}");
        let b = state("device-b.jsonl");
        assert!(b.starts_with("quarantined") && b.contains("the same bytes as") && b.contains("device-a.jsonl"), "round {round}: {b}");
        for s in ["ferry-transform", "ferry-copy", "ferry-load"] {
            p.stage(s);
        }
        let want = ferry_tests::input_digest("jsonl", &p.path("gen"));
        ferry_tests::assert_same_rows(&p.table_digest(), &want, &format!("round {round}: every file once, the copy not at all"));
    }
}

use ferry_tests::write_avro as avro;

/// Without `table.columns` the table's schema comes from the Avro files, and the ledger keeps
/// it: a compatible change (a wider type, a new nullable column) is a new version with its
/// `ALTER TABLE`, a narrower file is widened into the table's shape, and an incompatible one
/// is quarantined with a message that names the column and both types. Every file stays
/// readable (DuckDB: `union_by_name`, as its default takes the first file's columns).
#[test]
fn the_table_schema_evolves_compatibly_and_refuses_the_rest() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.set_columns("", "derive = { dt = \"date(ts)\" }");
    let ts = "{'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}}";
    let id = "{'name': 'id', 'type': 'string'}";
    avro(&p, "a.avro", &format!("[{id}, {ts}, {{'name': 'n', 'type': 'int'}}]"), "[{'id': 'a1', 'ts': 1796040000000000, 'n': 1}]");
    run(&p);
    let versions = || p.sql("SELECT group_concat(version || ': ' || change, ' | ') FROM (SELECT * FROM table_schemas ORDER BY version)");
    assert_eq!(versions(), "1: created");
    // Wider n and a new nullable column: version 2.
    avro(
        &p,
        "b.avro",
        &format!("[{id}, {ts}, {{'name': 'n', 'type': 'long'}}, {{'name': 'extra', 'type': ['null', 'string']}}]"),
        "[{'id': 'b1', 'ts': 1796040000000000, 'n': 3000000000, 'extra': 'x'}]",
    );
    run(&p);
    assert_eq!(versions(), "1: created | 2: column `n` INT -> BIGINT; added column `extra` STRING");
    // Narrower again (n int, no extra): written in version 2's shape, no new version.
    avro(&p, "c.avro", &format!("[{id}, {ts}, {{'name': 'n', 'type': 'int'}}]"), "[{'id': 'c1', 'ts': 1796040000000000, 'n': 5}]");
    // Incompatible: n as a string.
    avro(&p, "d.avro", &format!("[{id}, {ts}, {{'name': 'n', 'type': 'string'}}]"), "[{'id': 'd1', 'ts': 1796040000000000, 'n': 'x'}]");
    for s in ferry_tests::STAGES {
        let out = p.stage(s);
        assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(versions(), "1: created | 2: column `n` INT -> BIGINT; added column `extra` STRING");
    let why = p.sql(
        "SELECT t.last_error FROM tasks t JOIN chunks c ON c.id = t.chunk_id JOIN source_files f ON f.id = c.file_id \
         WHERE f.uri LIKE '%d.avro' AND t.state = 'quarantined'",
    );
    assert!(why.contains("\"n\"") && why.contains("BIGINT") && why.contains("STRING") && why.contains("version 2"), "{why}");
    // The files: c.avro's in version 2's shape; DuckDB's default reader and pyarrow read all.
    let check = r#"
import sys, glob, json, duckdb, pyarrow.parquet as pq
root = sys.argv[1]
files = sorted(glob.glob(root + "/**/*.parquet", recursive=True))
schemas = [[(f.name, str(f.type)) for f in pq.read_schema(f)] for f in files]
rows = duckdb.sql(f"SELECT id, n, extra FROM read_parquet('{root}/**/*.parquet', hive_partitioning = true, union_by_name = true) ORDER BY id").fetchall()
print(json.dumps({"schemas": schemas, "rows": rows}))
"#;
    let out = Command::new("python3").arg("-c").arg(check).arg(p.path("wh/events")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let v2 = serde_json::json!([["id", "string"], ["ts", "timestamp[us, tz=+00:00]"], ["n", "int64"], ["extra", "string"]]);
    let schemas = v["schemas"].as_array().unwrap();
    assert_eq!(schemas.len(), 3, "{v}");
    assert_eq!(schemas.iter().filter(|s| **s == v2).count(), 2, "b and c in version 2: {v}");
    assert_eq!(v["rows"], serde_json::json!([["a1", 1, null], ["b1", 3000000000i64, "x"], ["c1", 5, null]]));
    // The DDL creates version 2; schema-v2.sql takes a version-1 table there.
    let ddl = std::fs::read_to_string(p.path("wh/events/_ferry/ddl.sql")).unwrap();
    assert!(ddl.contains("`n` BIGINT") && ddl.contains("`extra` STRING") && ddl.contains("schema-v2.sql"), "{ddl}");
    let change = std::fs::read_to_string(p.path("wh/events/_ferry/schema-v2.sql")).unwrap();
    assert!(change.contains("ALTER TABLE `events` ADD COLUMNS (`extra` STRING);"), "{change}");
    assert!(change.contains("ALTER TABLE `events` CHANGE COLUMN `n` `n` BIGINT;"), "{change}");
}

/// Fields that match no column, and declared columns the input lacks, are noted per chunk in
/// the ledger (`chunk_notes`), not only in the log.
#[test]
fn column_mismatches_are_noted_in_the_ledger() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.set_columns(
        r#"  { name = "id", type = "string", nullable = false },
  { name = "ts", type = "timestamp", nullable = false },
  { name = "later", type = "string" },"#,
        "derive = { dt = \"date(ts)\" }",
    );
    std::fs::write(p.path("in/a.jsonl"), "{\"id\":\"1\",\"ts\":\"2026-11-30T12:00:00Z\",\"surprise\":1}\n").unwrap();
    std::fs::write(p.path("in/b.csv"), "id,ts,bonus\n2,2026-11-30T12:00:00Z,x\n").unwrap();
    avro(
        &p,
        "c.avro",
        "[{'name': 'id', 'type': 'string'}, {'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-micros'}}, {'name': 'other', 'type': 'long'}]",
        "[{'id': '3', 'ts': 1796040000000000, 'other': 1}]",
    );
    run(&p);
    assert_eq!(table(&p).len(), 3);
    let notes = p.sql("SELECT group_concat(note, ' | ') FROM chunk_notes");
    for want in ["surprise", "bonus", "\"other\"", "not in the CSV header are null: [\"later\"]", "no field for column \"later\""] {
        assert!(notes.contains(want), "{want}: {notes}");
    }
}

/// Avro's other types (the table in docs/configuration.md): uuid as a string, fixed and bytes as binary,
/// enums as strings, decimals as decimals, arrays, maps and records as Parquet's nested
/// types, and the DDL with their Hive names.
#[test]
fn avro_types_map_to_parquet_types() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.set_columns("", "derive = { dt = \"date(ts)\" }");
    avro(
        &p,
        "all.avro",
        "[{'name': 'ts', 'type': {'type': 'long', 'logicalType': 'timestamp-millis'}},
          {'name': 'u', 'type': {'type': 'string', 'logicalType': 'uuid'}},
          {'name': 'fx', 'type': {'type': 'fixed', 'name': 'F4', 'size': 4}},
          {'name': 'b', 'type': 'bytes'},
          {'name': 'e', 'type': {'type': 'enum', 'name': 'Color', 'symbols': ['RED', 'GREEN']}},
          {'name': 'd', 'type': {'type': 'bytes', 'logicalType': 'decimal', 'precision': 10, 'scale': 2}},
          {'name': 'arr', 'type': {'type': 'array', 'items': 'long'}},
          {'name': 'm', 'type': {'type': 'map', 'values': 'string'}},
          {'name': 'r', 'type': {'type': 'record', 'name': 'Inner', 'fields': [{'name': 'x', 'type': ['null', 'int']}]}},
          {'name': 'day', 'type': {'type': 'int', 'logicalType': 'date'}}]",
        "[{'ts': 1796040000123, 'u': '6f1c6e8e-2b5e-4a52-9c55-3f5d1a3b7c10', 'fx': b'abcd', 'b': b'\\x00\\xff',
           'e': 'GREEN', 'd': __import__('decimal').Decimal('12.34'), 'arr': [1, 2], 'm': {'k': 'v'},
           'r': {'x': 7}, 'day': 20000}]",
    );
    run(&p);
    let script = r#"
import sys, json, pyarrow.parquet as pq, glob
f = glob.glob(sys.argv[1] + "/**/*.parquet", recursive=True)[0]
t = pq.read_table(f)
row = {k: (v.hex() if isinstance(v, bytes) else str(v)) for k, v in t.to_pylist()[0].items()}
print(json.dumps({"types": {x.name: str(x.type) for x in t.schema}, "row": row}))
"#;
    let out = Command::new("python3").arg("-c").arg(script).arg(p.path("wh/events")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let types = &v["types"];
    assert_eq!(types["ts"], "timestamp[ms, tz=+00:00]");
    assert_eq!(types["u"], "string");
    assert_eq!(v["row"]["u"], "6f1c6e8e-2b5e-4a52-9c55-3f5d1a3b7c10");
    assert_eq!(types["fx"], "fixed_size_binary[4]");
    assert_eq!(v["row"]["fx"], "61626364");
    assert_eq!(types["b"], "binary");
    assert_eq!(types["e"], "string");
    assert_eq!(v["row"]["e"], "GREEN");
    assert_eq!(types["d"], "decimal128(10, 2)");
    assert_eq!(v["row"]["d"], "12.34");
    assert_eq!(types["arr"], "list<item: int64 not null>");
    assert_eq!(types["m"], "map<string, string ('m')>");
    assert_eq!(types["r"], "struct<x: int32>");
    assert_eq!(types["day"], "date32[day]");
    let ddl = std::fs::read_to_string(p.path("wh/events/_ferry/ddl.sql")).unwrap();
    for col in [
        "`u` STRING",
        "`fx` BINARY",
        "`e` STRING",
        "`d` DECIMAL(10,2)",
        "`arr` ARRAY<BIGINT>",
        "`m` MAP<STRING,STRING>",
        "`r` STRUCT<`x`:INT>",
        "`ts` TIMESTAMP",
    ] {
        assert!(ddl.contains(col), "{col}:\n{ddl}");
    }
}

/// A new file is hashed while it is split (one read). Its chunks still get the ids of its whole
/// bytes' hash, a second extract of the same files from scratch (a crash before the ledger
/// heard of them) stages them under the same names instead of leaving copies, and nothing
/// stays staged for a file that is not taken in: one corrupt after its first chunks, one
/// delivered again later.
#[test]
fn a_new_file_is_read_once_and_its_staged_chunks_are_all_accounted_for() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.generate("in", "avro", "null", 2, 600, 21);
    let mut files: Vec<_> = std::fs::read_dir(p.path("in")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    // Cut inside a late block: the first chunks split before the file shows it is corrupt.
    let bytes = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &bytes[..bytes.len() - 100]).unwrap();
    let first = std::fs::read(&files[0]).unwrap();
    let staged = || {
        let mut v: Vec<String> = std::fs::read_dir(p.path("staging/events"))
            .map(|d| d.map(|e| e.unwrap().file_name().into_string().unwrap()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let extract = || {
        let out = p.stage("ferry-extract");
        // 3: something was quarantined.
        assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    };
    extract();
    // Delivered again under another name.
    std::fs::write(p.path("in/again.avro"), &first).unwrap();
    extract();
    let quarantined = p.sql("SELECT group_concat(error, ' | ') FROM source_files WHERE state = 'quarantined'");
    assert!(quarantined.contains("truncated Avro block"), "{quarantined}");
    assert!(quarantined.contains("again.avro: the same bytes as"), "{quarantined}");
    let hash = blake3::hash(&first).to_hex().to_string();
    let chunked = p.sql("SELECT group_concat(content_hash) FROM source_files WHERE state = 'chunked'");
    assert_eq!(chunked, hash, "the registered hash is the whole file's");
    let n = p.count("SELECT COUNT(*) FROM chunks");
    assert!(n >= 3, "several chunks: {n}");
    for seq in 0..n {
        let id = p.sql(&format!("SELECT id FROM chunks WHERE seq = {seq}"));
        assert_eq!(id, ferry_ledger::chunk_id("default", &hash, seq), "chunk {seq}");
    }
    // Staging holds exactly the recorded chunks: none from the corrupt file or the duplicate.
    let mut located: Vec<String> =
        p.sql("SELECT group_concat(location, ' ') FROM chunks").split(' ').map(|l| l.rsplit('/').next().unwrap().to_string()).collect();
    located.sort();
    let before = staged();
    assert_eq!(before, located);
    // From scratch (the ledger lost): the same files stage under the same names.
    std::fs::remove_file(p.path("ledger.db")).unwrap();
    std::fs::remove_file(p.path("in/again.avro")).unwrap();
    extract();
    assert_eq!(staged(), before, "a second split names its chunks as the first did");
    assert_eq!(p.sql(&format!("SELECT id FROM chunks WHERE seq = {}", n - 1)), ferry_ledger::chunk_id("default", &hash, n - 1));
    for s in ["ferry-transform", "ferry-copy", "ferry-load"] {
        let out = p.stage(s);
        assert_eq!(out.status.code(), Some(0), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(p.table_digest()["rows"], 600);
}

/// A bug met by one file (a panic while splitting it; debug builds stand one in when the file's
/// name holds FERRY_TEST_PANIC_SPLITTING) quarantines that file with the panic's text, under its
/// real hash: the files beside it are published, and later passes leave it alone.
#[test]
fn a_panic_while_splitting_one_file_quarantines_it_and_the_others_flow_on() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.add_jsonl_batch("good", 3, 400, 21);
    p.add_jsonl_batch("boom", 1, 400, 22);
    p.stage_env("ferry-extract", "FERRY_TEST_PANIC_SPLITTING", "boom-");
    let out = p.stage("ferry-extract");
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "one file quarantined, the pass went on: {log}");
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'chunked'"), 3, "{log}");
    let reason = p.sql("SELECT error FROM source_files WHERE state = 'quarantined'");
    assert!(reason.contains("boom-") && reason.contains("Ferry failed while splitting this file"), "{reason}");
    let hash = p.sql("SELECT content_hash FROM source_files WHERE state = 'quarantined'");
    assert!(hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()), "recorded under the file's own hash: {hash}");
    // Later passes skip it: no second row, no second reason.
    let again = p.stage("ferry-extract");
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files"), 4, "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'quarantined'"), 1);
    p.stages_ok(&["ferry-transform", "ferry-copy", "ferry-load"]);
    assert_eq!(p.table_digest()["rows"], 1200, "the other files are published whole");
}
