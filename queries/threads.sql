-- name: TurnStart :one
-- Begins a turn of a thread (turn_start, db/schema/4_turns.sql): the thread created on its first
-- turn, its next turn number, and the workspace as it stood, its ancestors' included,
-- snapshotted under that number when it changed since the last snapshot; when the thread was
-- created; the review setting in force. Parents, when given, are stored first (parents_if_new:
-- only on the thread's first turn); a list it refuses begins no turn (turn 0, refused why).
-- Commits without waiting for the disk. version is the workspace's (the thread's next_event_id
-- as it was read) and next_preference_id the thread's, which the turn's first call is planned on
-- (ToolCallGuard; 0 with no turn). reads_untrusted and has_client_tools are what the request
-- holds (docs/spec.md §19), stored when they make the thread tainted or a client of its own
-- tools; tainted and client_tools are what the thread had before; objective_source the
-- objective's source ('' none).
SELECT coalesce(turn, 0)::integer AS turn, objective, preferences, coalesce(created_at, now())::timestamptz AS created_at,
       inherited, coalesce(agent_writes, 'direct')::text AS agent_writes, coalesce(refused, '')::text AS refused,
       coalesce(version, 0)::bigint AS version, coalesce(next_preference_id, 0)::bigint AS next_preference_id,
       coalesce(objective_source, '')::text AS objective_source, coalesce(thread_tainted, false)::boolean AS tainted,
       coalesce(thread_client_tools, false)::boolean AS client_tools
FROM turn_start(@thread_id, sqlc.narg(parents)::text[], @parents_if_new::boolean, @reads_untrusted::boolean, @has_client_tools::boolean);

-- name: TurnStartUnlessHeld :one
-- TurnStart, unless another transaction holds the thread's row (turn_start_unless_held,
-- db/schema/4_turns.sql): then turn 0, at once, and nothing begun (turns count from 1). A turn
-- of a thread that has a snapshot of its workspace as it stands, and no ancestors, is begun by
-- this statement itself ("fast": the thread's row locked unless held, its turn counted and its
-- taint stored, the snapshot read): what turn_start_with (db/schema/4_turns.sql) would do and
-- return in that case, without its PL/pgSQL statements, and what a change of it changes here
-- too; turn_start_unless_held runs only when it did not (a new thread, parents to store, a
-- changed workspace, ancestors, a held row). Either way the commit does not wait for
-- the disk (synchronous_commit, set when the row is found).
WITH free AS (
    SELECT t.id, t.tainted, t.client_tools FROM threads t
    WHERE t.id = @thread_id AND set_config('synchronous_commit', 'off', true) = 'off'
    FOR NO KEY UPDATE SKIP LOCKED
), fast AS (
    UPDATE threads th SET turns = th.turns + 1,
        updated_at = CASE WHEN th.updated_at < now() - interval '1 second' THEN now() ELSE th.updated_at END,
        tainted = th.tainted OR @reads_untrusted::boolean, client_tools = th.client_tools OR @has_client_tools::boolean
    FROM (SELECT s.version, s.scope_versions, s.objective, s.objective_source, s.preferences, s.inherited
          FROM workspace_snapshots s WHERE s.thread_id = @thread_id ORDER BY s.turn DESC LIMIT 1) s, free f
    WHERE th.id = @thread_id AND cardinality(th.parents) = 0
      AND s.version = th.next_event_id AND coalesce(s.scope_versions, '{}') = '{}'
      AND (sqlc.narg(parents)::text[] IS NULL OR @parents_if_new::boolean OR cardinality(sqlc.narg(parents)::text[]) = 0)
    RETURNING th.turns, s.objective, s.preferences, th.created_at, s.inherited, th.agent_writes, th.next_event_id, th.next_preference_id,
              s.objective_source, f.tainted, f.client_tools
)
SELECT f.turns::integer AS turn, f.objective, f.preferences, f.created_at::timestamptz AS created_at,
       f.inherited, coalesce(f.agent_writes, 'direct')::text AS agent_writes, ''::text AS refused,
       f.next_event_id::bigint AS version, f.next_preference_id::bigint AS next_preference_id,
       coalesce(f.objective_source, '')::text AS objective_source, f.tainted::boolean AS tainted, f.client_tools::boolean AS client_tools
