-- name: PreferenceListByThread :many
-- A thread's preferences in creation order: a preference's index is its position here.
SELECT * FROM preferences WHERE thread_id = @thread_id ORDER BY id;

-- name: PreferenceInsertBatch :many
-- Inserts preferences with the ids given (taken from threads.next_preference_id under the
-- thread lock) and moves the thread's counter past them; each with its source (docs/spec.md §19).
WITH bump AS (
    UPDATE threads SET next_preference_id = @next_preference_id::bigint WHERE id = @thread_id::text
)
INSERT INTO preferences (thread_id, id, title, subtitle, kind, locked, source)
SELECT @thread_id::text, u.id, u.title, u.subtitle, u.kind, u.locked, u.source
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@titles::text[]) AS title,
             unnest(@subtitles::text[]) AS subtitle, unnest(@kinds::text[]) AS kind,
             unnest(@locks::boolean[]) AS locked, unnest(@sources::text[]) AS source) u
ORDER BY u.id
RETURNING *;

-- name: PreferenceUpdateUnlocked :many
-- The agent path: sets title, subtitle and kind of the given preferences, and the source of those
-- whose fields change, never raised (source_lower, db/schema/2_workspace.sql). A locked row is
-- never changed, whatever the caller checked before.
UPDATE preferences p
SET title = u.title, subtitle = u.subtitle, kind = u.kind, updated_at = now(),
    source = CASE WHEN (p.title, p.subtitle, p.kind) IS NOT DISTINCT FROM (u.title, u.subtitle, u.kind) THEN p.source
                  ELSE source_lower(p.source, u.source) END
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@titles::text[]) AS title,
             unnest(@subtitles::text[]) AS subtitle, unnest(@kinds::text[]) AS kind,
             unnest(@sources::text[]) AS source) u
WHERE p.thread_id = @thread_id AND p.id = u.id AND NOT p.locked
RETURNING p.id;

-- name: PreferenceDeleteUnlocked :many
-- The agent path: deletes the given preferences. A locked row is never deleted.
DELETE FROM preferences
WHERE thread_id = @thread_id AND id = ANY(@ids::bigint[]) AND NOT locked
RETURNING id;

-- name: PreferenceUpdate :one
-- The user path: any preference, locked or not.
UPDATE preferences
SET title = @title, subtitle = @subtitle, kind = @kind, locked = @locked, source = @source, updated_at = now()
WHERE thread_id = @thread_id AND id = @id
RETURNING *;

-- name: PreferenceDelete :execrows
-- The user path: any preference, locked or not.
DELETE FROM preferences WHERE thread_id = @thread_id AND id = @id;
