-- name: TurnStart :one
-- Begins a turn of a thread (turn_start, migrations 005, 006 and 012): the thread created on its
-- first turn, its next turn number, and the workspace as it stood, its ancestors' included,
-- snapshotted under that number when it changed since the last snapshot; when the thread was
-- created; the review setting in force. Parents, when given, are stored first (parents_if_new:
-- only on the thread's first turn); a list it refuses begins no turn (turn 0, refused why).
-- Commits without waiting for the disk.
SELECT coalesce(turn, 0)::integer AS turn, objective, preferences, coalesce(created_at, now())::timestamptz AS created_at,
       inherited, coalesce(agent_writes, 'direct')::text AS agent_writes, coalesce(refused, '')::text AS refused
FROM turn_start(@thread_id, sqlc.narg(parents)::text[], @parents_if_new::boolean);

-- name: TurnStartUnlessHeld :one
-- TurnStart, unless another transaction holds the thread's row (turn_start_unless_held,
-- migrations 011 and 012): then turn 0, at once, and nothing begun (turns count from 1).
-- A turn of a thread that has a snapshot of its workspace as it stands, and no ancestors, is
-- begun by this statement itself ("fast": the thread's row locked unless held, its turn counted,
-- the snapshot read): what turn_start would do and return, without its PL/pgSQL statements;
-- turn_start_unless_held runs only when it did not (a new thread, parents to store, a changed
-- workspace, ancestors, a held row). Either way the commit does not wait for the disk
-- (synchronous_commit, set when the row is found).
WITH free AS (
    SELECT t.id FROM threads t
    WHERE t.id = @thread_id AND set_config('synchronous_commit', 'off', true) = 'off'
    FOR NO KEY UPDATE SKIP LOCKED
), fast AS (
    UPDATE threads th SET turns = th.turns + 1,
        updated_at = CASE WHEN th.updated_at < now() - interval '1 second' THEN now() ELSE th.updated_at END
    FROM (SELECT s.version, s.scope_versions, s.objective, s.preferences, s.inherited
          FROM workspace_snapshots s WHERE s.thread_id = @thread_id ORDER BY s.turn DESC LIMIT 1) s
    WHERE th.id = @thread_id AND EXISTS (SELECT FROM free) AND cardinality(th.parents) = 0
      AND s.version = th.next_event_id AND coalesce(s.scope_versions, '{}') = '{}'
      AND (sqlc.narg(parents)::text[] IS NULL OR @parents_if_new::boolean OR cardinality(sqlc.narg(parents)::text[]) = 0)
    RETURNING th.turns, s.objective, s.preferences, th.created_at, s.inherited, th.agent_writes
)
SELECT f.turns::integer AS turn, f.objective, f.preferences, f.created_at::timestamptz AS created_at,
       f.inherited, coalesce(f.agent_writes, 'direct')::text AS agent_writes, ''::text AS refused
FROM fast f
UNION ALL
SELECT coalesce(u.turn, 0)::integer, u.objective, u.preferences, coalesce(u.created_at, now())::timestamptz,
       u.inherited, coalesce(u.agent_writes, 'direct')::text, coalesce(u.refused, '')::text
FROM turn_start_unless_held(@thread_id, sqlc.narg(parents)::text[], @parents_if_new::boolean) u
WHERE NOT EXISTS (SELECT FROM fast);

-- name: ThreadLock :one
-- Locks an existing thread's row for the rest of the transaction. Every write to a thread's
-- workspace takes this lock first, so agent and user edits of one thread never interleave.
SELECT next_preference_id, created_at FROM threads WHERE id = @id FOR UPDATE;

-- name: ThreadLockTouch :one
-- Locks an existing thread's row and marks it updated (a user edit).
UPDATE threads SET updated_at = now() WHERE id = @id RETURNING next_preference_id, created_at;

-- name: ThreadUpsertTouch :one
-- Creates the thread when new, else marks it updated; either way the row stays locked. A thread
-- it creates takes its counters past a tombstone of its id by the statement after it
-- (ThreadRevive).
INSERT INTO threads AS th (id) VALUES (@id)
ON CONFLICT (id) DO UPDATE SET updated_at = now()
RETURNING th.next_preference_id, th.created_at;

-- name: ThreadRevive :one
-- Moves the thread's counters past its id's tombstone, if any (thread_revive, migration 006),
-- and returns its next preference id.
SELECT next_preference_id FROM thread_revive(@id);

-- name: ThreadGet :one
SELECT * FROM threads WHERE id = @id;

-- name: ThreadList :many
-- Threads whose id starts with prefix, most recently updated first, after the cursor: the
-- updated_at and id of the last thread of the previous page (after_id '' for none, from the
-- top). A cursor without its updated_at (a bare thread id) takes that thread's current one.
SELECT t.id, t.created_at, t.updated_at, t.turns, o.text AS objective,
       (SELECT count(*) FROM preferences p WHERE p.thread_id = t.id)::bigint AS preference_count
FROM threads t
LEFT JOIN objectives o ON o.thread_id = t.id
WHERE left(t.id, length(@prefix::text)) = @prefix::text
  AND (@after_id::text = ''
   OR (t.updated_at, t.id) < (coalesce(sqlc.narg(after_updated_at)::timestamptz,
                                       (SELECT c.updated_at FROM threads c WHERE c.id = @after_id::text)), @after_id::text))
