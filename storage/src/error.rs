//! The one error type of `ferry-storage`, and the one place that decides retry-or-not for it.

use ferry_common::error::{Classified, ErrorClass, io_error_class};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A store URL or store setting that cannot work; `file` names the URL or key.
    #[error("configuration error in {file}: {message}")]
    Config { file: String, message: String },

    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// An HDFS call that failed (the NameNode or a DataNode answered with an error, or the
    /// connection broke).
    #[error("HDFS {op} {path}: {}", brief(source))]
    Hdfs {
        op: &'static str,
        path: String,
        #[source]
        source: hdfs_native::HdfsError,
    },

    /// An object-store (S3) call that failed after object_store's own retries.
    #[error("S3 {op} {path}: {source}")]
    ObjectStore {
        op: &'static str,
        path: String,
        #[source]
        source: object_store::Error,
    },

    /// A storage call whose outcome is unknown (a timeout or reset after the request went
    /// out). The caller must look before it redoes anything.
    #[error("{what}: outcome unknown ({reason})")]
    Ambiguous { what: String, reason: String },

    /// A transfer that missed its deadline or stopped making progress.
    #[error("{what}: {reason}")]
    Stalled { what: String, reason: String },

    /// A cleanup that removed `removed` files and could not remove or list the rest.
    #[error("removed {removed}, then: {reason}")]
    Incomplete { removed: usize, reason: String },

    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Error::Io { path: path.to_string(), source }
    }

    /// The single retry-or-not decision for storage.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Stalled { .. } | Error::Ambiguous { .. } | Error::Incomplete { .. } => ErrorClass::Transient,
            Error::Hdfs { source, .. } => hdfs_error_class(source),
            Error::ObjectStore { source, .. } => object_store_error_class(source),
            Error::Io { source, .. } => io_error_class(source),
            Error::Config { .. } | Error::Other(_) => ErrorClass::Permanent,
        }
    }

    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    /// The store answers but serves nobody for now, and says so: an HDFS NameNode in safe
    /// mode (after a restart, until enough DataNodes have reported their blocks). Not the
    /// chunk's failure: the stages wait for it without counting attempts, however long it
    /// lasts (a NameNode that stays in safe mode is an operator's matter, and the health
    /// check shows work due and nothing finishing).
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Hdfs { source: hdfs_native::HdfsError::RPCError(class, msg), .. } => {
                class.ends_with("SafeModeException") || msg.contains("Name node is in safe mode")
            }
            _ => false,
        }
    }

    /// What a cleanup that failed part-way had removed already.
    pub fn removed(&self) -> usize {
        match self {
            Error::Incomplete { removed, .. } => *removed,
            _ => 0,
        }
    }

    /// The file or object is not there, whichever backend said so.
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            Error::Hdfs { source, .. } => match source {
                hdfs_native::HdfsError::FileNotFound(_) => true,
                hdfs_native::HdfsError::RPCError(class, _) => class.ends_with("FileNotFoundException"),
                _ => false,
            },
            Error::ObjectStore { source, .. } => matches!(source, object_store::Error::NotFound { .. }),
            _ => false,
        }
    }

    /// The target already exists (a no-overwrite rename or conditional create lost).
    pub fn is_already_exists(&self) -> bool {
        match self {
            Error::Io { source, .. } => source.kind() == std::io::ErrorKind::AlreadyExists,
            Error::Hdfs { source, .. } => match source {
                hdfs_native::HdfsError::AlreadyExists(_) => true,
                hdfs_native::HdfsError::RPCError(class, _) => class.ends_with("FileAlreadyExistsException"),
                _ => false,
            },
            Error::ObjectStore { source, .. } => {
                matches!(source, object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. })
            }
            _ => false,
        }
    }
}

impl Classified for Error {
    fn class(&self) -> ErrorClass {
        Error::class(self)
    }
    fn is_config(&self) -> bool {
        matches!(self, Error::Config { .. })
    }
}

/// The first line of an error: a NameNode's RemoteException carries its whole Java stack.
fn brief(e: &dyn std::fmt::Display) -> String {
    let s = e.to_string();
    s.lines().next().unwrap_or_default().to_string()
}

