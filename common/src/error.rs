//! What every Ferry error shares: whether a retry can help, and whether it is the user's
//! configuration. Each crate has one error type of its own and one `class()` that decides
//! retry-or-not for it; this module holds only the vocabulary they share.

/// Whether a failure is worth another attempt.
///
/// The ledger stores this next to the error: a `transient` failure sends the task to
/// `retryable` with backoff, a `permanent` one sends it straight to `quarantined`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    Transient,
    Permanent,
}

impl ErrorClass {
    pub const ALL: [ErrorClass; 2] = [ErrorClass::Transient, ErrorClass::Permanent];

    /// The value stored in the ledger's `error_class` columns.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent => "permanent",
        }
    }
}

/// An error as the stage runner and the binaries need it.
pub trait Classified: std::error::Error + Send + 'static {
    /// Retry or not: the one decision per error type.
    fn class(&self) -> ErrorClass;

    /// Bad flags, configuration or ledger URL: the binary exits with
    /// [`crate::cli::exit::CONFIG`] instead of [`crate::cli::exit::FATAL`].
    fn is_config(&self) -> bool {
        false
    }

    /// The store a transient failure is about (`staging`, `destination`, `ledger`), if it is
    /// one: failures of every chunk on one store, with no success between them, mean the store
    /// is down rather than the chunks broken.
    fn store(&self) -> Option<&'static str> {
        None
    }

    /// Not a failure of the chunk but a wait for others (a corrected file's version waits for
    /// all of its chunks): the task is looked at again after this long, without the attempt
    /// counting toward `max_attempts`.
    fn waits(&self) -> Option<std::time::Duration> {
        None
    }
}

/// A configuration the binaries cannot work with; `file` names the file, flag or URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration error in {file}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(file: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError { file: file.into(), message: message.into() }
    }
}

impl Classified for ConfigError {
    fn class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
    fn is_config(&self) -> bool {
        true
    }
}

/// I/O errors that a later attempt can plausibly get past.
pub fn io_error_class(e: &std::io::Error) -> ErrorClass {
    use std::io::ErrorKind::*;
    match e.kind() {
        NotFound | PermissionDenied | InvalidInput | InvalidData | Unsupported | AlreadyExists => ErrorClass::Permanent,
        // Everything else (resets, timeouts, a full disk, interrupted calls) may clear up.
        _ => ErrorClass::Transient,
    }
}

/// An error with its causes, joined by `: ` (a cause whose text is already in what came
/// before is left out). Client libraries put the telling part (`dns error`, `invalid peer
/// certificate`) in a cause, not in the error's own text.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

/// What usually causes a failure to reach a server, told from the error's text (the same
/// failure reads differently from each client library: rustls, hyper, sqlx, hdfs-native).
/// `ferry doctor` prints the fix; a `--watch` stage that cannot reach a store at start exits
/// 2 for the ones that are configuration ([`Cause::is_config`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Kerberos,
    Tls,
    Dns,
    Refused,
    Credentials,
    Permission,
    Missing,
    NoAnswer,
    Cut,
}

impl Cause {
    /// Wrong settings (or a missing grant) rather than a server that is down: waiting does
    /// not cure it.
    pub fn is_config(self) -> bool {
        matches!(self, Cause::Kerberos | Cause::Tls | Cause::Dns | Cause::Credentials | Cause::Permission | Cause::Missing)
    }

