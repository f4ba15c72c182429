-- Store outages: a store (staging, destination, the ledger) that fails every chunk a stage
-- sends to it while none succeeds is down, not each chunk broken. The stage records the outage
-- once here, stops claiming work for that store, probes it with capped backoff, and closes the
-- row when a probe gets through. Attempts spent during an outage do not count toward
-- max_attempts. Keep in step with the other migration set.
CREATE TABLE IF NOT EXISTS outages (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    store         TEXT    NOT NULL,   -- e.g. 'destination s3://warehouse/ferry'
    stage         TEXT    NOT NULL CHECK (stage IN ('transform', 'copy', 'load')),
    started_at    INTEGER NOT NULL,
    ended_at      INTEGER,
    probes        INTEGER NOT NULL DEFAULT 0,
    last_probe_at INTEGER,
    last_error    TEXT
);
-- One open outage per store and stage: a second worker that finds the store down joins it.
CREATE UNIQUE INDEX IF NOT EXISTS outages_open ON outages (store, stage) WHERE ended_at IS NULL;

CREATE VIEW open_outages AS
SELECT id, store, stage, started_at, probes, last_probe_at, last_error
FROM outages WHERE ended_at IS NULL;