/// HDFS: broken connections and server-side trouble retry; a missing file, a bad path, a
/// permission or a checksum that keeps failing after hdfs-native's own replica retries do not.
pub fn hdfs_error_class(e: &hdfs_native::HdfsError) -> ErrorClass {
    use hdfs_native::HdfsError::*;
    match e {
        IOError(io) => io_error_class(io),
        DataTransferError(_) | ChecksumError | BlocksNotFound(_) | OperationFailed(_) => ErrorClass::Transient,
        // A write pipeline that lost a DataNode asked for a replacement and the NameNode's
        // policy refused ("This feature is disabled"): that block's write is over, but a new
        // attempt gets a new pipeline, without the lost DataNode once the NameNode notices.
        RPCError(class, msg) if class.ends_with("UnsupportedOperationException") && msg.contains("replace-datanode-on-failure") => {
            ErrorClass::Transient
        }
        // A RemoteException: the ones that a later attempt cannot change are permanent; the
        // rest (safe mode, standby, "could only be written to 0 of the 1 minReplication
        // nodes" while DataNodes restart, leases being recovered, plain IOExceptions) retry,
        // bounded by max_attempts.
        RPCError(class, _) => {
            let never = [
                "AccessControlException",
                "AuthorizationException",
                "FileNotFoundException",
                "FileAlreadyExistsException",
                "ParentNotDirectoryException",
                "InvalidPathException",
                "PathIsNotEmptyDirectoryException",
                "UnresolvedLinkException",
                "UnsupportedOperationException",
                "HadoopIllegalArgumentException",
                "IllegalArgumentException",
            ];
            if never.iter().any(|k| class.ends_with(k)) { ErrorClass::Permanent } else { ErrorClass::Transient }
        }
        // Kerberos settings that cannot work: a realm no krb5.conf names, a principal the KDC
        // does not know, a key that does not match, clocks too far apart. A later attempt
        // finds the same; the stage says so at start (its store probe is refused).
        GSSAPIError(..) if kerberos_misconfigured(&e.to_string()) => ErrorClass::Permanent,
        // An expired ticket cache before the next kinit, a KDC that is briefly away.
        SASLError(_) | GSSAPIError(..) => ErrorClass::Transient,
        FatalRPCError(..) | InvalidRPCResponse(_) | InternalError(_) => ErrorClass::Transient,
        _ => ErrorClass::Permanent,
    }
}

/// The GSSAPI failures (MIT's texts) that are settings, not a KDC that is away.
fn kerberos_misconfigured(text: &str) -> bool {
    [
        "Cannot find KDC for realm",
        "not found in Kerberos database",
        "Clock skew too great",
        "Key table entry not found",
        "Preauthentication failed",
        "Key version number for principal in key table is incorrect",
        "Unsupported key table format",
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// S3: what reaches us has already used object_store's retry budget (5xx, 429, connect
/// errors, idempotent timeouts), so only errors a later attempt of the chunk can get past retry.
pub fn object_store_error_class(e: &object_store::Error) -> ErrorClass {
    use object_store::Error::*;
    match e {
        NotFound { .. }
        | InvalidPath { .. }
        | NotSupported { .. }
        | NotImplemented { .. }
        | PermissionDenied { .. }
        | Unauthenticated { .. }
        | UnknownConfigurationKey { .. } => ErrorClass::Permanent,
        // Generic covers transport failures and exhausted retries: the network may come back.
        _ => ErrorClass::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdfs_native::HdfsError::RPCError;

    /// The text a restarted MiniDFS NameNode gave a read before its DataNodes reported.
    #[test]
    fn a_namenode_in_safe_mode_is_unavailable_not_a_chunk_failure() {
        let hdfs =
            |class: &str, msg: &str| Error::Hdfs { op: "open", path: "/staging/x".into(), source: RPCError(class.into(), msg.into()) };
        let safe = hdfs(
            "org.apache.hadoop.hdfs.server.namenode.SafeModeException",
            "Zero blocklocations for /staging/x. Name node is in safe mode.",
        );
        assert!(safe.is_unavailable() && safe.is_transient());
        let wrapped = hdfs("org.apache.hadoop.ipc.RetriableException", "Cannot create file /x. Name node is in safe mode.");
        assert!(wrapped.is_unavailable());
        assert!(!hdfs("java.io.IOException", "File /x could only be written to 0 of the 1 minReplication nodes").is_unavailable());
    }

    #[test]
    fn a_refused_datanode_replacement_retries_other_unsupported_operations_do_not() {
        let refused = RPCError(
            "java.lang.UnsupportedOperationException".into(),
            "This feature is disabled.  Please refer to dfs.client.block.write.replace-datanode-on-failure.enable configuration property."
                .into(),
        );
        assert_eq!(hdfs_error_class(&refused), ErrorClass::Transient);
        let other = RPCError("java.lang.UnsupportedOperationException".into(), "Symlinks not supported".into());
        assert_eq!(hdfs_error_class(&other), ErrorClass::Permanent);
        let denied = RPCError("org.apache.hadoop.security.AccessControlException".into(), "Permission denied".into());
        assert_eq!(hdfs_error_class(&denied), ErrorClass::Permanent);
    }
}
