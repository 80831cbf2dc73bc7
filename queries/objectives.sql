-- name: ObjectiveGet :one
SELECT * FROM objectives WHERE thread_id = @thread_id;

-- name: ObjectiveUpsert :one
-- Sets the objective, and returns the text it had before ('' for none): the change's event.
WITH prev AS (
    SELECT text FROM objectives WHERE thread_id = @thread_id
)
INSERT INTO objectives (thread_id, text, updated_by) VALUES (@thread_id, @text, @updated_by)
ON CONFLICT (thread_id) DO UPDATE
SET text = EXCLUDED.text, updated_by = EXCLUDED.updated_by, updated_at = now()
RETURNING objectives.text, objectives.updated_by, objectives.updated_at, coalesce((SELECT text FROM prev), '')::text AS previous;

-- name: ObjectiveDelete :execrows
-- A revert to no objective.
DELETE FROM objectives WHERE thread_id = @thread_id;
