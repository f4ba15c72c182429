//! Source files and their chunks: what extract records.

use ferry_common::config::Format;

use crate::backend::{Backend, Begin};
use crate::state::{FileState, RangeKind, Stage, TaskState};
use crate::{Ledger, Result, db};

#[derive(Debug, Clone)]
pub struct NewSourceFile {
    pub uri: String,
    pub size: i64,
    pub mtime_ms: i64,
    pub content_hash: String,
    /// None: the format could not be told from the name (the file is then quarantined).
    pub format: Option<Format>,
    /// See `ferry_storage::Entry::change_token`.
    pub change_token: Option<String>,
}

/// The text of a format the file name did not tell.
const UNKNOWN_FORMAT: &str = "unknown";

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SourceFile {
    pub id: i64,
    pub uri: String,
    pub size: i64,
    pub mtime_ms: i64,
    pub content_hash: String,
    pub version: i64,
    /// As registered: `avro`, `jsonl`, `csv`, or `unknown`.
    pub format: String,
    #[sqlx(try_from = "String")]
    pub state: FileState,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChunk {
    pub id: String,
    pub seq: i64,
    pub range_kind: RangeKind,
    pub range_start: i64,
    pub range_end: i64,
    pub records: Option<i64>,
    pub bytes: i64,
    pub content_hash: String,
    /// Where the staged chunk lives (a storage URL).
    pub location: String,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Chunk {
    pub id: String,
    pub file_id: i64,
    #[sqlx(rename = "uri")]
    pub file_uri: String,
    #[sqlx(try_from = "String")]
    pub format: Format,
    pub seq: i64,
    /// Index of the chunk's first record in its file (for positions in error messages).
    pub range_start: i64,
    pub records: Option<i64>,
    pub bytes: i64,
    pub content_hash: String,
    pub location: String,
}

/// The deterministic id of the `seq`-th chunk of a file with content hash `file_hash` in
/// `pipeline`. The default pipeline's ids are those of ledgers from before pipelines existed;
/// any other pipeline's name is part of its ids, so the same bytes in two pipelines are two
/// chunks.
pub fn chunk_id(pipeline: &str, file_hash: &str, seq: i64) -> String {
    let mut h = blake3::Hasher::new();
    h.update(file_hash.as_bytes());
    h.update(&seq.to_le_bytes());
    if pipeline != crate::DEFAULT_PIPELINE {
        h.update(b"\0pipeline\0");
        h.update(pipeline.as_bytes());
    }
    h.finalize().to_hex()[..24].to_string()
}

/// The name a chunk is staged under when it is written before its file's hash is known (extract
/// hashes a new file while splitting it). The chunk's id still comes from [`chunk_id`] once the
/// whole file is read; this name only has to be the same whenever the same file is split again
/// (so a crash re-writes its staged chunks instead of leaving copies) and different for any other
/// file: the uri, size and mtime name the file, the chunk's own hash and position its bytes.
pub fn staged_name(pipeline: &str, uri: &str, size: i64, mtime_ms: i64, seq: i64, chunk_hash: &str) -> String {
    let mut h = blake3::Hasher::new();
    for part in [pipeline.as_bytes(), b"\0", uri.as_bytes(), b"\0", chunk_hash.as_bytes(), b"\0"] {
        h.update(part);
    }
    h.update(&size.to_le_bytes());
    h.update(&mtime_ms.to_le_bytes());
    h.update(&seq.to_le_bytes());
    format!("s{}", &h.finalize().to_hex()[..23])
}

/// The columns of [`SourceFile`], for `concat!`.
macro_rules! select_source_file {
    () => {
        "SELECT id, uri, size, mtime_ms, content_hash, version, format, state, error FROM source_files"
    };
}

impl Ledger {
    /// The file already known at this uri with this size and mtime, if any: lets extract skip
    /// hashing files it has seen.
    pub async fn find_file(&self, uri: &str, size: i64, mtime_ms: i64, change_token: Option<&str>) -> Result<Option<SourceFile>> {
        // Without a change token, size and mtime prove nothing: the caller hashes.
        let Some(token) = change_token else { return Ok(None) };
        self.call("find_file", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as::<_, SourceFile>(concat!(
                    select_source_file!(),
                    " WHERE uri = $1 AND size = $2 AND mtime_ms = $3 AND change_token = $4 AND pipeline = $5 ORDER BY id DESC LIMIT 1"
                ))
                .bind(uri)
                .bind(size)
                .bind(mtime_ms)
                .bind(token)
                .bind(self.pipeline())
                .fetch_optional(pool)
                .await
                .map_err(db("find_file"))
            })
        })
        .await
    }

    /// Whether any file was ever registered at `uri` in this pipeline. A uri never seen is
    /// split while it is hashed (one read); one seen before is hashed first, so that bytes
    /// already taken in are recognised without being staged again.
    pub async fn knows_uri(&self, uri: &str) -> Result<bool> {
        self.call("knows_uri", || async move {
            on_backend!(self, |pool, begin| {
                let n: Option<i64> = sqlx::query_scalar("SELECT id FROM source_files WHERE uri = $1 AND pipeline = $2 LIMIT 1")
                    .bind(uri)
                    .bind(self.pipeline())
                    .fetch_optional(pool)
                    .await
                    .map_err(db("knows_uri"))?;
                Ok(n.is_some())
            })
        })
        .await
    }

    /// Registers a source file; idempotent on `(uri, content_hash)`. Returns the stored row,
    /// which may be an earlier registration of the same bytes.
    pub async fn register_file(&self, f: &NewSourceFile) -> Result<SourceFile> {
        let now = self.now_ms();
        let format = f.format.map_or(UNKNOWN_FORMAT, |f| f.as_str());
        self.call("register_file", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query(
                    "INSERT INTO source_files
                        (pipeline, uri, size, mtime_ms, content_hash, version, format, registered_at, change_token)
                     VALUES ($9, $1, $2, $3, $4,
                        (SELECT COUNT(*) + 1 FROM source_files WHERE pipeline = $9 AND uri = $1), $5, $6, $7)
                     ON CONFLICT (pipeline, uri, content_hash) DO UPDATE SET
                        mtime_ms = excluded.mtime_ms, change_token = excluded.change_token,
                        format = CASE WHEN source_files.state = $8 THEN excluded.format ELSE source_files.format END",
                )
                .bind(&f.uri)
                .bind(f.size)
                .bind(f.mtime_ms)
                .bind(&f.content_hash)
                .bind(format)
                .bind(now)
                .bind(f.change_token.as_deref())
                .bind(FileState::Registered.as_str())
                .bind(self.pipeline())
                .execute(pool)
                .await
                .map_err(db("register_file"))?;
                sqlx::query_as::<_, SourceFile>(concat!(select_source_file!(), " WHERE pipeline = $3 AND uri = $1 AND content_hash = $2"))
                    .bind(&f.uri)
                    .bind(&f.content_hash)
                    .bind(self.pipeline())
                    .fetch_one(pool)
                    .await
                    .map_err(db("register_file"))
            })
        })
        .await
    }

    /// Records a file's chunks and their first tasks, and marks the file `chunked`, in one
    /// transaction. Idempotent: chunks and tasks that exist are left alone.
    pub async fn record_chunks(&self, file_id: i64, chunks: &[NewChunk], first: Stage) -> Result<()> {
        let now = self.now_ms();
        let max_attempts = self.opts.max_attempts;
        self.call("record_chunks", || async move {
            on_backend!(self, |pool, begin| {
                let op = "record_chunks";
                let (_write, mut tx) = write_tx!(self, pool, begin, op);
                for c in chunks {
                    sqlx::query(
                        "INSERT INTO chunks (id, file_id, seq, range_kind, range_start, range_end,
                            records, bytes, content_hash, location, created_at)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                         ON CONFLICT (id) DO NOTHING",
                    )
                    .bind(&c.id)
                    .bind(file_id)
                    .bind(c.seq)
                    .bind(c.range_kind.as_str())
                    .bind(c.range_start)
                    .bind(c.range_end)
                    .bind(c.records)
                    .bind(c.bytes)
                    .bind(&c.content_hash)
                    .bind(&c.location)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?;
                    sqlx::query(
                        "INSERT INTO tasks (pipeline, chunk_id, stage, state, max_attempts, scheduled_at, created_at)
                         VALUES ($6, $1, $2, $3, $4, $5, $5)
                         ON CONFLICT (chunk_id, stage) DO NOTHING",
                    )
                    .bind(&c.id)
                    .bind(first.as_str())
                    .bind(TaskState::Available.as_str())
                    .bind(max_attempts)
                    .bind(now)
                    .bind(self.pipeline())
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?;
                }
                sqlx::query(
                    "UPDATE source_files SET state = $4, chunks = $2, chunked_at = $3, error = NULL
                     WHERE id = $1 AND state <> $4",
                )
                .bind(file_id)
                .bind(chunks.len() as i64)
                .bind(now)
                .bind(FileState::Chunked.as_str())
                .execute(&mut *tx)
                .await
                .map_err(db(op))?;
                tx.commit().await.map_err(db(op))
            })
        })
        .await
    }

    /// Another source file, already taken in, with the same bytes as `content_hash` (its URI).
    pub async fn same_bytes_as(&self, content_hash: &str, uri: &str) -> Result<Option<String>> {
        self.call("same_bytes_as", || async move {
            on_backend!(self, |pool, begin| {
                // Two copies split at the same time both pass this check; their records still
                // go in once, as chunk ids come from the bytes and `record_chunks` keeps the
                // chunks that exist.
                sqlx::query_scalar(
                    "SELECT uri FROM source_files WHERE content_hash = $1 AND uri <> $2 AND state = $3 AND pipeline = $4 ORDER BY id LIMIT 1",
                )
                .bind(content_hash)
                .bind(uri)
                .bind(FileState::Chunked.as_str())
                .bind(self.pipeline())
                .fetch_optional(pool)
                .await
                .map_err(db("same_bytes_as"))
            })
        })
        .await
    }

    /// Marks a source file as bad input that will not be chunked, with the reason.
    pub async fn quarantine_file(&self, file_id: i64, reason: &str) -> Result<()> {
        self.call("quarantine_file", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query("UPDATE source_files SET state = $3, error = $2 WHERE id = $1")
                    .bind(file_id)
                    .bind(reason)
                    .bind(FileState::Quarantined.as_str())
                    .execute(pool)
                    .await
                    .map_err(db("quarantine_file"))?;
                Ok(())
            })
        })
        .await
    }

    pub async fn chunk(&self, id: &str) -> Result<Chunk> {
        self.call("chunk", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as::<_, Chunk>(
                    "SELECT c.id, c.file_id, f.uri, f.format, c.seq, c.range_start, c.records, c.bytes,
                            c.content_hash, c.location
                     FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE c.id = $1",
                )
                .bind(id)
                .fetch_one(pool)
                .await
                .map_err(db("chunk"))
            })
        })
        .await
    }
}