ORDER BY t.updated_at DESC, t.id DESC
LIMIT @max_rows;

-- name: ThreadSummary :one
-- One thread as the listing shows it.
SELECT t.id, t.created_at, t.updated_at, t.turns, o.text AS objective,
       (SELECT count(*) FROM preferences p WHERE p.thread_id = t.id)::bigint AS preference_count
FROM threads t
LEFT JOIN objectives o ON o.thread_id = t.id
WHERE t.id = @id;

-- name: ThreadDelete :execrows
-- Erases the thread and everything of it, and leaves a tombstone of its counters: a thread
-- created again under its id never takes an event or preference id it had.
WITH gone AS (
    DELETE FROM threads WHERE id = @id RETURNING id, next_event_id, next_preference_id
)
INSERT INTO thread_tombstones AS d (thread_id, next_event_id, next_preference_id)
SELECT id, next_event_id, next_preference_id FROM gone
ON CONFLICT (thread_id) DO UPDATE
SET next_event_id = greatest(d.next_event_id, excluded.next_event_id),
    next_preference_id = greatest(d.next_preference_id, excluded.next_preference_id);

-- name: ThreadUsageAdd :exec
-- Adds a batch of turns' usage to its thread's totals once: only when the batch moves its
-- writer's mark on the thread (usage_batches), so that the batch sent again after a lost answer
-- adds nothing; other writers' marks unmoved for a week go. Commits without waiting for the disk
-- (synchronous_commit off, for this statement's transaction alone; db.AddUsage pipelines one per
-- thread). A thread that does not exist is skipped. The totals saturate at bigint's bounds, as the
-- sums of tools.AddTokens do.
WITH mark AS (
    INSERT INTO usage_batches AS m (thread_id, writer_id, batch)
    SELECT t.id, @writer_id::text, @batch::bigint FROM threads t WHERE t.id = @id
    ON CONFLICT (thread_id, writer_id) DO UPDATE SET batch = excluded.batch, at = now()
    WHERE m.batch < excluded.batch
    RETURNING 1
), stale AS (
    DELETE FROM usage_batches s
    WHERE s.thread_id = @id AND s.writer_id <> @writer_id::text AND s.at < now() - interval '7 days'
)
UPDATE threads
SET prompt_tokens = LEAST(GREATEST(prompt_tokens::numeric + @prompt_tokens::bigint, -9223372036854775808), 9223372036854775807)::bigint,
    cached_prompt_tokens = LEAST(GREATEST(cached_prompt_tokens::numeric + @cached_prompt_tokens::bigint, -9223372036854775808), 9223372036854775807)::bigint,
    completion_tokens = LEAST(GREATEST(completion_tokens::numeric + @completion_tokens::bigint, -9223372036854775808), 9223372036854775807)::bigint,
    cache_write_tokens = LEAST(GREATEST(cache_write_tokens::numeric + @cache_write_tokens::bigint, -9223372036854775808), 9223372036854775807)::bigint
FROM (SELECT set_config('synchronous_commit', 'off', true)) async
WHERE threads.id = @id AND EXISTS (SELECT FROM mark);

-- name: ThreadScopeGet :one
-- A thread's parents, its own review setting, and its place among its scopes: its ancestors
-- (nearest first), what they hold, and the review setting in force (thread_scope, migration 012).
SELECT threads.parents, threads.agent_writes AS own_agent_writes, s.ancestors::text[] AS ancestors,
       s.agent_writes::text AS agent_writes, thread_inherited(s.ancestors) AS inherited
FROM threads, thread_scope(threads.id, threads.parents, threads.agent_writes) s
WHERE threads.id = @id;

-- name: ThreadAncestorVersions :one
-- A thread's ancestors (nearest first) and their versions (next_event_id, 0 for one that does not
-- exist), as a turn would read them (thread_scope, migration 012): what a live view of the thread
-- watches besides the thread itself.
SELECT s.ancestors::text[] AS ancestors, s.versions::bigint[] AS versions
FROM threads, thread_scope(threads.id, threads.parents, threads.agent_writes) s
WHERE threads.id = @id;

-- name: ThreadSetParents :one
-- Stores a thread's parents as thread_set_parents says (migration 012); the caller holds the
-- thread's row lock. Returns why a list is refused, '' when it was stored or unchanged.
SELECT coalesce(thread_set_parents(@id, @parents::text[], @actor::text, @via::text), '')::text AS refused;

-- name: ThreadSetAgentWrites :exec
-- Sets a thread's own review setting (NULL: inherited); the caller holds the row lock and
-- appends the event.
UPDATE threads SET agent_writes = sqlc.narg(agent_writes)::text, updated_at = now() WHERE id = @id;

-- name: ThreadChildren :many
-- The threads that name a thread among their parents, by id, after the cursor ('' none).
SELECT id FROM threads WHERE parents @> ARRAY[@id::text] AND id > @after_id::text ORDER BY id LIMIT @max_rows;

-- name: TurnUndo :exec
-- Gives back a turn that never reached its model (turn_undo, migration 014): its number, its
-- snapshot, and the thread when the turn made it and nothing was written to it since.
SELECT turn_undo(@thread_id::text, @turn::integer);
