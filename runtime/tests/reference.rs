//! docs/configuration-reference.md is written from the configuration's types: every key with
//! its type, default and meaning (the doc comment of its field), by section. This test renders
//! it from the JSON Schema that `schemars` derives from `ferry_runtime::config::Config` and
//! fails when the file differs (run it with `FERRY_BLESS=1` to write the file) or when a key has
//! no meaning to print.

use std::collections::BTreeMap;

use serde_json::Value;

/// Defaults that depend on the machine the reference is rendered on.
const MACHINE_DEFAULTS: [(&str, &str); 2] = [("spool.node", "the host's name"), ("transform.concurrency", "the cores + 1")];

/// A struct's table: every path it is found at, and its rows (key, type, default, meaning).
type Section = (Vec<String>, Vec<[String; 4]>);

struct Doc<'a> {
    defs: &'a serde_json::Map<String, Value>,
    /// Each struct's table, by definition name.
    sections: BTreeMap<String, Section>,
    missing: Vec<String>,
}

impl Doc<'_> {
    fn resolve<'v>(&'v self, s: &'v Value) -> &'v Value {
        match s.get("$ref").and_then(Value::as_str) {
            Some(r) => &self.defs[r.trim_start_matches("#/$defs/")],
            None => s,
        }
    }

    /// The one non-null member of an `Option`'s schema, and whether it was optional.
    fn unwrap_option<'v>(&'v self, s: &'v Value) -> (&'v Value, bool) {
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = s.get(key).and_then(Value::as_array) {
                let real: Vec<&Value> = alts.iter().filter(|a| a.get("type") != Some(&Value::from("null"))).collect();
                if real.len() == 1 && alts.len() == 2 {
                    return (real[0], true);
                }
            }
        }
        if let Some(t) = s.get("type").and_then(Value::as_array)
            && t.contains(&Value::from("null"))
        {
            return (s, true);
        }
        (s, false)
    }

    fn type_of(&self, s: &Value) -> String {
        let (inner, optional) = self.unwrap_option(s);
        let r = self.resolve(inner);
        let mut t = if let Some(values) = r.get("enum").and_then(Value::as_array) {
            values.iter().map(|v| format!("`{}`", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(", ")
        } else if let Some(alts) = r.get("oneOf").and_then(Value::as_array) {
            // Variants with a doc comment come as `const`, the others together as one `enum`.
            let values =
                alts.iter().flat_map(|a| a.get("const").into_iter().chain(a.get("enum").and_then(Value::as_array).into_iter().flatten()));
            values.filter_map(Value::as_str).map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", ")
        } else {
            match (r.get("format").and_then(Value::as_str), r.get("type")) {
                (Some("duration"), _) => "duration (`30s`, `5m`, `1h 30m`)".into(),
                (Some("byte-size"), _) => "size (`64MiB`, `512KiB`, `1GB`, or bytes)".into(),
                (_, Some(Value::String(t))) if t == "array" => format!("list of {}", self.type_of(&r["items"])),
                (_, Some(Value::String(t))) if t == "object" && r.get("properties").is_some() => "table (below)".into(),
                (_, Some(Value::String(t))) if t == "object" && r.get("additionalProperties").is_some_and(Value::is_object) => {
                    format!("table of {}", self.type_of(&r["additionalProperties"]))
                }
                (_, Some(Value::String(t))) => t.clone(),
                (_, Some(Value::Array(ts))) => {
                    ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect::<Vec<_>>().join(" or ")
                }
                _ => "value".into(),
            }
        };
        if optional {
            t.push_str(", optional");
        }
        t
    }

    fn default_of(&self, path: &str, s: &Value, required: bool) -> String {
        if let Some((_, d)) = MACHINE_DEFAULTS.iter().find(|(p, _)| *p == path) {
            return d.to_string();
        }
        let (inner, _) = self.unwrap_option(s);
        let byte_size = self.resolve(inner).get("format").and_then(Value::as_str) == Some("byte-size");
        match s.get("default") {
            None if required => "(required)".into(),
            None => "unset".into(),
            Some(Value::Null) => "unset".into(),
            Some(Value::Number(n)) if byte_size => human_size(n.as_u64().unwrap_or(0)),
            Some(Value::String(t)) => format!("`\"{t}\"`"),
            Some(Value::Array(a)) if a.is_empty() => "`[]`".into(),
            Some(Value::Object(o)) if o.is_empty() => "`{}`".into(),
            Some(v) => format!("`{v}`"),
        }
    }

    /// The struct at `path` (a section or a nested table), and every struct under it.
    fn walk(&mut self, path: &str, name: &str, s: &Value) {
        let entry = self.sections.entry(name.to_string()).or_default();
        entry.0.push(path.to_string());
        if entry.0.len() > 1 {
            return;
        }
        let props = s.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
        let required: Vec<&str> = s.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let mut rows = Vec::new();
        for (key, p) in &props {
            let full = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            let (inner, _) = self.unwrap_option(p);
            if let Some(r) = inner.get("$ref").and_then(Value::as_str) {
                let def_name = r.trim_start_matches("#/$defs/").to_string();
                let def = self.defs[&def_name].clone();
                if def.get("properties").is_some() {
                    self.walk(&full, &def_name, &def);
                    continue;
                }
            }
            // A list of tables (`table.columns`): its row here, its entries' keys below.
            let items = inner.get("items").and_then(|i| i.get("$ref")).and_then(Value::as_str).map(str::to_string);
            if let Some(items) = items {
                let def_name = items.trim_start_matches("#/$defs/").to_string();
                let def = self.defs[&def_name].clone();
                if def.get("properties").is_some() {
                    self.walk(&format!("{full}[]"), &def_name, &def);
                }
            }
            let (inner, _) = self.unwrap_option(p);
            let meaning = p
                .get("description")
                .or_else(|| self.resolve(inner).get("description"))
                .and_then(Value::as_str)
                .map(|d| d.replace('\n', " "))
                .unwrap_or_default();
            if meaning.trim().is_empty() {
                self.missing.push(full.clone());
            }
            rows.push([
                format!("`{key}`"),
                self.type_of(p),
                self.default_of(&full, p, required.contains(&key.as_str())),
                meaning.replace('|', "\\|"),
            ]);
        }
        self.sections.get_mut(name).unwrap().1 = rows;
    }
}

