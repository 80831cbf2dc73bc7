-- name: SnapshotListByThread :many
SELECT * FROM workspace_snapshots
WHERE thread_id = @thread_id AND turn > @after_turn
ORDER BY turn
LIMIT @max_rows;

-- name: SnapshotForTurn :one
-- The snapshot that applies to a turn: the latest stored at or before it.
SELECT * FROM workspace_snapshots
WHERE thread_id = @thread_id AND turn <= @turn
ORDER BY turn DESC
LIMIT 1;

-- name: SnapshotPrune :execrows
-- HISTORY_RETENTION: snapshots older than the cutoff, but each thread's last (the workspace of
-- its later turns) and those another transaction holds (as EventPrune).
DELETE FROM workspace_snapshots
WHERE (thread_id, turn) IN (
    SELECT o.thread_id, o.turn FROM workspace_snapshots o
    WHERE o.created_at < @cutoff
      AND EXISTS (SELECT 1 FROM workspace_snapshots n WHERE n.thread_id = o.thread_id AND n.turn > o.turn)
    FOR UPDATE OF o SKIP LOCKED);
