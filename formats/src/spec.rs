//! What the configuration says of a source format (`source.format`, `[source.csv]`) and of
//! the columns a chunk is decoded into (`table.columns`, `transform.cast`): plain types with
//! no codec behind them, so the configuration (`ferry-common`) can hold them while copy links
//! none of the formats' code.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Avro,
    Jsonl,
    Csv,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Avro => "avro",
            Format::Jsonl => "jsonl",
            Format::Csv => "csv",
        }
    }
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "avro" => Some(Format::Avro),
            "jsonl" | "json" | "ndjson" => Some(Format::Jsonl),
            "csv" => Some(Format::Csv),
            _ => None,
        }
    }
    /// The format a file name implies, for `format = "auto"`.
    pub fn from_name(name: &str) -> Option<Format> {
        let ext = name.rsplit('.').next()?.to_ascii_lowercase();
        Format::parse(&ext)
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Format, String> {
        Format::parse(s).ok_or_else(|| format!("unknown format {s:?} (avro, jsonl or csv)"))
    }
}

impl TryFrom<String> for Format {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Format, String> {
        s.parse()
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `source.format`: one format for every file, or `auto` (by file extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceFormat {
    #[default]
    Auto,
    Fixed(Format),
}

impl SourceFormat {
    /// The format of the source file `name`, if it can be told.
    pub fn of(self, name: &str) -> Option<Format> {
        match self {
            SourceFormat::Auto => Format::from_name(name),
            SourceFormat::Fixed(f) => Some(f),
        }
    }
}

impl<'de> Deserialize<'de> for SourceFormat {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "auto" => Ok(SourceFormat::Auto),
            f => Format::parse(f)
                .map(SourceFormat::Fixed)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown format {s:?} (avro, jsonl, csv or auto)"))),
        }
    }
}

impl schemars::JsonSchema for SourceFormat {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SourceFormat".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "enum": ["auto", "avro", "jsonl", "csv"]})
    }
}

impl schemars::JsonSchema for AsciiChar {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AsciiChar".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "minLength": 1, "maxLength": 1})
    }
}

impl Serialize for SourceFormat {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            SourceFormat::Auto => "auto",
            SourceFormat::Fixed(f) => f.as_str(),
        })
    }
}

/// The type of a table column (`table.columns[].type`, `transform.cast`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    String,
    /// int64
    Long,
    /// int32
    Int,
    Double,
    Float,
    Boolean,
    /// UTC, microseconds: what Spark, Trino and Hive store.
    Timestamp,
    /// UTC, milliseconds.
    TimestampMs,
    /// UTC, microseconds (the same as `timestamp`, said explicitly).
    TimestampUs,
    /// UTC, nanoseconds (years 1677 to 2262 only).
    TimestampNs,
    Date,
}

impl ColumnType {
    pub const ALL: [ColumnType; 11] = [
        ColumnType::String,
        ColumnType::Long,
        ColumnType::Int,
        ColumnType::Double,
        ColumnType::Float,
        ColumnType::Boolean,
        ColumnType::Timestamp,
        ColumnType::TimestampMs,
        ColumnType::TimestampUs,
        ColumnType::TimestampNs,
        ColumnType::Date,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ColumnType::String => "string",
            ColumnType::Long => "long",
            ColumnType::Int => "int",
            ColumnType::Double => "double",
            ColumnType::Float => "float",
            ColumnType::Boolean => "boolean",
            ColumnType::Timestamp => "timestamp",
            ColumnType::TimestampMs => "timestamp_ms",
            ColumnType::TimestampUs => "timestamp_us",
            ColumnType::TimestampNs => "timestamp_ns",
            ColumnType::Date => "date",
        }
    }

    /// Units of a timestamp column per second (None: not a timestamp).
    pub fn per_second(self) -> Option<i64> {
        match self {
            ColumnType::TimestampMs => Some(1_000),
            ColumnType::Timestamp | ColumnType::TimestampUs => Some(1_000_000),
            ColumnType::TimestampNs => Some(1_000_000_000),
            _ => None,
        }
    }

    /// The Hive / Spark SQL type of a column of this type.
    pub fn hive(self) -> &'static str {
        match self {
            ColumnType::String => "STRING",
            ColumnType::Long => "BIGINT",
            ColumnType::Int => "INT",
            ColumnType::Double => "DOUBLE",
            ColumnType::Float => "FLOAT",
            ColumnType::Boolean => "BOOLEAN",
            ColumnType::Timestamp | ColumnType::TimestampMs | ColumnType::TimestampUs | ColumnType::TimestampNs => "TIMESTAMP",
            ColumnType::Date => "DATE",
        }
    }
}

/// What a number in a timestamp column counts (`table.columns[].epoch`): without it, a number
/// there is rejected, since seconds and milliseconds look alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EpochUnit {
    S,
    Ms,
    Us,
    Ns,
}

impl EpochUnit {
    pub fn per_second(self) -> i64 {
        match self {
            EpochUnit::S => 1,
            EpochUnit::Ms => 1_000,
            EpochUnit::Us => 1_000_000,
            EpochUnit::Ns => 1_000_000_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ColumnSpec {
    /// The column's name (as written in the Parquet files and the table's schema).
    pub name: String,
    /// string, long (int64), int (int32), double, float, boolean, timestamp (UTC,
    /// microseconds; timestamp_ms, timestamp_us, timestamp_ns to choose), date
    #[serde(rename = "type")]
    pub ty: ColumnType,
    /// Whether the column may be null: a record without it (or with a null) is kept when
    /// true, rejected with its reason when false.
    #[serde(default = "nullable_by_default")]
    pub nullable: bool,
    /// Timestamp columns: what a number in the input counts (s, ms, us, ns). Unset: numbers
    /// are rejected there, text must be RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<EpochUnit>,
}

fn nullable_by_default() -> bool {
    true
}

/// `[source.csv]`: how CSV files are written. Extract frames records and transform reads
/// them with the same settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CsvOptions {
    /// The field separator, one ASCII character (`","`, `";"`, `"\t"`, `"|"`).
    pub delimiter: AsciiChar,
    /// The quote character, one ASCII character.
    pub quote: AsciiChar,
    /// Whether the first record names the columns. Without one, fields fill the declared
    /// columns in order.
    pub has_header: bool,
    /// A field holding exactly this text is a null, in every column. Unset: an empty field
    /// is a null, except in a string column, where it is the empty string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub null_value: Option<String>,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions { delimiter: AsciiChar(b','), quote: AsciiChar(b'"'), has_header: true, null_value: None }
    }
}

/// One ASCII character, written in the TOML as a one-character string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsciiChar(pub u8);

impl Serialize for AsciiChar {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&(self.0 as char).to_string())
    }
}

impl<'de> Deserialize<'de> for AsciiChar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_bytes() {
            [c] if c.is_ascii() && *c != b'\n' && *c != b'\r' => Ok(AsciiChar(*c)),
            _ => Err(serde::de::Error::custom(format!("{s:?}: expected one ASCII character other than a line end"))),
        }
    }
}
