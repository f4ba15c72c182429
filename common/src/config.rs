//! What reading Ferry's configuration file takes, whatever its sections: sizes and durations
//! written for people, `FERRY_<SECTION>_<KEY>` environment overrides, errors that name the line
//! and the key without quoting a secret, secrets read from files, URLs without their passwords.
//! The sections themselves live with the crates that read them and are assembled in
//! `ferry-runtime` (`config.rs`).

use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

// What a source format reads and the columns it decodes into are the formats' own.
pub use ferry_formats::spec::{AsciiChar, ColumnSpec, ColumnType, CsvOptions, EpochUnit, Format, SourceFormat};

/// A duration written for people: "30s", "5m", "1h 30m", "250ms".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s)
            .map(HumanDuration)
            .map_err(|e| serde::de::Error::custom(format!("invalid duration {s:?} ({e}); write e.g. \"30s\" or \"5m\"")))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

impl schemars::JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "format": "duration"})
    }
}

impl schemars::JsonSchema for ByteSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ByteSize".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": ["string", "integer"], "format": "byte-size"})
    }
}

/// A size written for people: "64MiB", "512KiB", "1GB", "1000".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(s: &str) -> std::result::Result<ByteSize, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num.parse().map_err(|_| format!("invalid size {s:?}; write e.g. \"64MiB\""))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1000,
            "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gib" => 1 << 30,
            u => return Err(format!("invalid size unit {u:?} in {s:?}; use B, KiB, MiB, GiB, KB, MB or GB")),
        };
        if n <= 0.0 {
            return Err(format!("size {s:?} must be positive"));
        }
        Ok(ByteSize((n * mult as f64) as u64))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => ByteSize::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

/// The machine's host name, the default spool node.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// How a configuration file is laid out, for its `FERRY_<SECTION>_<KEY>` overrides.
pub struct Layout {
    /// The top-level sections (`copy`); the one top-level key, `pipeline`, is known anyway.
    pub sections: &'static [&'static str],
    /// The sections with a `store` table (`destination`), and the subsections it nests
    /// (`s3`): `FERRY_DESTINATION_STORE_S3_REGION` is `[destination.store.s3] region`.
    pub store_sections: &'static [&'static str],
    pub store_subsections: &'static [&'static str],
}

/// Reads the file at `path` into `T`, after applying the environment's `FERRY_*` overrides in
/// `vars`. Errors name the file, and the line and key where the text has them.
pub fn read<T: DeserializeOwned>(path: &Path, layout: &Layout, vars: impl Iterator<Item = (String, String)>) -> Result<T, ConfigError> {
    let file = path.display().to_string();
    let err = |message: String| ConfigError::new(file.clone(), message);
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read it: {e}")))?;
    // Deserializing the text itself first gives errors with the line and the key in it.
    toml::from_str::<T>(&text).map_err(|e| err(toml_error(&text, &e)))?;
    let mut doc: toml::Table = text.parse().map_err(|e: toml::de::Error| err(toml_error(&text, &e)))?;
    apply_env(&mut doc, layout, vars).map_err(err)?;
    toml::Value::Table(doc).try_into().map_err(|e: toml::de::Error| err(format!("after FERRY_* environment overrides: {}", e.message())))
}

/// A secret read from the file at `path` (a mounted Kubernetes Secret, a systemd credential),
/// without its final line break; `key` names the setting in the error.
pub fn read_secret(key: &str, path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))?;
    Ok(text.trim_end_matches(['\r', '\n']).to_string())
}

/// Fills `value` from `file` when the `<key>_file` form is set; both at once is an error.
pub fn secret_from_file(key: &str, value: &mut Option<String>, file: &Option<std::path::PathBuf>) -> Result<(), String> {
    if let Some(path) = file {
        if value.is_some() {
            return Err(format!("{key}: set either it or {key}_file, not both"));
        }
        *value = Some(read_secret(&format!("{key}_file"), path)?);
    }
    Ok(())
}

/// What a secret is shown as.
pub const REDACTED: &str = "***";

/// Keys whose values are secrets: their lines are never quoted in an error.
fn is_secret_key(key: &str) -> bool {
    let key = key.trim().trim_matches(['"', '\'']).to_ascii_lowercase();
    ["secret", "token", "password", "passwd", "credential"].iter().any(|w| key.contains(w))
        || key == "url"
        || key == "access_key_id"
        || key == "access_key"
}

