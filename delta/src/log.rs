//! The log's table-wide actions as types: the protocol (reader and writer versions, the table
//! features), its features by name, and the metaData. Read from any writer's commit and written
//! back carrying every field Ferry does not know (`other`), so a newer writer's field survives
//! Ferry's commits. Files (`add`, `remove`) stay JSON with accessors: Ferry writes them back
//! byte for byte (stats, tags, deletion vectors of other writers) more than it reads them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// A table feature, as the protocol's `readerFeatures` / `writerFeatures` name it. The ones a
/// writer of appends must know by name are variants; any other is [`Feature::Other`] (a table
/// using one is refused unless Ferry writes it, see `Snapshot::unwritable`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    AppendOnly,
    Invariants,
    CheckConstraints,
    ChangeDataFeed,
    GeneratedColumns,
    ColumnMapping,
    IdentityColumns,
    TimestampNtz,
    Other(String),
}

impl Feature {
    const NAMED: [(Feature, &'static str); 8] = [
        (Feature::AppendOnly, "appendOnly"),
        (Feature::Invariants, "invariants"),
        (Feature::CheckConstraints, "checkConstraints"),
        (Feature::ChangeDataFeed, "changeDataFeed"),
        (Feature::GeneratedColumns, "generatedColumns"),
        (Feature::ColumnMapping, "columnMapping"),
        (Feature::IdentityColumns, "identityColumns"),
        (Feature::TimestampNtz, "timestampNtz"),
    ];

    pub fn name(&self) -> &str {
        match self {
            Feature::Other(n) => n,
            f => Self::NAMED.iter().find(|(g, _)| g == f).map_or("", |(_, n)| n),
        }
    }

    pub fn parse(name: &str) -> Feature {
        Self::NAMED.iter().find(|(_, n)| *n == name).map_or_else(|| Feature::Other(name.to_string()), |(f, _)| f.clone())
    }

    /// The legacy writer version (before table features) from which a table has this feature,
    /// and whether readers need it too (reader version 2 for column mapping).
    fn legacy(&self) -> Option<(i32, bool)> {
        Some(match self {
            Feature::AppendOnly | Feature::Invariants => (2, false),
            Feature::CheckConstraints => (3, false),
            Feature::ChangeDataFeed | Feature::GeneratedColumns => (4, false),
            Feature::ColumnMapping => (5, true),
            Feature::IdentityColumns => (6, false),
            Feature::TimestampNtz | Feature::Other(_) => return None,
        })
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Feature {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Feature {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Feature, D::Error> {
        Ok(Feature::parse(&String::deserialize(d)?))
    }
}

/// The reader version from which a table lists its reader features by name.
pub const FEATURES_READER: i32 = 3;
/// The writer version from which a table lists its writer features by name.
pub const FEATURES_WRITER: i32 = 7;

/// The `protocol` action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Protocol {
    pub min_reader_version: i32,
    pub min_writer_version: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reader_features: Option<Vec<Feature>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_features: Option<Vec<Feature>>,
    /// Fields of later protocol versions, kept as they are.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Protocol {
    /// A legacy protocol (no feature lists).
    pub fn legacy(reader: i32, writer: i32) -> Protocol {
        Protocol { min_reader_version: reader, min_writer_version: writer, reader_features: None, writer_features: None, other: Map::new() }
    }

    /// The features listed for writers (`readers`: for readers); empty below writer 7 /
    /// reader 3.
    pub fn listed(&self, readers: bool) -> &[Feature] {
        let list = if readers { &self.reader_features } else { &self.writer_features };
        list.as_deref().unwrap_or(&[])
    }

    /// Every writer feature the table has: those listed, or, on a legacy protocol, those its
    /// writer version implies.
    pub fn writer_features(&self) -> Vec<Feature> {
        if self.min_writer_version >= FEATURES_WRITER {
            return self.listed(false).to_vec();
        }
        Feature::NAMED.iter().map(|(f, _)| f).filter(|f| f.legacy().is_some_and(|(w, _)| self.min_writer_version >= w)).cloned().collect()
    }

    /// Whether the table has `f` for its writers (and, where readers need it, its readers).
    pub fn has(&self, f: &Feature) -> bool {
        self.writer_features().contains(f)
            && (self.min_reader_version < FEATURES_READER || !needs_reader(f) || self.listed(true).contains(f))
    }

    /// This protocol with `f` added, as a table-features protocol (reader 3 / writer 7) that
    /// keeps every feature the table has, a legacy version's implied ones listed by name.
    pub fn with(&self, f: Feature) -> Protocol {
        let mut writers = self.writer_features();
        let mut readers: Vec<Feature> = if self.min_reader_version >= FEATURES_READER {
            self.listed(true).to_vec()
        } else {
            writers.iter().filter(|w| w.legacy().is_some_and(|(_, r)| r)).cloned().collect()
        };
        if !writers.contains(&f) {
            writers.push(f.clone());
        }
        if needs_reader(&f) && !readers.contains(&f) {
            readers.push(f);
        }
        Protocol {
            min_reader_version: FEATURES_READER,
            min_writer_version: FEATURES_WRITER,
            reader_features: Some(readers),
            writer_features: Some(writers),
            other: self.other.clone(),
        }
    }
}

/// Readers must know these to read a table (the rest concern writers only).
fn needs_reader(f: &Feature) -> bool {
    matches!(f, Feature::TimestampNtz | Feature::ColumnMapping)
}

/// The `metaData` action. `configuration` is the table's properties; `other` keeps fields Ferry
/// does not know as they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub format: Value,
    pub schema_string: String,
    #[serde(default)]
    pub partition_columns: Vec<String>,
    #[serde(default)]
    pub configuration: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_time: Option<i64>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Metadata {
    /// The schema, parsed.
    pub fn schema(&self) -> Result<Value, String> {
        serde_json::from_str(&self.schema_string).map_err(|e| format!("its schemaString is not JSON ({e})"))
    }
}

/// A `txn` action: an application's transaction version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetTransaction {
    pub app_id: String,
    pub version: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<i64>,
}

/// One line of a commit, by its kind. Files stay JSON (see the module's note).
#[derive(Debug, Clone)]
pub enum Action {
    Add(Value),
    Remove(Value),
    Txn(SetTransaction),
    Protocol(Protocol),
    MetaData(Metadata),
    CommitInfo(Value),
    /// cdc, domainMetadata, checkpointMetadata, sidecar, ...: nothing a writer of appends
    /// tracks.
    Other,
}

impl Action {
    /// A commit line's action (`{"<kind>": {...}}`), or why it is not one.
    pub fn parse(line: &str) -> Result<Action, String> {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("not a JSON action ({e})"))?;
        Action::of(v)
    }

    /// The action a JSON object holds.
    pub fn of(v: Value) -> Result<Action, String> {
        let Value::Object(m) = v else { return Err("an action that is not a JSON object".into()) };
        let mut it = m.into_iter();
        // `{}`: a checkpoint's row of a kind read without its columns (commitInfo, sidecar).
        let Some((kind, body)) = it.next() else { return Ok(Action::Other) };
        let typed = |what: &str, e: serde_json::Error| format!("a {what} action Ferry cannot read ({e})");
        Ok(match kind.as_str() {
            "add" => Action::Add(body),
            "remove" => Action::Remove(body),
            "txn" => Action::Txn(serde_json::from_value(body).map_err(|e| typed("txn", e))?),
            "protocol" => Action::Protocol(serde_json::from_value(body).map_err(|e| typed("protocol", e))?),
            "metaData" => Action::MetaData(serde_json::from_value(body).map_err(|e| typed("metaData", e))?),
            "commitInfo" => Action::CommitInfo(body),
            _ => Action::Other,
        })
    }
}

/// `{"protocol": ...}`, a commit's line.
pub fn protocol_line(p: &Protocol) -> Value {
    serde_json::json!({ "protocol": p })
}

/// `{"metaData": ...}`, a commit's line.
pub fn metadata_line(m: &Metadata) -> Value {
    serde_json::json!({ "metaData": m })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn actions_read_back_as_written_with_the_fields_ferry_does_not_know() {
        let p = json!({"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["timestampNtz", "vacuumProtocolCheck"],
            "writerFeatures": ["appendOnly", "rowTracking"], "futureField": 1});
        let Action::Protocol(proto) = Action::of(json!({ "protocol": p })).unwrap() else { panic!("a protocol") };
        assert_eq!(proto.listed(false), &[Feature::AppendOnly, Feature::Other("rowTracking".into())]);
        assert_eq!(serde_json::to_value(&proto).unwrap(), p);
        let m = json!({"id": "x", "format": {"provider": "parquet", "options": {}}, "schemaString": "{}", "partitionColumns": ["dt"],
            "configuration": {"delta.appendOnly": "true"}, "createdTime": 5, "description": "d", "newThing": [1]});
        let Action::MetaData(meta) = Action::of(json!({ "metaData": m })).unwrap() else { panic!("a metaData") };
        assert_eq!(meta.configuration["delta.appendOnly"], "true");
        assert_eq!(serde_json::to_value(&meta).unwrap(), m);
        assert!(matches!(Action::parse(r#"{"domainMetadata": {}}"#), Ok(Action::Other)));
        let e = Action::parse(r#"{"protocol": {"minReaderVersion": "one"}}"#).unwrap_err();
        assert!(e.contains("protocol action"), "{e}");
    }

    #[test]
    fn a_legacy_protocol_upgraded_for_a_feature_lists_every_feature_its_version_implied() {
        let v5 = Protocol::legacy(2, 5);
        assert!(v5.has(&Feature::ColumnMapping) && v5.has(&Feature::ChangeDataFeed) && !v5.has(&Feature::IdentityColumns));
        let up = v5.with(Feature::TimestampNtz);
        assert_eq!((up.min_reader_version, up.min_writer_version), (3, 7));
        for f in ["appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns", "columnMapping", "timestampNtz"] {
            assert!(up.has(&Feature::parse(f)), "{f} in {up:?}");
        }
        assert_eq!(up.listed(true), &[Feature::ColumnMapping, Feature::TimestampNtz]);
        assert!(!up.has(&Feature::IdentityColumns));
        // Adding one it has changes nothing.
        assert_eq!(up.with(Feature::TimestampNtz), up);
    }
}
