-- name: ObjectiveGet :one
SELECT * FROM objectives WHERE thread_id = @thread_id;

-- name: ObjectiveUpsert :one
-- Sets the objective and its source, and returns the text and source it had before ('' for
-- none): the change's event. The agent's never raises the source, and leaves it as it was when the
-- text does not change (source_lower, db/schema/2_workspace.sql); the user path sets it.
WITH prev AS (
    SELECT text, source FROM objectives WHERE thread_id = @thread_id
)
INSERT INTO objectives (thread_id, text, updated_by, source) VALUES (@thread_id, @text, @updated_by, @source)
ON CONFLICT (thread_id) DO UPDATE
SET text = EXCLUDED.text, updated_by = EXCLUDED.updated_by, updated_at = now(),
    source = CASE WHEN EXCLUDED.updated_by = 'user' THEN EXCLUDED.source
                  WHEN objectives.text = EXCLUDED.text THEN objectives.source
                  ELSE source_lower(objectives.source, EXCLUDED.source) END
RETURNING objectives.text, objectives.updated_by, objectives.updated_at, coalesce((SELECT text FROM prev), '')::text AS previous,
          coalesce((SELECT source FROM prev), '')::text AS previous_source;

-- name: ObjectiveDelete :execrows
-- A revert to no objective.
DELETE FROM objectives WHERE thread_id = @thread_id;