/// A TOML error as "line L, column C: what", quoting the offending line as the parser does,
/// unless that line sets a secret (`secret_access_key = abc` without quotes would print the
/// secret) or the ledger URL (which may hold a password): then only the key is named.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else { return e.message().to_string() };
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line_no = text[..start].matches('\n').count() + 1;
    let column = text[line_start..start].chars().count() + 1;
    let line = text[line_start..line_end].trim_end_matches('\r');
    let key = line.split('=').next().unwrap_or_default().trim();
    if line.contains('=') && is_secret_key(key) {
        return format!(
            "line {line_no}, column {column}: the value of `{key}` is not valid TOML (not shown: it is a secret; quote it as \"...\")"
        );
    }
    format!("line {line_no}, column {column}: {}\n  {line_no} | {line}", e.message().trim_end())
}

/// A URL with its password replaced by `***` (`postgres://ferry:***@db/ferry`), for logs,
/// errors and `ferry status`. A URL without a password is returned as it is.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let mut end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    // A password holding `/`, `?` or `#` without percent-encoding ends the authority early
    // for a parser; for the redaction, a `user:` before such a character and an `@` after
    // it mean the `@` ends the userinfo (hiding too much is the safe side).
    let after_colon = rest[..end].split_once(':').map(|(_, p)| p);
    if !rest[..end].contains('@')
        && after_colon.is_some_and(|p| !p.bytes().all(|b| b.is_ascii_digit()))
        && let Some(at) = rest.rfind('@')
    {
        end = at + rest[at..].find(['/', '?', '#']).unwrap_or(rest.len() - at);
    }
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:{REDACTED}@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    // libpq-style parameters can carry one too: ?password=...
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") || k.eq_ignore_ascii_case("sslpassword") => {
                        format!("{k}={REDACTED}")
                    }
                    _ => p.to_string(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// `FERRY_COPY_CONCURRENCY=8` sets `copy.concurrency`. Section and key are matched against the
/// known sections; values are parsed as TOML when they can be (numbers, booleans), else strings.
fn apply_env(doc: &mut toml::Table, layout: &Layout, vars: impl Iterator<Item = (String, String)>) -> Result<(), String> {
    let sections = layout.sections;
    // Variables that are flags of the binaries, not config keys.
    const NOT_KEYS: &[&str] = &["FERRY_CONFIG", "FERRY_LEDGER", "FERRY_LOG_FORMAT"];
    for (k, v) in vars {
        let Some(rest) = k.strip_prefix("FERRY_") else { continue };
        if NOT_KEYS.contains(&k.as_str()) || k.starts_with("FERRY_TEST_") {
            continue;
        }
        let lower = rest.to_ascii_lowercase();
        // The one top-level key: the pipeline (also `ferry --pipeline`'s variable).
        if lower == "pipeline" {
            doc.insert("pipeline".into(), toml::Value::String(v.clone()));
            continue;
        }
        let Some((section, key)) =
            sections.iter().find_map(|s| lower.strip_prefix(s).and_then(|r| r.strip_prefix('_')).map(|key| (*s, key.to_string())))
        else {
            // Other FERRY_* variables belong to scripts and tools around Ferry; one whose first
            // word is a section name misspelt would be a setting silently lost.
            let word = lower.split('_').next().unwrap_or_default();
            if let Some(s) = sections.iter().find(|s| word != "log" && edit_distance(word, s) <= 2 && word.len() + 1 >= s.len()) {
                return Err(format!("{k}: there is no section `{word}` (did you mean FERRY_{}_...?)", s.to_ascii_uppercase()));
            }
            continue;
        };
        let value =
            format!("v = {v}").parse::<toml::Table>().ok().and_then(|mut t| t.remove("v")).unwrap_or(toml::Value::String(v.clone()));
        // Store settings nest: FERRY_DESTINATION_STORE_S3_SECRET_ACCESS_KEY is
        // [destination.store.s3] secret_access_key.
        let mut path = vec![section.to_string()];
        let mut key = key;
        if layout.store_sections.contains(&section)
            && let Some(inner) = key.strip_prefix("store_")
        {
            path.push("store".into());
            key = inner.to_string();
            if let Some((sub, inner)) =
                layout.store_subsections.iter().find_map(|sub| key.strip_prefix(sub).and_then(|r| r.strip_prefix('_')).map(|r| (sub, r)))
            {
                path.push(sub.to_string());
                key = inner.to_string();
            }
        }
        // Secrets, URLs and paths are text even when they look like a number or a boolean.
        let value = if ["_key", "_key_id", "_token", "url", "_file", "account", "endpoint"].iter().any(|end| key.ends_with(end)) {
            toml::Value::String(v.clone())
        } else {
            value
        };
        let mut table = &mut *doc;
        for name in &path {
            table = table
                .entry(name.as_str())
                .or_insert_with(|| toml::Value::Table(Default::default()))
                .as_table_mut()
                .ok_or_else(|| format!("{}: expected a section (from env {k})", path.join(".")))?;
        }
        table.insert(key, value);
    }
    Ok(())
}

/// Levenshtein distance, for telling a misspelt section from an unrelated variable.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let cur = row[j + 1];
            row[j + 1] = if ca == b[j] { prev } else { 1 + prev.min(row[j]).min(row[j + 1]) };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: Layout =
        Layout { sections: &["ledger", "copy", "destination"], store_sections: &["destination"], store_subsections: &["s3", "hdfs"] };

    #[test]
    fn a_misspelt_section_in_an_environment_override_is_an_error_naming_it() {
        let mut doc = toml::Table::new();
        for typo in ["FERRY_DESTINATON_URL", "FERRY_COPPY_CONCURRENCY", "FERRY_LEGDER_URL"] {
            let e = apply_env(&mut doc, &LAYOUT, std::iter::once((typo.to_string(), "1".to_string()))).unwrap_err();
            assert!(e.starts_with(typo) && e.contains("did you mean"), "{e}");
        }
        // Variables of the scripts and tools around Ferry are not config keys, and not typos.
        for other in ["FERRY_CACHE", "FERRY_MINIDFS_HOME", "FERRY_PG_PORT", "FERRY_S3_DIR", "FERRY_SEED", "FERRY_METRICS_ADDR", "FERRY_LOG"]
        {
            apply_env(&mut doc, &LAYOUT, std::iter::once((other.to_string(), "1".to_string()))).unwrap();
        }
        assert!(doc.is_empty(), "{doc:?}");
    }

    #[test]
    fn store_keys_nest_under_their_subsection() {
        let mut doc = toml::Table::new();
        let vars = [
            ("FERRY_DESTINATION_STORE_S3_SECRET_ACCESS_KEY", "123456"),
            ("FERRY_DESTINATION_STORE_CALL_TIMEOUT", "5s"),
            ("FERRY_DESTINATION_STORE_HDFS_USER", "etl"),
            ("FERRY_COPY_CONCURRENCY", "9"),
        ];
        apply_env(&mut doc, &LAYOUT, vars.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
        let store = &doc["destination"]["store"];
        // A secret that looks like a number stays text; other numbers are numbers.
        assert_eq!(store["s3"]["secret_access_key"].as_str(), Some("123456"));
        assert_eq!(store["call_timeout"].as_str(), Some("5s"));
        assert_eq!(store["hdfs"]["user"].as_str(), Some("etl"));
        assert_eq!(doc["copy"]["concurrency"].as_integer(), Some(9));
    }

    #[test]
    fn urls_lose_their_password_only() {
        assert_eq!(redact_url("postgres://u:p@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://u@h/db?sslmode=verify-full&password=x"), "postgres://u@h/db?sslmode=verify-full&password=***");
        assert_eq!(redact_url("sqlite:///var/lib/ferry/ledger.db"), "sqlite:///var/lib/ferry/ledger.db");
    }

    #[test]
    fn passwords_with_delimiters_are_hidden_too() {
        let shown = redact_url("postgres://u:p?ss#w/rd@host:1/x");
        assert!(!shown.contains("p?ss") && !shown.contains("w/rd"), "{shown}");
        assert_eq!(shown, "postgres://u:***@host:1/x");
        assert_eq!(redact_url("postgres://u:pw@h/db?options=a@b"), "postgres://u:***@h/db?options=a@b");
    }

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("64MiB").unwrap(), ByteSize(64 << 20));
        assert_eq!(ByteSize::parse("1.5KB").unwrap(), ByteSize(1500));
        assert!(ByteSize::parse("12 parsecs").is_err());
    }
}