FROM fast f
UNION ALL
SELECT coalesce(u.turn, 0)::integer, u.objective, u.preferences, coalesce(u.created_at, now())::timestamptz,
       u.inherited, coalesce(u.agent_writes, 'direct')::text, coalesce(u.refused, '')::text,
       coalesce(u.version, 0)::bigint, coalesce(u.next_preference_id, 0)::bigint,
       coalesce(u.objective_source, '')::text, coalesce(u.thread_tainted, false)::boolean, coalesce(u.thread_client_tools, false)::boolean
FROM turn_start_unless_held(@thread_id, sqlc.narg(parents)::text[], @parents_if_new::boolean, @reads_untrusted::boolean,
                            @has_client_tools::boolean) u
WHERE NOT EXISTS (SELECT FROM fast);

-- name: TurnStartsUnlessHeld :many
-- TurnStartUnlessHeld for each thread of a batch (db.TurnStarts), in one statement: the same fast
-- part, for all of them at once, and turn_start_unless_held for each of the others, in id order.
-- starts is a JSON array of one object a thread, distinct and in id order: its id, its parents
-- (null, or an array of ids), parents_if_new, reads_untrusted and has_client_tools; one row a
-- thread, ord its place in starts (from 1). The rows of the threads that exist are locked in id
-- order, those held skipped. The batch is one JSON value, not arrays, so that the plan Postgres
-- keeps for the statement serves every batch: it plans an array's statement anew for each batch
-- shorter than its estimate for an array (a third of a millisecond each, here). For one thread,
-- TurnStartUnlessHeld costs Postgres less (57 against 82 µs).
WITH req AS (
    SELECT e.ord, e.value->>'id' AS id, coalesce((e.value->>'parents_if_new')::boolean, false) AS parents_if_new,
           CASE WHEN jsonb_typeof(e.value->'parents') = 'array'
                THEN ARRAY(SELECT jsonb_array_elements_text(e.value->'parents')) END AS parents,
           coalesce((e.value->>'reads_untrusted')::boolean, false) AS reads_untrusted,
           coalesce((e.value->>'has_client_tools')::boolean, false) AS has_client_tools
    FROM jsonb_array_elements(@starts::jsonb) WITH ORDINALITY AS e(value, ord)
), free AS (
    SELECT t.id, t.tainted, t.client_tools FROM threads t
    WHERE t.id IN (SELECT q.id FROM req q) AND set_config('synchronous_commit', 'off', true) = 'off'
    ORDER BY t.id
    FOR NO KEY UPDATE SKIP LOCKED
), fast AS (
    UPDATE threads th SET turns = th.turns + 1,
        updated_at = CASE WHEN th.updated_at < now() - interval '1 second' THEN now() ELSE th.updated_at END,
        tainted = th.tainted OR r.reads_untrusted, client_tools = th.client_tools OR r.has_client_tools
    FROM free f
    JOIN req r ON r.id = f.id
    CROSS JOIN LATERAL (SELECT s.version, s.scope_versions, s.objective, s.objective_source, s.preferences, s.inherited
          FROM workspace_snapshots s WHERE s.thread_id = f.id ORDER BY s.turn DESC LIMIT 1) s
    WHERE th.id = f.id AND cardinality(th.parents) = 0
      AND s.version = th.next_event_id AND coalesce(s.scope_versions, '{}') = '{}'
      AND (r.parents IS NULL OR r.parents_if_new OR cardinality(r.parents) = 0)
    RETURNING th.id, th.turns, s.objective, s.preferences, th.created_at, s.inherited, th.agent_writes, th.next_event_id, th.next_preference_id,
              s.objective_source, f.tainted, f.client_tools
)
SELECT r.ord::integer AS ord, f.turns::integer AS turn, f.objective, f.preferences, f.created_at::timestamptz AS created_at,
       f.inherited, coalesce(f.agent_writes, 'direct')::text AS agent_writes, ''::text AS refused,
       f.next_event_id::bigint AS version, f.next_preference_id::bigint AS next_preference_id,
       coalesce(f.objective_source, '')::text AS objective_source, f.tainted::boolean AS tainted, f.client_tools::boolean AS client_tools
