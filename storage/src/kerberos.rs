//! Kerberos settings of an HDFS store, checked before any call: hdfs-native (through MIT's
//! GSSAPI) reports a missing keytab, a principal that is not in it, or a realm it does not
//! know all as "No credentials cache found", at the first call. Checked here, each is a
//! configuration error that names the key and what to check, at start.
//!
//! The keytab is read only to list the principals it holds (the MIT keytab format: a version,
//! then length-prefixed entries); no key leaves this module, and no length in the file is
//! trusted beyond the bytes that are there.

use crate::options::HdfsOptions;

use crate::error::{Error, Result};

/// Keytabs are a few hundred bytes per principal; a file much larger is not one.
const KEYTAB_MAX: u64 = 1 << 20;

/// Checks `h`'s Kerberos keys for the store at `url`.
pub fn check(h: &HdfsOptions, url: &str) -> Result<()> {
    let bad = |key: &str, message: String| Error::Config { file: format!("store.hdfs.{key} (store {url})"), message };
    let Some(keytab) = &h.kerberos_keytab else {
        if h.kerberos_cache.is_some() && h.kerberos_principal.is_none() {
            return Err(bad("kerberos_principal", "kerberos_cache needs kerberos_principal (the principal whose tickets it holds)".into()));
        }
        return Ok(());
    };
    let Some(principal) = &h.kerberos_principal else {
        return Err(bad(
            "kerberos_principal",
            format!("kerberos_keytab {keytab} needs kerberos_principal (which of its principals to be)"),
        ));
    };
    let unreadable = |e: std::io::Error| {
        bad("kerberos_keytab", format!("cannot read {keytab}: {e} (the keytab must be readable by the user Ferry runs as)"))
    };
    let size = std::fs::metadata(keytab).map_err(unreadable)?.len();
    if size > KEYTAB_MAX {
        return Err(bad("kerberos_keytab", format!("{keytab} is {size} bytes: not a keytab")));
    }
    let bytes = std::fs::read(keytab).map_err(unreadable)?;
    let held = principals(&bytes).map_err(|why| bad("kerberos_keytab", format!("{keytab} is not a readable keytab: {why}")))?;
    if !held.iter().any(|p| same_principal(p, principal)) {
        let list = if held.is_empty() { "none".to_string() } else { held.join(", ") };
        return Err(bad(
            "kerberos_principal",
            format!("{principal} is not in the keytab {keytab} (it holds: {list}); `klist -kt {keytab}` lists them too"),
        ));
    }
    Ok(())
}

/// `want` names `held` (`user@REALM`); a `want` without a realm names it in any realm (the
/// default realm, which only krb5.conf knows, completes it).
fn same_principal(held: &str, want: &str) -> bool {
    if want.contains('@') { held == want } else { held.rsplit_once('@').is_some_and(|(name, _)| name == want) }
}

/// The principals of a keytab (`name/instance@REALM`), each once, in file order.
fn principals(b: &[u8]) -> std::result::Result<Vec<String>, String> {
    let mut r = Reader { b, at: 0 };
    let version = r.u16()?;
    if version != 0x0502 && version != 0x0501 {
        return Err(format!("version bytes {version:#06x}, want 0x0502"));
    }
    let mut out: Vec<String> = vec![];
    while r.at < b.len() {
        let len = r.u32()? as i32;
        if len < 0 {
            // A hole left by a removed entry.
            r.skip(len.unsigned_abs() as usize)?;
            continue;
        }
        let end = r.at.checked_add(len as usize).filter(|&e| e <= b.len()).ok_or("an entry runs past the end of the file")?;
        let mut e = Reader { b: &b[..end], at: r.at };
        let mut components = e.u16()?;
        if version == 0x0501 {
            components = components.saturating_sub(1); // v1 counts the realm too
        }
        let realm = e.string()?;
        let mut names = vec![];
        for _ in 0..components {
            names.push(e.string()?);
        }
        let p = format!("{}@{realm}", names.join("/"));
        if !out.contains(&p) {
            out.push(p);
        }
        r.at = end;
    }
    Ok(out)
}

