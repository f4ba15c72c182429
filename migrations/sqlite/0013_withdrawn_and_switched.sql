-- Withdrawn chunks and switched versions. Keep in step with the other backend's
-- 0013_withdrawn_and_switched.sql.
--
-- A load that finds its chunk superseded (a newer version of the file is in the table)
-- withdraws it: it removes the chunk's landed files and any part of it in the table that no
-- row names. It first records that here, in the transaction that checks the chunk is still
-- superseded. Should the chunk's bytes come back as the newest version (a correction undone),
-- the revert then knows the chunk's landed files may be gone and sends it through transform
-- again, even when its load ended part-way (retryable), not only when it finished.
ALTER TABLE chunks ADD COLUMN withdrawn_at BIGINT;

-- When a load of the version last recorded its chunk (with `versions = "replace"`). A version
-- with no rows at all (an empty file, or records all rejected) has nothing in `published`; it
-- is in the table once one of its loads recorded it (and so removed the versions before it).
-- Until now that was read from its load tasks (all copied, none quarantined), which flipped
-- back when such a load was quarantined later, and older versions' chunks then went back in.
ALTER TABLE source_files ADD COLUMN switched_at BIGINT;
UPDATE source_files SET switched_at = 0
WHERE EXISTS (SELECT 1 FROM chunks c WHERE c.file_id = source_files.id)
  AND NOT EXISTS (SELECT 1 FROM chunks c JOIN parts q ON q.chunk_id = c.id WHERE c.file_id = source_files.id)
  AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.file_id = source_files.id
                  AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.chunk_id = c.id AND t.stage = 'load' AND t.state = 'done'));

INSERT INTO ledger_compat (version, oldest_binary, note) VALUES
    (13, 13, 'a version with no rows is in the table once recorded (source_files.switched_at), which older binaries do not write')
ON CONFLICT (version) DO NOTHING;