FROM req r JOIN fast f ON f.id = r.id
UNION ALL
SELECT r.ord::integer, coalesce(u.turn, 0)::integer, u.objective, u.preferences, coalesce(u.created_at, now())::timestamptz,
       u.inherited, coalesce(u.agent_writes, 'direct')::text, coalesce(u.refused, '')::text,
       coalesce(u.version, 0)::bigint, coalesce(u.next_preference_id, 0)::bigint,
       coalesce(u.objective_source, '')::text, coalesce(u.thread_tainted, false)::boolean, coalesce(u.thread_client_tools, false)::boolean
FROM req r CROSS JOIN LATERAL turn_start_unless_held(r.id, r.parents, r.parents_if_new, r.reads_untrusted, r.has_client_tools) u
WHERE r.id NOT IN (SELECT f.id FROM fast f);

-- name: ThreadLock :one
-- Locks an existing thread's row for the rest of the transaction. Every write to a thread's
-- workspace takes this lock first, so agent and user edits of one thread never interleave. The
-- lock is the one an update of the row takes (FOR NO KEY UPDATE): it waits for another writer,
-- a turn's start and the thread's deletion, not for a foreign key's check of a row that names
-- the thread (a batch of usage). Returns its counters, its workspace's version (next_event_id)
-- and its objective ('' none) with its source ('' none).
SELECT t.next_preference_id, t.created_at, t.next_event_id,
       coalesce((SELECT o.text FROM objectives o WHERE o.thread_id = t.id), '')::text AS objective,
       coalesce((SELECT o.source FROM objectives o WHERE o.thread_id = t.id), '')::text AS objective_source
FROM threads t WHERE t.id = @id FOR NO KEY UPDATE OF t;

-- name: ThreadLockTouch :one
-- Locks an existing thread's row and marks it updated (a user edit); returns what ThreadLock does.
UPDATE threads t SET updated_at = now() WHERE t.id = @id
RETURNING t.next_preference_id, t.created_at, t.next_event_id,
          coalesce((SELECT o.text FROM objectives o WHERE o.thread_id = t.id), '')::text AS objective,
          coalesce((SELECT o.source FROM objectives o WHERE o.thread_id = t.id), '')::text AS objective_source;

-- name: ThreadUpsertTouch :one
-- Creates the thread when new, else marks it updated; either way the row stays locked. A thread
-- it creates takes its counters past a tombstone of its id by the statement after it
-- (ThreadRevive). Returns what ThreadLock does.
INSERT INTO threads AS th (id) VALUES (@id)
ON CONFLICT (id) DO UPDATE SET updated_at = now()
RETURNING th.next_preference_id, th.created_at, th.next_event_id,
          coalesce((SELECT o.text FROM objectives o WHERE o.thread_id = th.id), '')::text AS objective,
          coalesce((SELECT o.source FROM objectives o WHERE o.thread_id = th.id), '')::text AS objective_source;

-- name: ThreadRevive :one
-- Moves the thread's counters past its id's tombstone, if any (thread_revive,
-- db/schema/2_workspace.sql), and returns them.
SELECT next_preference_id, next_event_id FROM thread_revive(@id);

