-- name: SnapshotTake :one
-- Reads a thread's workspace at the start of its current turn and stores it under the turn's
-- number when it differs from the last snapshot stored (a snapshot applies from its turn until
-- the next one stored). Run after ThreadTurnNext in the same transaction: with the thread's row
-- locked, this statement sees every change committed before the turn, and no other.
WITH t AS (
    SELECT turns FROM threads WHERE id = @thread_id::text
), o AS (
    SELECT text FROM objectives WHERE thread_id = @thread_id::text
), p AS (
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', id, 'title', title, 'subtitle', subtitle, 'kind', kind, 'locked', locked)
               ORDER BY id), '[]'::jsonb)::jsonb AS prefs
    FROM preferences WHERE thread_id = @thread_id::text
), last AS (
    SELECT objective, preferences FROM workspace_snapshots
    WHERE thread_id = @thread_id::text ORDER BY turn DESC LIMIT 1
), s AS (
    INSERT INTO workspace_snapshots (thread_id, turn, objective, preferences)
    SELECT @thread_id::text, t.turns, (SELECT text FROM o), p.prefs FROM t, p
    WHERE NOT EXISTS (
        SELECT 1 FROM last
        WHERE last.objective IS NOT DISTINCT FROM (SELECT text FROM o) AND last.preferences = p.prefs)
    RETURNING turn
)
SELECT t.turns AS turn, o.text AS objective, p.prefs AS preferences FROM t CROSS JOIN p LEFT JOIN o ON true;

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
-- its later turns).
DELETE FROM workspace_snapshots s
WHERE s.created_at < @cutoff
  AND EXISTS (SELECT 1 FROM workspace_snapshots n WHERE n.thread_id = s.thread_id AND n.turn > s.turn);
