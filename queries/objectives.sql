-- name: ObjectiveGet :one
SELECT * FROM objectives WHERE thread_id = @thread_id;

-- name: ObjectiveUpsert :one
INSERT INTO objectives (thread_id, text, updated_by) VALUES (@thread_id, @text, @updated_by)
ON CONFLICT (thread_id) DO UPDATE
SET text = EXCLUDED.text, updated_by = EXCLUDED.updated_by, updated_at = now()
RETURNING *;