-- name: ToolCallGuard :one
-- The first statement of a turn's tool call sent in one round trip (docs/spec.md §5): it bounds
-- each of the transaction's later statements and waits by timeout (ms), locks the thread's row as
-- ThreadLock does and the rows the call rewrites (as CallRowsLock), and goes on only when the
-- thread is the one the turn began on (created_at) and its workspace is still at version: else
-- workspace_moved ends the transaction (SQLSTATE WS409) before the call's statements write
-- anything. It waits for none of those locks (NOWAIT: SQLSTATE 55P03, nothing written): the
-- call's commit goes out with it, so a call that waited would still commit once the lock came,
-- even after its replica had died.
SELECT CASE WHEN (SELECT t.next_event_id FROM threads t
                  WHERE t.id = @thread_id::text AND t.created_at = @created_at::timestamptz
                    AND set_config('lock_timeout', @timeout::text, true) IS NOT NULL
                    AND set_config('statement_timeout', @timeout::text, true) IS NOT NULL
                  FOR NO KEY UPDATE NOWAIT) = @version::bigint
             AND (SELECT count(*) FROM (SELECT FROM preferences p WHERE p.thread_id = @thread_id::text
                                        AND p.id = ANY(@rows::bigint[]) FOR UPDATE NOWAIT) l) >= 0
             AND (SELECT count(*) FROM (SELECT FROM objectives o WHERE o.thread_id = @thread_id::text
                                        AND @objective::boolean FOR UPDATE NOWAIT) m) >= 0
            THEN true ELSE workspace_moved(@thread_id::text) END::boolean AS current;