    /// What to check.
    pub fn fix(self) -> &'static str {
        match self {
            Cause::Kerberos => {
                "Kerberos: check kerberos_principal and kerberos_keytab (`klist -kt KEYTAB` lists its principals), the realm \
                 and KDC in /etc/krb5.conf (or KRB5_CONFIG), a credential cache that has not expired (`klist`), and that \
                 the clocks agree (within 5 minutes)"
            }
            Cause::Tls => {
                "TLS: the server's certificate is not trusted or was issued for another name: point store.s3.ca_bundle \
                 (or the system's CA store) at the CA that signed it, and use the host name the certificate names"
            }
            Cause::Dns => {
                "DNS: the host name does not resolve here: check its spelling in the URL or endpoint, and this host's \
                 resolver (/etc/resolv.conf, /etc/hosts)"
            }
            Cause::Refused => {
                "nothing listens at that host and port: check the port in the URL or endpoint, and that the service is \
                 running and listening on an address this host reaches"
            }
            Cause::Credentials => {
                "credentials: the server refused who we are: check the user and password (or access key and secret) in \
                 the configuration, and that the account exists there"
            }
            Cause::Permission => {
                "permission: the server refused this account here (on S3 a 403 without a reason also means a wrong \
                 secret key: check it first): grant it read, write and delete below this path (on HDFS: the owner and mode of the directory, or store.hdfs.user; on S3: the policy's \
                 s3:ListBucket, GetObject, PutObject, DeleteObject; on a local disk: the directory's owner and mode)"
            }
            Cause::Missing => {
                "missing: the bucket, directory or database named in the URL does not exist (Ferry creates directories \
                 below it, not the bucket or the database): create it or fix the URL"
            }
            Cause::NoAnswer => {
                "no answer in time: a firewall that drops packets, a host that is down, or a server that accepts \
                 connections and hangs: check the host and port"
            }
            Cause::Cut => {
                "the connection was cut: a proxy or load balancer in between, a TLS setting that does not match the \
                 server (https to a plain port or the reverse), or a server that restarted"
            }
        }
    }
}

/// The [`Cause`] an error's text points at, if any (most specific first).
pub fn likely_cause(error: &str) -> Option<Cause> {
    let e = error.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| e.contains(w));
    Some(if has(&["gssapi", "sasl", "kerberos", "krb5", "krbexception", "keytab", "ticket"]) {
        Cause::Kerberos
    } else if has(&["certificate", "unknownissuer", "unknown issuer", "self signed", "self-signed", "tls handshake", "invalidcertificate"])
    {
        Cause::Tls
    } else if has(&[
        "dns error",
        "failed to lookup address",
        "name or service not known",
        "no such host",
        "nodename nor servname",
        "temporary failure in name resolution",
        "could not resolve",
        "no address associated",
        "failed to resolve",
    ]) {
        Cause::Dns
    } else if has(&["connection refused"]) {
        Cause::Refused
    } else if has(&[
        "password authentication failed",
        "no pg_hba.conf entry",
        "invalidaccesskeyid",
        "signaturedoesnotmatch",
        "unauthenticated",
        "invalid access key",
        "the access key id",
    ]) {
        Cause::Credentials
    } else if has(&[
        "accesscontrolexception",
        "permission denied",
        "accessdenied",
        "access denied",
        "forbidden",
        "readonly database",
        "read-only",
        "authorizationexception",
        "must be owner",
        "lacked the necessary privileges",
    ]) {
        Cause::Permission
    } else if has(&["nosuchbucket", "bucket does not exist", "does not exist", "no such file", "not found", "filenotfoundexception"]) {
        Cause::Missing
    } else if has(&["no answer in", "timed out", "deadline has elapsed", "did not end within", "did not finish within"]) {
        Cause::NoAnswer
    } else if has(&["connection reset", "broken pipe", "unexpected eof", "connection closed"]) {
        Cause::Cut
    } else {
        return None;
    })
}

#[cfg(test)]
mod likely_cause_tests {
    use super::{Cause, likely_cause};

    #[test]
    fn the_usual_errors_get_their_fix() {
        let cases = [
            ("S3 list : Generic S3 error: error sending request: client error (Connect): invalid peer certificate: UnknownIssuer", "TLS"),
            ("error sending request: dns error: failed to lookup address information: Name or service not known", "DNS"),
            ("HDFS list /x: IO error: Connection refused (os error 111)", "nothing listens"),
            ("HDFS write /x: RPC error: org.apache.hadoop.security.AccessControlException: Permission denied: user=nobody", "permission"),
            ("error returned from database: password authentication failed for user \"ferry\"", "credentials"),
            ("S3 put x: Client error with status 403 Forbidden: <Code>SignatureDoesNotMatch</Code>", "credentials"),
            ("HDFS list /: GSSAPI error: No Kerberos credentials available", "Kerberos"),
            ("list: no answer in 20s", "no answer"),
            ("S3 list: Generic S3 error: <Code>NoSuchBucket</Code>", "missing"),
        ];
        for (error, fix) in cases {
            let got = likely_cause(error).unwrap_or_else(|| panic!("no cause for {error}"));
            assert!(got.fix().starts_with(fix), "{error}: {got:?}");
        }
        assert_eq!(likely_cause("something no one has seen"), None);
        assert!(Cause::Tls.is_config() && !Cause::Refused.is_config() && !Cause::NoAnswer.is_config());
    }
}
