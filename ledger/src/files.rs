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

/// What [`Ledger::record_chunks`] did with a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Its chunks and their first tasks are in.
    Chunked,
    /// Another file with the same bytes (this URI) is taken in: this one is quarantined.
    SameBytesAs(String),
}

/// A version whose bytes are at its path again although a newer version came after them
/// (see [`Ledger::undone_version`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undone {
    /// The version number it would get back.
    pub next: i64,
    pub chunks: Vec<UndoneChunk>,
    /// A load of one of its chunks is running: it may be withdrawing the chunk (taking its
    /// landed files away), so the version is not brought back until it ends.
    pub busy: bool,
}

/// A chunk of an [`Undone`] version, as recorded when the version was first split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoneChunk {
    pub id: String,
    pub seq: i64,
    /// Index of its first record: where a split of the same bytes cuts it again.
    pub range_start: i64,
    pub bytes: i64,
    pub content_hash: String,
    /// It runs again from transform, staged anew (its staged copy may be gone): a load
    /// withdrew it (its landed files may be gone, whether that load finished or not), or none
    /// of its tasks is unfinished and nothing of it is in the table (the newer version
    /// replaced it), or a newer version is in the table too (a switch cut short: its files may
    /// be gone; load finds in place whatever of it is still there).
    pub rerun: bool,
}

/// What [`Ledger::revive_version`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revived {
    /// The version's new number, and the chunks sent through transform again.
    Version(i64, Vec<String>),
    /// Not now, and why; the next pass looks again.
    NotNow(String),
}