-- name: CallRowsLock :exec
-- Locks, in a tool call's transaction that holds the thread's row, the rows the call rewrites:
-- the preferences of ids rows, and the thread's objective when objective. It runs in a round trip
-- of its own, before the one that sends the call's statements with its commit: whatever lock it
-- waits for (only a session that does not lock the thread's row first can hold one), the commit
-- has not gone out, and a call whose replica dies meanwhile writes nothing.
SELECT (SELECT count(*) FROM (SELECT FROM preferences p WHERE p.thread_id = @thread_id::text
                              AND p.id = ANY(@rows::bigint[]) FOR UPDATE) l) AS preferences,
       (SELECT count(*) FROM (SELECT FROM objectives o WHERE o.thread_id = @thread_id::text
                              AND @objective::boolean FOR UPDATE) m) AS objectives;

-- name: ThreadGet :one
SELECT * FROM threads WHERE id = @id;

-- name: ThreadList :many
-- Threads whose id starts with prefix, most recently updated first, after the cursor: the
-- updated_at and id of the last thread of the previous page (after_id '' for none, from the
-- top). A cursor without its updated_at (a bare thread id) takes that thread's current one.
-- parent ('' none) keeps the threads that name it among their parents; search ('' none) those
-- whose id past the prefix, title, objective or first words hold it (case-insensitive). Each
-- with its labels (title, agent, first words), its parents, how many threads name it among theirs
-- (children: a scope has some) and how many proposals wait in it (no event answered them).
SELECT t.id, t.created_at, t.updated_at, t.turns, o.text AS objective,
       (SELECT count(*) FROM preferences p WHERE p.thread_id = t.id)::bigint AS preference_count,
       t.title, t.agent, t.first_words, t.parents,
       (SELECT count(*) FROM threads c WHERE c.parents @> ARRAY[t.id])::bigint AS children,
       (SELECT count(*) FROM events e
        WHERE e.thread_id = t.id AND (e.kind = 'proposed' OR (e.kind = 'locked_skip' AND e.proposed IS NOT NULL))
          AND NOT EXISTS (SELECT FROM events a WHERE a.thread_id = e.thread_id AND a.answers = e.id))::bigint AS pending_proposals
FROM threads t
LEFT JOIN objectives o ON o.thread_id = t.id
WHERE left(t.id, length(@prefix::text)) = @prefix::text
  AND (@parent::text = '' OR t.parents @> ARRAY[@parent::text])
  AND (@search::text = ''
       OR strpos(lower(substr(t.id, length(@prefix::text) + 1)), lower(@search::text)) > 0
       OR strpos(lower(coalesce(t.title, '')), lower(@search::text)) > 0
       OR strpos(lower(coalesce(o.text, '')), lower(@search::text)) > 0
       OR strpos(lower(coalesce(t.first_words, '')), lower(@search::text)) > 0)
  AND (@after_id::text = ''
   OR (t.updated_at, t.id) < (coalesce(sqlc.narg(after_updated_at)::timestamptz,
                                       (SELECT c.updated_at FROM threads c WHERE c.id = @after_id::text)), @after_id::text))
ORDER BY t.updated_at DESC, t.id DESC
LIMIT @max_rows;

-- name: ThreadSummary :one
-- One thread as the listing shows it.
SELECT t.id, t.created_at, t.updated_at, t.turns, o.text AS objective,
       (SELECT count(*) FROM preferences p WHERE p.thread_id = t.id)::bigint AS preference_count,
       t.title, t.agent, t.first_words, t.parents,
       (SELECT count(*) FROM threads c WHERE c.parents @> ARRAY[t.id])::bigint AS children,
       (SELECT count(*) FROM events e
        WHERE e.thread_id = t.id AND (e.kind = 'proposed' OR (e.kind = 'locked_skip' AND e.proposed IS NOT NULL))
          AND NOT EXISTS (SELECT FROM events a WHERE a.thread_id = e.thread_id AND a.answers = e.id))::bigint AS pending_proposals
FROM threads t
LEFT JOIN objectives o ON o.thread_id = t.id
WHERE t.id = @id;

-- name: ThreadSetTitle :execrows
-- Sets the user's name of a thread (NULL: none). Not the workspace: no event, and updated_at
-- stays.
UPDATE threads SET title = sqlc.narg(title)::text WHERE id = @id;

-- name: ThreadLabel :exec
-- Keeps what a thread's first turn said of it: its agent and its user's first words, each only
-- when none is kept yet.
UPDATE threads SET agent = coalesce(agent, sqlc.narg(agent)::text), first_words = coalesce(first_words, sqlc.narg(first_words)::text)
WHERE id = @id AND (agent IS NULL OR first_words IS NULL);

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
-- Adds a batch of turns' usage to its writer's totals of the thread once: only when the batch
-- moves that writer's batch number on (thread_usage, db/schema/1_tables.sql), so that the batch sent
-- again after a lost answer adds nothing. A writer's first batch for the thread (the only time
-- the thread gains a row) first folds other writers' rows unmoved for a week into the thread's
-- row (the only time it touches that row), unless another transaction holds the thread's row (an
-- edit, a tool call, a turn's start): then the batch waits for nothing, counts its usage in its
-- own row, and leaves the fold to the next writer new to the thread. Its later batches read
-- their own row alone, however many writers' rows the thread has (every run of a replica is a
-- writer). Commits without waiting for the disk (synchronous_commit off, for this statement's
-- transaction alone; db.AddUsage pipelines one per thread). A thread that does not exist is
-- skipped. The totals saturate at bigint's bounds, as the sums of tools.AddTokens do.
WITH free AS (
    SELECT t.id FROM threads t
    WHERE t.id = @id
      AND NOT EXISTS (SELECT FROM thread_usage m WHERE m.thread_id = @id AND m.writer_id = @writer_id::text)
      AND EXISTS (SELECT FROM thread_usage s WHERE s.thread_id = @id AND s.writer_id <> @writer_id::text AND s.at < now() - interval '7 days')
    FOR NO KEY UPDATE SKIP LOCKED
), stale AS (
    DELETE FROM thread_usage s
    WHERE s.thread_id = @id AND s.writer_id <> @writer_id::text AND s.at < now() - interval '7 days'
      AND EXISTS (SELECT FROM free)
    RETURNING s.prompt_tokens, s.cached_prompt_tokens, s.completion_tokens, s.cache_write_tokens
), folded AS (
    UPDATE threads t
    SET prompt_tokens = LEAST(GREATEST(t.prompt_tokens::numeric + f.prompt_tokens, -9223372036854775808), 9223372036854775807)::bigint,
        cached_prompt_tokens = LEAST(GREATEST(t.cached_prompt_tokens::numeric + f.cached_prompt_tokens, -9223372036854775808), 9223372036854775807)::bigint,
        completion_tokens = LEAST(GREATEST(t.completion_tokens::numeric + f.completion_tokens, -9223372036854775808), 9223372036854775807)::bigint,
        cache_write_tokens = LEAST(GREATEST(t.cache_write_tokens::numeric + f.cache_write_tokens, -9223372036854775808), 9223372036854775807)::bigint
    FROM (SELECT sum(prompt_tokens) AS prompt_tokens, sum(cached_prompt_tokens) AS cached_prompt_tokens,
                 sum(completion_tokens) AS completion_tokens, sum(cache_write_tokens) AS cache_write_tokens
          FROM stale HAVING count(*) > 0) f
    WHERE t.id = @id
)
INSERT INTO thread_usage AS u (thread_id, writer_id, batch, prompt_tokens, cached_prompt_tokens, completion_tokens, cache_write_tokens)
SELECT t.id, @writer_id::text, @batch::bigint, @prompt_tokens::bigint, @cached_prompt_tokens::bigint,
       @completion_tokens::bigint, @cache_write_tokens::bigint
