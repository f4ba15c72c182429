//! What a table asks of its writers, and whether Ferry gives it.
//!
//! A Delta table is shared: another engine may have created it, turned features on, or set
//! properties that every writer must honour. A writer that appends without honouring them
//! breaks the table for everyone (files read under the wrong column names, a constraint not
//! enforced, a change feed with holes). So before any commit Ferry reads the protocol and the
//! metaData and refuses, naming the feature and the table, what it does not implement:
//!
//! | asks for                                       | Ferry                                        |
//! |------------------------------------------------|----------------------------------------------|
//! | reader 1 / writer 2 (appendOnly, invariants)   | writes; `delta.appendOnly` honoured (no      |
//! |                                                | `remove` that changes data), a column        |
//! |                                                | invariant refused                            |
//! | writer 3-6 (legacy): CHECK constraints,        | writes while the table uses none of them;    |
//! | change data feed, generated columns, column    | refused, by name, once it does               |
//! | mapping, identity columns                      |                                              |
//! | reader 3 / writer 7 (table features)           | writes when every feature listed is one of   |
//! |                                                | the above (and unused) or `timestampNtz`     |
//!
//! The check is on what the table uses, not only on its protocol version: a table Spark made at
//! writer 4 with no change feed and no generated column is an append-only log Ferry can write.

use serde_json::Value;

use crate::{FEATURES_READER, FEATURES_WRITER, Feature, Snapshot};

/// Whether Ferry may write to a table listing writer feature `f`: those it writes correctly
/// whatever they hold (`appendOnly`, honoured per commit, see [`Snapshot::append_only`];
/// `invariants`, checked below: a table with none; `timestampNtz`, a type Ferry writes), and
/// those it does not implement but accepts while the table does not use them (checked below,
/// each by its own sign of use). Readers need only `timestampNtz` and `columnMapping` of these.
fn writable(f: &Feature, readers: bool) -> bool {
    use Feature::*;
    match f {
        TimestampNtz | ColumnMapping => true,
        AppendOnly | Invariants | CheckConstraints | ChangeDataFeed | GeneratedColumns | IdentityColumns => !readers,
        Other(_) => false,
    }
}

impl Snapshot {
    /// Why Ferry must not write to this table (naming the feature), or None. `table` names the
    /// table in the message.
    pub fn unwritable(&self, table: &str) -> Option<String> {
        let refuse = |what: String| Some(format!("Delta table {table} uses {what}, which Ferry does not write; {ADVICE}"));
        let (reader, writer) = self.protocol_versions();
        if reader > FEATURES_READER || writer > FEATURES_WRITER || (reader == FEATURES_READER && writer != FEATURES_WRITER) {
            return refuse(format!("Delta protocol reader {reader} / writer {writer}"));
        }
        for (readers, at) in [(false, writer == FEATURES_WRITER), (true, reader == FEATURES_READER)] {
            let listed = self.protocol.as_ref().map_or(&[][..], |p| p.listed(readers));
            let unknown: Vec<&str> = listed.iter().filter(|f| !writable(f, readers)).map(Feature::name).collect();
            if at && !unknown.is_empty() {
                return refuse(format!("the table feature(s) {}", unknown.join(", ")));
            }
        }
        let config = |k: &str| self.property(k).map(str::trim);
        if let Some(mode) = config("delta.columnMapping.mode").filter(|m| !m.eq_ignore_ascii_case("none")) {
            return refuse(format!("column mapping (delta.columnMapping.mode = {mode:?})"));
        }
        if config("delta.enableChangeDataFeed").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return refuse("the change data feed (delta.enableChangeDataFeed = true)".into());
        }
        if let Some(c) = self.properties().find(|(k, _)| k.starts_with("delta.constraints.")) {
            return refuse(format!("a CHECK constraint ({} = {:?})", c.0, c.1));
        }
        for (key, what) in [
            ("delta.invariants", "a column invariant"),
            ("delta.generationExpression", "a generated column"),
            ("delta.identity.start", "an identity column"),
            ("delta.identity.step", "an identity column"),
        ] {
            if let Some(column) = self.field_with_metadata(key) {
                return refuse(format!("{what} ({key} on column {column})"));
            }
        }
        None
    }

    /// The protocol's (minReaderVersion, minWriterVersion); (1, 1) before any protocol.
    pub fn protocol_versions(&self) -> (i32, i32) {
        self.protocol.as_ref().map_or((1, 1), |p| (p.min_reader_version, p.min_writer_version))
    }

    /// The table's partition columns (`metaData.partitionColumns`).
    pub fn partition_columns(&self) -> Vec<String> {
        self.metadata.as_ref().map_or(vec![], |m| m.partition_columns.clone())
    }

    /// `delta.appendOnly = true`: no commit may remove a file with `dataChange = true` (a
    /// compaction, which removes with `dataChange = false`, may).
    pub fn append_only(&self) -> bool {
        self.property("delta.appendOnly").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }

    /// The table's properties (`metaData.configuration`).
    pub fn properties(&self) -> impl Iterator<Item = (&str, &str)> {
        self.metadata.iter().flat_map(|m| m.configuration.iter()).map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The dotted path of the first column (nested ones too) whose metadata holds `key`.
    fn field_with_metadata(&self, key: &str) -> Option<String> {
        fn walk(ty: &Value, prefix: &str, key: &str) -> Option<String> {
            match ty.get("type").and_then(Value::as_str) {
                Some("struct") => ty.get("fields")?.as_array()?.iter().find_map(|f| {
                    let name = f.get("name")?.as_str()?;
                    let path = if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
                    if f.get("metadata").and_then(|m| m.get(key)).is_some() {
                        return Some(path);
                    }
                    walk(f.get("type")?, &path, key)
                }),
                Some("array") => walk(ty.get("elementType")?, &format!("{prefix}[]"), key),
                Some("map") => walk(ty.get("keyType")?, &format!("{prefix}.key"), key)
                    .or_else(|| walk(ty.get("valueType")?, &format!("{prefix}.value"), key)),
                _ => None,
            }
        }
        walk(&self.metadata.as_ref()?.schema().ok()?, "", key)
    }
}