/// Reads an [`Undone`] for file `$file` on connection or transaction `$conn`: the query
/// [`Ledger::undone_version`] reads with and [`Ledger::revive_version`] decides with.
macro_rules! undone {
    ($conn:expr, $file:expr, $op:expr) => {
        async {
            let next: (i64, i64) = sqlx::query_as(
                "SELECT MAX(n.version) + 1, MAX(f.version) FROM source_files f
                 JOIN source_files n ON n.pipeline = f.pipeline AND n.uri = f.uri WHERE f.id = $1",
            )
            .bind($file)
            .fetch_one(&mut *$conn)
            .await
            .map_err(db($op))?;
            if next.0 == next.1 + 1 {
                return Ok::<Option<Undone>, crate::Error>(None);
            }
            let rows: Vec<(String, i64, i64, i64, String, i64, i64)> = sqlx::query_as(concat!(
                "SELECT c.id, c.seq, c.range_start, c.bytes, c.content_hash,
                        CAST(CASE WHEN c.withdrawn_at IS NOT NULL
                               OR (NOT EXISTS (SELECT 1 FROM tasks t WHERE t.chunk_id = c.id AND t.state <> 'done')
                                   AND (NOT EXISTS (SELECT 1 FROM published p WHERE p.chunk_id = c.id)
                                        OR EXISTS (SELECT 1 FROM source_files n
                                                   WHERE n.pipeline = f.pipeline AND n.uri = f.uri AND n.version > f.version AND ",
                version_in_table!("n"),
                ")))
                             THEN 1 ELSE 0 END AS BIGINT),
                        CAST(CASE WHEN EXISTS (SELECT 1 FROM tasks t WHERE t.chunk_id = c.id AND t.stage = 'load' AND t.state = 'running')
                             THEN 1 ELSE 0 END AS BIGINT)
                 FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE c.file_id = $1 ORDER BY c.seq",
            ))
            .bind($file)
            .fetch_all(&mut *$conn)
            .await
            .map_err(db($op))?;
            let busy = rows.iter().any(|r| r.6 > 0);
            let chunks = rows
                .into_iter()
                .map(|(id, seq, range_start, bytes, content_hash, rerun, _)| UndoneChunk { id, seq, range_start, bytes, content_hash, rerun: rerun > 0 })
                .collect();
            Ok(Some(Undone { next: next.0, chunks, busy }))
        }
        .await
    };
}

/// Why a file with the same bytes as one taken in is set aside (the same words whether the
/// two came in one pass or in two).
pub fn duplicate_reason(uri: &str, first: &str) -> String {
    format!("{uri}: the same bytes as {first}, which is taken in already; not loaded twice")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    pub id: i64,
    pub uri: String,
    pub size: i64,
    pub mtime_ms: i64,
    pub content_hash: String,
    pub version: i64,
    /// As registered: `avro`, `jsonl`, `csv`, or `unknown`.
    pub format: String,
    pub state: FileState,
    pub error: Option<String>,
}

from_row!(SourceFile { id, uri, size, mtime_ms, content_hash, version, format, state: String, error });

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub id: String,
    pub file_id: i64,
    pub file_uri: String,
    pub format: Format,
    pub seq: i64,
    /// Index of the chunk's first record in its file (for positions in error messages).
    pub range_start: i64,
    pub records: Option<i64>,
    pub bytes: i64,
    pub content_hash: String,
    pub location: String,
}

from_row!(Chunk { id, file_id, file_uri = "uri", format: String, seq, range_start, records, bytes, content_hash, location });

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
    /// hashing files it has seen. With `newest_only`, only a row that is its path's newest
    /// version counts: an older version whose token matches is an undone correction whose
    /// revival did not happen yet (extract died between registering the bytes, which stores
    /// the token, and reviving them), and must be read again, not skipped for ever.
    pub async fn find_file(
        &self,
        uri: &str,
        size: i64,
        mtime_ms: i64,
        change_token: Option<&str>,
        newest_only: bool,
    ) -> Result<Option<SourceFile>> {
        // Without a change token, size and mtime prove nothing: the caller hashes.
        let Some(token) = change_token else { return Ok(None) };
        self.call("find_file", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as::<_, SourceFile>(concat!(
                    select_source_file!(),
                    " WHERE uri = $1 AND size = $2 AND mtime_ms = $3 AND change_token = $4 AND pipeline = $5
                       AND (NOT $6 OR NOT EXISTS (SELECT 1 FROM source_files n
                            WHERE n.pipeline = source_files.pipeline AND n.uri = source_files.uri AND n.version > source_files.version))
                     ORDER BY id DESC LIMIT 1"
                ))
                .bind(uri)
                .bind(size)
                .bind(mtime_ms)
                .bind(token)
                .bind(self.pipeline())
                .bind(newest_only)
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

    /// The state of these bytes (`content_hash`) at this uri, if they were registered there.
    /// Reads only: extract asks before it splits a file under a known name (it registers only
    /// what the split itself read), and before it finishes a disposal a crash interrupted.
    pub async fn state_of_bytes(&self, uri: &str, content_hash: &str) -> Result<Option<FileState>> {
        self.call("state_of_bytes", || async move {
            on_backend!(self, |pool, begin| {
                let state: Option<String> =
                    sqlx::query_scalar("SELECT state FROM source_files WHERE uri = $1 AND content_hash = $2 AND pipeline = $3 LIMIT 1")
                        .bind(uri)
                        .bind(content_hash)
                        .bind(self.pipeline())
                        .fetch_optional(pool)
                        .await
                        .map_err(db("state_of_bytes"))?;
                Ok(state.map(|s| s.parse::<FileState>()).transpose()?)
            })
        })
        .await
    }

    /// Registers a source file; idempotent on `(uri, content_hash)`. Returns the stored row,
    /// which may be an earlier registration of the same bytes.
    pub async fn register_file(&self, f: &NewSourceFile) -> Result<SourceFile> {
        let now = self.now_ms();
        let format = f.format.map_or(UNKNOWN_FORMAT, |f| f.as_str());
        let postgres = self.backend_name() == "postgres";
        self.call("register_file", || async move {
            on_backend!(self, |pool, begin| {
                let op = "register_file";
                let (_write, mut tx) = write_tx!(self, pool, begin, op);
                // The next version number, under the file's URI lock on Postgres (SQLite's
                // write lock serializes the rest): two hosts registering two new versions of
                // one file, or one registering while another reverts it, never get one number.
                if postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 1))")
                        .bind(&f.uri)
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                }
                sqlx::query(
                    "INSERT INTO source_files
                        (pipeline, uri, size, mtime_ms, content_hash, version, format, registered_at, change_token)
                     VALUES ($9, $1, $2, $3, $4,
                        (SELECT COALESCE(MAX(version), 0) + 1 FROM source_files WHERE pipeline = $9 AND uri = $1), $5, $6, $7)
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
                .execute(&mut *tx)
                .await
                .map_err(db(op))?;
                tx.commit().await.map_err(db(op))?;
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

    /// Bytes taken in before at `uri` arrived there again as another file (its change token is
    /// not the one recorded: a new inode, generation or ETag), which `versions = "keep"` does
    /// not take in again: the decision is counted on the file's row for `ferry status`, and the
    /// new token recorded, so the file sitting there is counted once. Returns the count, or
    /// None when it is not a new arrival (the same file seen again, a store without change
    /// tokens, or bytes not taken in at this uri).
    pub async fn arrived_again(&self, uri: &str, content_hash: &str, change_token: Option<&str>, mtime_ms: i64) -> Result<Option<i64>> {
        let Some(token) = change_token else { return Ok(None) };
        let now = self.now_ms();
        self.call("arrived_again", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_scalar(
                    "UPDATE source_files SET arrived_again = arrived_again + 1, arrived_again_at = $4, change_token = $3, mtime_ms = $5
                     WHERE pipeline = $6 AND uri = $1 AND content_hash = $2 AND state <> $7
                       AND change_token IS NOT NULL AND change_token <> $3
                     RETURNING arrived_again",
                )
                .bind(uri)
                .bind(content_hash)
                .bind(token)
                .bind(now)
                .bind(mtime_ms)
                .bind(self.pipeline())
                .bind(FileState::Registered.as_str())
                .fetch_optional(pool)
                .await
                .map_err(db("arrived_again"))
            })
        })
        .await
    }

    /// When a file taken in before (`file_id`) is at its path again but is not the newest
    /// version there (a correction undone: the old bytes put back), how it would come back
    /// (see [`Undone`]); None when it is the newest version. A read: [`Ledger::revive_version`]
    /// decides again, in its transaction.
    pub async fn undone_version(&self, file_id: i64) -> Result<Option<Undone>> {
        self.call("undone_version", || async move {
            on_backend!(self, |pool, begin| {
                let mut conn = pool.acquire().await.map_err(db("undone_version"))?;
                undone!(&mut *conn, file_id, "undone_version")
            })
        })
        .await
    }

    /// Makes `file_id` its path's newest version again, as version `next`, if that is still
    /// the next number and no load of its chunks is running; its chunks that must run again
    /// (decided here, in the transaction: see [`UndoneChunk::rerun`]) go to transform from the
    /// locations in `staged` (chunk id, staged URL), where extract staged them anew. One
    /// transaction, so the version is never the newest without its chunks on their way back
    /// into the table. On Postgres it takes the file's URI lock, which a load takes to record
    /// a chunk or to withdraw one.
    pub async fn revive_version(&self, file_id: i64, next: i64, staged: &[(String, String)]) -> Result<Revived> {
        let now = self.now_ms();
        let max_attempts = self.opts.max_attempts;
        let postgres = self.backend_name() == "postgres";
        self.call("revive_version", || async move {
            on_backend!(self, |pool, begin| {
                let op = "revive_version";
                let (_write, mut tx) = write_tx!(self, pool, begin, op);
                if postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended(uri, 1)) FROM source_files WHERE id = $1")
                        .bind(file_id)
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                }
                let Some(undone) = undone!(&mut *tx, file_id, op)? else {
                    return Ok(Revived::NotNow("it is the newest version already".into()));
                };
                if undone.next != next {
                    return Ok(Revived::NotNow(format!(
                        "another version of the file came meanwhile (version {} is next now)",
                        undone.next
                    )));
                }
                if undone.busy {
                    return Ok(Revived::NotNow(
                        "a load of one of its chunks is running; it may be taking the chunk's landed files away".into(),
                    ));
                }
                let location = |id: &str| staged.iter().find(|(c, _)| c == id).map(|(_, l)| l.as_str());
                let rerun: Vec<&UndoneChunk> = undone.chunks.iter().filter(|c| c.rerun).collect();
                if let Some(c) = rerun.iter().find(|c| c.bytes > 0 && location(&c.id).is_none()) {
                    return Ok(Revived::NotNow(format!("chunk {} must run again and was not staged anew", c.id)));
                }
                // In the table again only once a load records it again.
                sqlx::query("UPDATE source_files SET version = $2, switched_at = NULL WHERE id = $1")
                    .bind(file_id)
                    .bind(next)
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?;
                for c in &rerun {
                    sqlx::query("UPDATE chunks SET location = COALESCE($2, location), withdrawn_at = NULL WHERE id = $1 AND file_id = $3")
                        .bind(&c.id)
                        .bind(location(&c.id))
                        .bind(file_id)
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                    // As `ferry rerun --from transform`: the task again (recreated if prune
                    // took it); no load of the chunk is running (checked above), and its
                    // copy and load are handed the chunk again as transform finishes.
                    sqlx::query(
                        "INSERT INTO tasks (pipeline, chunk_id, stage, state, max_attempts, scheduled_at, created_at)
                         VALUES ($1, $2, 'transform', 'available', $3, $4, $4) ON CONFLICT (chunk_id, stage) DO NOTHING",
                    )
                    .bind(self.pipeline())
                    .bind(&c.id)
                    .bind(max_attempts)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?;
                    sqlx::query(
                        "UPDATE tasks SET state = 'available', attempt = 0, scheduled_at = $2, finalized_at = NULL,
                            last_error = NULL, last_error_class = NULL, epoch = epoch + 1
                         WHERE chunk_id = $1 AND stage = 'transform' AND state <> 'running'",
                    )
                    .bind(&c.id)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db(op))?;
                    sqlx::query("DELETE FROM skips WHERE chunk_id = $1").bind(&c.id).execute(&mut *tx).await.map_err(db(op))?;
                }
                tx.commit().await.map_err(db(op))?;
                Ok(Revived::Version(next, rerun.iter().map(|c| c.id.clone()).collect()))
            })
        })
        .await
    }

    /// Rows per multi-row INSERT: 11 values each, well under SQLite's (32,766) and Postgres'
    /// (65,535) limits on the values bound to one statement.
    const ROWS_PER_INSERT: usize = 500;

    /// Records a file's chunks and their first tasks, and marks the file `chunked`, in one
    /// transaction. Idempotent: chunks and tasks that exist are left alone.
    ///
    /// Unless another file of the pipeline with the same bytes is chunked already (two names
    /// delivered at once both pass the check before the split): then this one is quarantined
    /// instead, with the first one's name, in the same transaction. The check and the commit
    /// are one step (SQLite's write lock; on Postgres a transaction lock on the content hash),
    /// so of two copies exactly one is taken in, and the other says which.
    pub async fn record_chunks(&self, file_id: i64, chunks: &[NewChunk], first: Stage) -> Result<Recorded> {
        let now = self.now_ms();
        let max_attempts = self.opts.max_attempts;
        let postgres = self.backend_name() == "postgres";
        self.call("record_chunks", || async move {
            on_backend!(self, |pool, begin| {
                let op = "record_chunks";
                let (_write, mut tx) = write_tx!(self, pool, begin, op);
                let (uri, hash, size): (String, String, i64) =
                    sqlx::query_as("SELECT uri, content_hash, size FROM source_files WHERE id = $1")
                        .bind(file_id)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db(op))?;
                if postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                        .bind(&hash)
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                }
                // An empty file holds nothing to double: never a duplicate.
                let twin: Option<String> = if size == 0 {
                    None
                } else {
                    sqlx::query_scalar(
                        "SELECT uri FROM source_files WHERE content_hash = $1 AND uri <> $2 AND state = $3 AND pipeline = $4
                     ORDER BY id LIMIT 1",
                    )
                    .bind(&hash)
                    .bind(&uri)
                    .bind(FileState::Chunked.as_str())
                    .bind(self.pipeline())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db(op))?
                };
                if let Some(twin) = twin {
                    sqlx::query("UPDATE source_files SET state = $3, error = $2 WHERE id = $1 AND state <> $4")
                        .bind(file_id)
                        .bind(crate::text(&duplicate_reason(&uri, &twin)))
                        .bind(FileState::Quarantined.as_str())
                        .bind(FileState::Chunked.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?;
                    tx.commit().await.map_err(db(op))?;
                    return Ok(Recorded::SameBytesAs(twin));
                }
                // Many rows per statement: a file of 100,000 chunks is 400 statements, not
                // 200,000 round trips inside one write transaction (the writer lock held, and
                // the stage's health window ticking, all the while).
                for batch in chunks.chunks(Self::ROWS_PER_INSERT) {
                    let mut q = sqlx::QueryBuilder::new(
                        "INSERT INTO chunks (id, file_id, seq, range_kind, range_start, range_end,
                            records, bytes, content_hash, location, created_at) ",
                    );
                    q.push_values(batch, |mut row, c| {
                        row.push_bind(&c.id)
                            .push_bind(file_id)
                            .push_bind(c.seq)
                            .push_bind(c.range_kind.as_str())
                            .push_bind(c.range_start)
                            .push_bind(c.range_end)
                            .push_bind(c.records)
                            .push_bind(c.bytes)
                            .push_bind(&c.content_hash)
                            .push_bind(&c.location)
                            .push_bind(now);
                    });
                    q.push(" ON CONFLICT (id) DO NOTHING");
                    q.build().execute(&mut *tx).await.map_err(db(op))?;
                    let mut q = sqlx::QueryBuilder::new(
                        "INSERT INTO tasks (pipeline, chunk_id, stage, state, max_attempts, scheduled_at, created_at) ",
                    );
                    q.push_values(batch, |mut row, c| {
                        row.push_bind(self.pipeline())
                            .push_bind(&c.id)
                            .push_bind(first.as_str())
                            .push_bind(TaskState::Available.as_str())
                            .push_bind(max_attempts)
                            .push_bind(now)
                            .push_bind(now);
                    });
                    q.push(" ON CONFLICT (chunk_id, stage) DO NOTHING");
                    q.build().execute(&mut *tx).await.map_err(db(op))?;
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
                tx.commit().await.map_err(db(op))?;
                Ok(Recorded::Chunked)
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

    /// Records an entry of the source that cannot be taken in as it is (a name that is not
    /// UTF-8, an unreadable directory, an S3 key that is not a valid path) as a quarantined
    /// source file with `reason`, once: true when this call recorded it, false when it was
    /// recorded before (it is skipped on every pass until it is renamed or removed).
    pub async fn set_aside_entry(&self, uri: &str, reason: &str) -> Result<bool> {
        let f = self
            .register_file(&NewSourceFile {
                uri: uri.to_string(),
                size: 0,
                mtime_ms: 0,
                // Not the bytes' hash (they cannot be read as a file): one row per name.
                content_hash: format!("unread:{}", blake3::hash(uri.as_bytes()).to_hex()),
                format: None,
                change_token: None,
            })
            .await?;
        if f.state != FileState::Registered {
            return Ok(false);
        }
        self.quarantine_file(f.id, reason).await?;
        Ok(true)
    }

    /// Marks a source file as bad input that will not be chunked, with the reason.
    pub async fn quarantine_file(&self, file_id: i64, reason: &str) -> Result<()> {
        self.call("quarantine_file", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query("UPDATE source_files SET state = $3, error = $2 WHERE id = $1")
                    .bind(file_id)
                    .bind(crate::text(reason))
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