FROM threads t, (SELECT set_config('synchronous_commit', 'off', true)) async
WHERE t.id = @id
ON CONFLICT (thread_id, writer_id) DO UPDATE
SET batch = excluded.batch, at = now(),
    prompt_tokens = LEAST(GREATEST(u.prompt_tokens::numeric + excluded.prompt_tokens, -9223372036854775808), 9223372036854775807)::bigint,
    cached_prompt_tokens = LEAST(GREATEST(u.cached_prompt_tokens::numeric + excluded.cached_prompt_tokens, -9223372036854775808), 9223372036854775807)::bigint,
    completion_tokens = LEAST(GREATEST(u.completion_tokens::numeric + excluded.completion_tokens, -9223372036854775808), 9223372036854775807)::bigint,
    cache_write_tokens = LEAST(GREATEST(u.cache_write_tokens::numeric + excluded.cache_write_tokens, -9223372036854775808), 9223372036854775807)::bigint
WHERE u.batch < excluded.batch;

-- name: ThreadUsageGet :one
-- A thread's usage: its row's totals and its writers' (thread_usage), saturating at bigint's
-- bounds as tools.AddTokens does.
SELECT LEAST(GREATEST(t.prompt_tokens::numeric + coalesce(sum(u.prompt_tokens), 0), -9223372036854775808), 9223372036854775807)::bigint AS prompt_tokens,
       LEAST(GREATEST(t.cached_prompt_tokens::numeric + coalesce(sum(u.cached_prompt_tokens), 0), -9223372036854775808), 9223372036854775807)::bigint AS cached_prompt_tokens,
       LEAST(GREATEST(t.completion_tokens::numeric + coalesce(sum(u.completion_tokens), 0), -9223372036854775808), 9223372036854775807)::bigint AS completion_tokens,
       LEAST(GREATEST(t.cache_write_tokens::numeric + coalesce(sum(u.cache_write_tokens), 0), -9223372036854775808), 9223372036854775807)::bigint AS cache_write_tokens
FROM threads t LEFT JOIN thread_usage u ON u.thread_id = t.id
WHERE t.id = @id
GROUP BY t.id;

