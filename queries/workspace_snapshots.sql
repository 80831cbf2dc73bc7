-- name: SnapshotListByThread :many
SELECT * FROM workspace_snapshots
WHERE thread_id = @thread_id AND turn > @after_turn
ORDER BY turn
LIMIT @max_rows;