fn human_size(n: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("`\"{}{unit}\"`", n / size);
        }
    }
    format!("`{n}`")
}

fn render() -> (String, Vec<String>) {
    let schema = serde_json::to_value(schemars::schema_for!(ferry_runtime::config::Config)).unwrap();
    let defs = schema["$defs"].as_object().unwrap();
    let mut doc = Doc { defs, sections: BTreeMap::new(), missing: Vec::new() };
    doc.walk("", "Config", &schema);
    // Sections in the order of the file: the top level, then by their first path.
    let mut order: Vec<(&String, &Section)> = doc.sections.iter().collect();
    order.sort_by_key(|(_, (paths, _))| paths[0].clone());
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every key of the configuration file, by section: its type, its default and what it does.\n\
         Written from the configuration's types by `runtime/tests/reference.rs` (`FERRY_BLESS=1\n\
         cargo test -p ferry-runtime --test reference` writes it again; the test fails when it is\n\
         out of date or a key has no meaning). `docs/configuration.md` explains the sections;\n\
         `deploy/ferry.example.toml` shows a whole file. Any key can be set from the environment as\n\
         `FERRY_<SECTION>_<KEY>` (`FERRY_COPY_CONCURRENCY=8`, `FERRY_DESTINATION_STORE_S3_REGION`).\n",
    );
    for (_, (paths, rows)) in order {
        if rows.is_empty() {
            continue;
        }
        let title = if paths[0].is_empty() {
            "top level".to_string()
        } else {
            let name = |p: &String| match p.strip_suffix("[]") {
                Some(list) => format!("each entry of `{list}`"),
                None => format!("`[{p}]`"),
            };
            paths.iter().map(name).collect::<Vec<_>>().join(", ")
        };
        out.push_str(&format!("\n## {title}\n\n| key | type | default | meaning |\n|---|---|---|---|\n"));
        for r in rows {
            out.push_str(&format!("| {} | {} | {} | {} |\n", r[0], r[1], r[2], r[3]));
        }
    }
    (out, doc.missing)
}

#[test]
fn the_configuration_reference_is_written_from_the_types_and_every_key_has_a_meaning() {
    let (text, missing) = render();
    assert!(missing.is_empty(), "keys without a doc comment (their meaning in the reference): {missing:?}");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration-reference.md");
    if std::env::var_os("FERRY_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == text,
        "docs/configuration-reference.md is out of date: run FERRY_BLESS=1 cargo test -p ferry-runtime --test reference"
    );
    // Every key a configuration can hold is in it: the resolved example (every section, every
    // default) printed back as TOML names only keys the reference has.
    let cfg = ferry_runtime::config::Config::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/ferry.example.toml"))
        .unwrap();
    let toml: toml::Table = cfg.to_toml().parse().unwrap();
    // A table is a section (its keys are looked up) unless the reference has it as one key
    // whose value is a table of the user's (`transform.derive`, `store.hdfs.config`).
    fn check(prefix: &str, t: &toml::Table, text: &str) -> usize {
        let mut n = 0;
        for (k, v) in t {
            let row = text.contains(&format!("| `{k}` |"));
            match v {
                toml::Value::Table(inner) if !row => n += check(&format!("{prefix}{k}."), inner, text),
                _ => {
                    assert!(row, "{prefix}{k} is not in the reference");
                    n += 1;
                }
            }
        }
        n
    }
    assert!(check("", &toml, &text) > 60, "the example's keys were looked up");
}
