-- name: LinkInsert :one
-- Issues a token of the thread (the thread must exist), and removes the thread's expired ones.
WITH expired AS (
    DELETE FROM links WHERE thread_id = @thread_id AND expires_at <= now()
)
INSERT INTO links (thread_id, kind, expires_at) VALUES (@thread_id, @kind, @expires_at)
RETURNING *;

-- name: LinkListByThread :many
-- The thread's tokens that have not expired, oldest first, after the cursor (none: 0).
SELECT * FROM links
WHERE thread_id = @thread_id AND id > @after_id AND expires_at > now()
ORDER BY id
LIMIT @max_rows;

-- name: LinkDelete :execrows
-- Revokes a token.
DELETE FROM links WHERE thread_id = @thread_id AND id = @id;

-- name: LinkValid :one
-- Whether a token of this kind is still valid: issued, neither revoked nor expired.
SELECT EXISTS (
    SELECT 1 FROM links WHERE thread_id = @thread_id AND id = @id AND kind = @kind AND expires_at > now()
) AS valid;
