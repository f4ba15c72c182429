//! Store outages as the ledger records them: one row per outage of a store as a stage sees it,
//! opened when the stage finds the store down, probed, and closed when it answers again.
//! Several workers that find the same store down share the open row (a partial unique index).

use crate::backend::{Backend, Begin};
use crate::state::Stage;
use crate::{Ledger, Result, db};

/// One row of the `open_outages` view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    pub id: i64,
    pub store: String,
    pub stage: Stage,
    pub started_at: i64,
    pub probes: i64,
    pub last_probe_at: Option<i64>,
    pub last_error: Option<String>,
}

from_row!(Outage { id, store, stage: String, started_at, probes, last_probe_at, last_error });

impl Ledger {
    /// Records that `store` is down for `stage`; returns whether this call opened the outage
    /// (false: another worker already had).
    pub async fn outage_open(&self, store: &str, stage: Stage, error: &str) -> Result<bool> {
        let now = self.now_ms();
        self.call("outage_open", || async move {
            on_backend!(self, |pool, begin| {
                let n = sqlx::query(
                    "INSERT INTO outages (store, stage, started_at, last_error, pipeline) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (pipeline, store, stage) WHERE ended_at IS NULL DO NOTHING",
                )
                .bind(store)
                .bind(stage.as_str())
                .bind(now)
                .bind(crate::text(error))
                .bind(self.pipeline())
                .execute(pool)
                .await
                .map_err(db("outage_open"))?
                .rows_affected();
                Ok(n == 1)
            })
        })
        .await
    }

    /// Counts a probe of a store that is still down, with what it answered.
    pub async fn outage_probe(&self, store: &str, stage: Stage, error: &str) -> Result<()> {
        let now = self.now_ms();
        self.call("outage_probe", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query(
                    "UPDATE outages SET probes = probes + 1, last_probe_at = $3, last_error = $4
                     WHERE store = $1 AND stage = $2 AND ended_at IS NULL AND pipeline = $5",
                )
                .bind(store)
                .bind(stage.as_str())
                .bind(now)
                .bind(crate::text(error))
                .bind(self.pipeline())
                .execute(pool)
                .await
                .map_err(db("outage_probe"))?;
                Ok(())
            })
        })
        .await
    }

    /// Closes the open outages of `store`, every stage's: it answers, whoever opened them (a
    /// process that exited while it was down, or whose close failed, leaves them to the next
    /// one that sees it work). Returns whether there was one.
    pub async fn outage_close(&self, store: &str) -> Result<bool> {
        let now = self.now_ms();
        self.call("outage_close", || async move {
            on_backend!(self, |pool, begin| {
                let n = sqlx::query("UPDATE outages SET ended_at = $2 WHERE store = $1 AND ended_at IS NULL AND pipeline = $3")
                    .bind(store)
                    .bind(now)
                    .bind(self.pipeline())
                    .execute(pool)
                    .await
                    .map_err(db("outage_close"))?
                    .rows_affected();
                Ok(n > 0)
            })
        })
        .await
    }

    /// Records an outage that is already over: one the stage could not write while it lasted
    /// (the ledger's own).
    pub async fn outage_recorded(&self, store: &str, stage: Stage, started_at: i64, ended_at: i64, probes: i64, error: &str) -> Result<()> {
        self.call("outage_recorded", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query(
                    "INSERT INTO outages (store, stage, started_at, ended_at, probes, last_probe_at, last_error, pipeline)
                     VALUES ($1, $2, $3, $4, $5, $4, $6, $7)",
                )
                .bind(store)
                .bind(stage.as_str())
                .bind(started_at)
                .bind(ended_at)
                .bind(probes)
                .bind(crate::text(error))
                .bind(self.pipeline())
                .execute(pool)
                .await
                .map_err(db("outage_recorded"))?;
                Ok(())
            })
        })
        .await
    }

    /// This pipeline's outages not over yet, oldest first.
    pub async fn open_outages(&self) -> Result<Vec<Outage>> {
        self.call("open_outages", || async move {
            on_backend!(self, |pool, begin| {
                sqlx::query_as(
                    "SELECT id, store, stage, started_at, probes, last_probe_at, last_error FROM open_outages
                     WHERE pipeline = $1 ORDER BY started_at, id",
                )
                .bind(self.pipeline())
                .fetch_all(pool)
                .await
                .map_err(db("open_outages"))
            })
        })
        .await
    }

    /// Gives back the attempts of tasks that failed just before their store was found down
    /// (they are `retryable` at the epoch that failed): those failures were the outage's.
    pub async fn refund_attempts(&self, tasks: &[(i64, i64)]) -> Result<u64> {
        if tasks.is_empty() {
            return Ok(0);
        }
        self.call("refund_attempts", || async move {
            on_backend!(self, |pool, begin| {
                let op = "refund_attempts";
                let (_write, mut tx) = write_tx!(self, pool, begin, op);
                let mut n = 0;
                for (id, epoch) in tasks {
                    n += sqlx::query("UPDATE tasks SET attempt = attempt - 1 WHERE id = $1 AND epoch = $2 AND state = $3 AND attempt > 0")
                        .bind(id)
                        .bind(epoch)
                        .bind(crate::TaskState::Retryable.as_str())
                        .execute(&mut *tx)
                        .await
                        .map_err(db(op))?
                        .rows_affected();
                }
                tx.commit().await.map_err(db(op))?;
                Ok(n)
            })
        })
        .await
    }
}