/// What the refusal tells an operator to do.
const ADVICE: &str = "load into a table without it (destination.table name or path), turn it off on this table, or use \
                      destination.table_format = \"hive\"";

/// Checks that commit `actions` keep a rule of the table: an append-only table takes no
/// `remove` that changes data.
pub(crate) fn check_commit(s: &Snapshot, table: &str, actions: &[Value]) -> Result<(), String> {
    if !s.append_only() {
        return Ok(());
    }
    let removes =
        actions.iter().filter_map(|a| a.get("remove")).filter(|r| r.get("dataChange").and_then(Value::as_bool).unwrap_or(true)).count();
    if removes > 0 {
        return Err(format!(
            "Delta table {table} is append-only (delta.appendOnly = true): this commit would take {removes} file(s) of rows back \
             out (a corrected source file, a rerun, or a skipped chunk), which an append-only table refuses; nothing was \
             written. Set delta.appendOnly = false on the table to let Ferry replace them, or leave the earlier rows in place"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn table(protocol: Value, configuration: Value, field_metadata: Value) -> Snapshot {
        let schema = json!({"type": "struct", "fields": [
            {"name": "n", "type": "long", "nullable": true, "metadata": {}},
            {"name": "s", "type": {"type": "struct", "fields": [{"name": "g", "type": "long", "nullable": true, "metadata": field_metadata}]},
             "nullable": true, "metadata": {}},
        ]});
        let mut s = Snapshot { version: -1, ..Default::default() };
        let text = format!(
            "{}\n{}\n",
            json!({ "protocol": protocol }),
            json!({"metaData": {"id": "x", "format": {"provider": "parquet", "options": {}}, "schemaString": schema.to_string(),
                "partitionColumns": [], "configuration": configuration}})
        );
        s.apply(0, &text).unwrap();
        s
    }

    fn legacy(w: i64) -> Value {
        json!({"minReaderVersion": 1, "minWriterVersion": w})
    }

    #[test]
    fn what_the_table_uses_decides_not_its_version_alone() {
        let ok = |s: Snapshot| assert_eq!(s.unwritable("t"), None);
        let refused = |s: Snapshot, what: &str| {
            let e = s.unwritable("t").expect("refused");
            assert!(e.contains(what) && e.contains("Delta table t"), "{e}");
        };
        ok(table(legacy(2), json!({"delta.appendOnly": "true"}), json!({})));
        // Writer 4, as Spark leaves a table, with neither feed nor generated column: an append log.
        ok(table(legacy(4), json!({"delta.enableChangeDataFeed": "false"}), json!({})));
        refused(table(legacy(4), json!({"delta.enableChangeDataFeed": "true"}), json!({})), "change data feed");
        refused(table(legacy(3), json!({"delta.constraints.positive": "n > 0"}), json!({})), "CHECK constraint");
        refused(
            table(legacy(4), json!({}), json!({"delta.generationExpression": "n + 1"})),
            "generated column (delta.generationExpression on column s.g)",
        );
        refused(table(legacy(6), json!({}), json!({"delta.identity.start": 1, "delta.identity.step": 1})), "identity column");
        refused(table(legacy(2), json!({}), json!({"delta.invariants": "{}"})), "column invariant");
        refused(
            table(json!({"minReaderVersion": 2, "minWriterVersion": 5}), json!({"delta.columnMapping.mode": "name"}), json!({})),
            "column mapping",
        );
        let features =
            |w: &[&str], r: &[&str]| json!({"minReaderVersion": 3, "minWriterVersion": 7, "writerFeatures": w, "readerFeatures": r});
        ok(table(features(&["timestampNtz", "appendOnly", "changeDataFeed"], &["timestampNtz"]), json!({}), json!({})));
        refused(table(features(&["deletionVectors"], &["deletionVectors"]), json!({}), json!({})), "deletionVectors");
        refused(table(features(&["rowTracking", "domainMetadata"], &[]), json!({}), json!({})), "rowTracking, domainMetadata");
        refused(table(legacy(8), json!({}), json!({})), "writer 8");
    }

    #[test]
    fn an_append_only_table_takes_adds_and_compactions_but_no_removal_of_rows() {
        let s = table(legacy(2), json!({"delta.appendOnly": "true"}), json!({}));
        let add = json!({"add": {"path": "a", "dataChange": true}});
        let merge = json!({"remove": {"path": "b", "dataChange": false}});
        assert!(check_commit(&s, "t", &[add.clone(), merge]).is_ok());
        let e = check_commit(&s, "t", &[add, json!({"remove": {"path": "b", "dataChange": true}})]).unwrap_err();
        assert!(e.contains("append-only") && e.contains("1 file(s)"), "{e}");
    }
}