-- name: ThreadScopeGet :one
-- A thread's parents, its own review setting, and its place among its scopes: its ancestors
-- (nearest first), what they hold, and the review setting in force (thread_scope,
-- db/schema/3_scopes.sql); its own untrusted_writes and the one in force ('': the deployment's),
-- and whether other threads name it among their parents (inherited_by: docs/spec.md §19).
SELECT threads.parents, threads.agent_writes AS own_agent_writes, s.ancestors::text[] AS ancestors,
       s.agent_writes::text AS agent_writes, thread_inherited(s.ancestors) AS inherited,
       threads.untrusted_writes AS own_untrusted_writes,
       coalesce(thread_untrusted_writes(s.ancestors, threads.untrusted_writes), '')::text AS untrusted_writes,
       EXISTS (SELECT FROM threads c WHERE c.parents @> ARRAY[threads.id]) AS inherited_by
FROM threads, thread_scope(threads.id, threads.parents, threads.agent_writes) s
WHERE threads.id = @id;

-- name: ThreadAncestorVersions :one
-- A thread's ancestors (nearest first) and their versions (next_event_id, 0 for one that does not
-- exist), as a turn would read them (thread_scope, db/schema/3_scopes.sql): what a live view of
-- the thread watches besides the thread itself.
SELECT s.ancestors::text[] AS ancestors, s.versions::bigint[] AS versions
FROM threads, thread_scope(threads.id, threads.parents, threads.agent_writes) s
WHERE threads.id = @id;

-- name: ThreadSetParents :one
-- Stores a thread's parents as thread_set_parents says (db/schema/3_scopes.sql); the caller
-- holds the thread's row lock. Returns why a list is refused, '' when it was stored or unchanged.
SELECT coalesce(thread_set_parents(@id, @parents::text[], @actor::text, @via::text), '')::text AS refused;

-- name: ThreadSetAgentWrites :exec
-- Sets a thread's own review setting (NULL: inherited); the caller holds the row lock and
-- appends the event.
UPDATE threads SET agent_writes = sqlc.narg(agent_writes)::text, updated_at = now() WHERE id = @id;

-- name: ThreadSetUntrustedWrites :exec
-- Sets a thread's own untrusted_writes (NULL: inherited, docs/spec.md §19); the caller holds the
-- row lock and appends the event.
UPDATE threads SET untrusted_writes = sqlc.narg(untrusted_writes)::text, updated_at = now() WHERE id = @id;

-- name: ThreadSetSharedWith :exec
-- Sets the clients a thread outside every client's namespace is shared with ('*': every client;
-- docs/spec.md §20); the caller holds the row lock and appends the event.
UPDATE threads SET shared_with = @shared_with::text[], updated_at = now() WHERE id = @id;

-- name: ThreadSharedWith :one
-- Whether a thread outside every client's namespace is shared with a client.
SELECT EXISTS (SELECT FROM threads WHERE id = @id AND shared_with && ARRAY[@client::text, '*'])::boolean AS shared;

-- name: ThreadChildren :many
-- The threads that name a thread among their parents, by id, after the cursor ('' none).
SELECT id FROM threads WHERE parents @> ARRAY[@id::text] AND id > @after_id::text ORDER BY id LIMIT @max_rows;

-- name: TurnUndo :exec
-- Gives back a turn that never reached its model, or whose caller gave up (turn_undo,
-- db/schema/4_turns.sql), of the thread it began on (created_at): its number, its snapshot, and,
-- for a first turn, the thread and the empty parents its start created, when nothing was written
-- to them since.
SELECT turn_undo(@thread_id::text, @turn::integer, @created_at::timestamptz);

-- name: ThreadParentsLock :exec
-- Takes the keys of a change of a thread's parents to parents (thread_parents_lock,
-- db/schema/3_scopes.sql), waiting for them: the statement before the transaction locks any row.
SELECT thread_parents_lock(@id::text, @parents::text[], true);

-- name: ThreadVersions :many
-- Where the threads a replica watches stand (docs/spec.md §13): each one's next event id and
-- creation, so that a change of any — an event appended, the thread deleted or created again —
-- is seen by whoever follows them. One indexed read per interval, however many writes.
SELECT id, next_event_id, created_at FROM threads WHERE id = ANY(@ids::text[]);