/// Big-endian reads that fail at the end of the bytes instead of trusting a length.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or("truncated")?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn skip(&mut self, n: usize) -> std::result::Result<(), String> {
        self.take(n).map(|_| ())
    }
    fn u16(&mut self) -> std::result::Result<u16, String> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let n = self.u16()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One keytab entry (v2): principal components, realm, name type, timestamp, kvno, key.
    fn entry(realm: &str, names: &[&str]) -> Vec<u8> {
        let mut e = vec![];
        e.extend((names.len() as u16).to_be_bytes());
        e.extend((realm.len() as u16).to_be_bytes());
        e.extend(realm.as_bytes());
        for n in names {
            e.extend((n.len() as u16).to_be_bytes());
            e.extend(n.as_bytes());
        }
        e.extend(1u32.to_be_bytes()); // KRB5_NT_PRINCIPAL
        e.extend(0u32.to_be_bytes()); // timestamp
        e.push(1); // kvno
        e.extend(17u16.to_be_bytes()); // aes128-cts
        e.extend(16u16.to_be_bytes());
        e.extend([7u8; 16]);
        let mut out = (e.len() as u32).to_be_bytes().to_vec();
        out.extend(e);
        out
    }

    fn keytab(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut b = vec![0x05, 0x02];
        for e in entries {
            b.extend(e);
        }
        b
    }

    #[test]
    fn a_keytab_lists_its_principals_and_a_truncated_one_is_refused() {
        let hole = {
            let mut h = (-8i32).to_be_bytes().to_vec();
            h.extend([0u8; 8]);
            h
        };
        let b = keytab(&[
            entry("EXAMPLE.COM", &["hdfs", "localhost"]),
            hole,
            entry("EXAMPLE.COM", &["ferry"]),
            entry("EXAMPLE.COM", &["ferry"]),
        ]);
        assert_eq!(principals(&b).unwrap(), ["hdfs/localhost@EXAMPLE.COM", "ferry@EXAMPLE.COM"]);
        for cut in 1..b.len() {
            // Never a panic, whatever length the cut leaves: an error or a shorter list.
            let _ = principals(&b[..cut]);
        }
        assert!(principals(&b[..b.len() - 3]).is_err());
        assert!(principals(b"not a keytab").is_err());
        let mut huge = keytab(&[]);
        huge.extend(u32::MAX.to_be_bytes()[..].iter().map(|_| 0x7f));
        assert!(principals(&huge).is_err(), "a length past the end is not trusted");
    }

    #[test]
    fn the_kerberos_keys_are_checked_against_the_keytab() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.keytab");
        std::fs::write(&path, keytab(&[entry("EXAMPLE.COM", &["ferry"])])).unwrap();
        let opts = |p: Option<&str>, k: Option<&str>| HdfsOptions {
            kerberos_principal: p.map(str::to_string),
            kerberos_keytab: k.map(str::to_string),
            ..HdfsOptions::default()
        };
        let k = path.to_str().unwrap();
        assert!(check(&opts(Some("ferry@EXAMPLE.COM"), Some(k)), "hdfs://nn").is_ok());
        assert!(check(&opts(Some("ferry"), Some(k)), "hdfs://nn").is_ok());
        assert!(check(&opts(None, None), "hdfs://nn").is_ok());
        let e = check(&opts(Some("etl@EXAMPLE.COM"), Some(k)), "hdfs://nn").unwrap_err().to_string();
        assert!(e.contains("kerberos_principal") && e.contains("it holds: ferry@EXAMPLE.COM"), "{e}");
        let e = check(&opts(Some("ferry@OTHER.REALM"), Some(k)), "hdfs://nn").unwrap_err().to_string();
        assert!(e.contains("not in the keytab"), "{e}");
        let e = check(&opts(Some("ferry@EXAMPLE.COM"), Some("/no/such.keytab")), "hdfs://nn").unwrap_err().to_string();
        assert!(e.contains("kerberos_keytab") && e.contains("cannot read /no/such.keytab"), "{e}");
        let e = check(&opts(None, Some(k)), "hdfs://nn").unwrap_err().to_string();
        assert!(e.contains("needs kerberos_principal"), "{e}");
    }
}
