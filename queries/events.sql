-- name: EventInsert :one
-- Appends a change's events, all by one actor via one path: ids from the thread's next_event_id
-- (the caller holds the thread's row lock), tool_call_id the tool call recorded just before in
-- the same transaction when after_tool_call, at the time of the insert (under the lock: in id
-- order). No NOTIFY: replicas follow the thread's next_event_id (docs/spec.md §13). An empty proposal
-- is none (SQL NULL); the text null is a removal's. answers 0 and moved '' are none. context,
-- when not null, is each event's (an agent write's: docs/spec.md §19). Returns the first id.
WITH n AS (
    UPDATE threads SET next_event_id = next_event_id + cardinality(@kinds::text[])
    WHERE id = @thread_id::text
    RETURNING next_event_id - cardinality(@kinds::text[]) AS first
), ins AS (
    INSERT INTO events (thread_id, id, at, actor, via, turn, round, tool_call_id, reason, kind, target_type, target_id, before, after, reverts, proposed, answers, moved, context)
    SELECT @thread_id::text, n.first + e.i - 1, clock_timestamp(), @actor::text, @via::text, sqlc.narg(turn)::integer, sqlc.narg(round)::integer,
           CASE WHEN @after_tool_call::boolean THEN currval(pg_get_serial_sequence('tool_calls', 'id')) END,
           sqlc.narg(reason)::text, e.kind, e.target_type, NULLIF(e.target_id, 0), NULLIF(e.before, '')::jsonb,
           NULLIF(e.after, '')::jsonb, NULLIF(e.reverts, 0), NULLIF(e.proposed, '')::jsonb, NULLIF(e.answers, 0),
           NULLIF(e.moved, '')::jsonb, sqlc.narg(context)::jsonb
    -- unnest reads the arrays in one pass (a subscript of a text[] walks it from its start).
    FROM n, ROWS FROM (unnest(@kinds::text[]), unnest(@target_types::text[]), unnest(@target_ids::bigint[]),
                       unnest(@befores::text[]), unnest(@afters::text[]), unnest(@reverts::bigint[]),
                       unnest(@proposals::text[]), unnest(@answers::bigint[]), unnest(@moves::text[]))
         WITH ORDINALITY AS e (kind, target_type, target_id, before, after, reverts, proposed, answers, moved, i)
    RETURNING id
)
SELECT n.first::bigint AS first_id, (SELECT count(*) FROM ins)::bigint AS inserted FROM n;

-- name: EventGet :one
SELECT * FROM events WHERE thread_id = @thread_id AND id = @id;

-- name: EventList :many
-- A thread's events after the cursor (none: 0), oldest first or newest first (descending, the
-- cursor then an upper bound; 0 none), of one target when target_type is set.
SELECT * FROM events
WHERE thread_id = @thread_id
  AND (@target_type::text = '' OR (target_type = @target_type::text AND coalesce(target_id, 0) = @target_id::bigint))
  AND CASE WHEN @descending::boolean THEN (@after_id::bigint = 0 OR id < @after_id::bigint) ELSE id > @after_id::bigint END
ORDER BY CASE WHEN @descending::boolean THEN -id ELSE id END
LIMIT @max_rows;

-- name: EventLaterOnTarget :one
-- The events after id that changed the same target (a locked_skip, a proposal and a dismissal
-- changed nothing): the first's id, the latest's, and how many (0 and 0 for none).
SELECT coalesce(min(id), 0)::bigint AS first_id, coalesce(max(id), 0)::bigint AS latest_id, count(*)::bigint AS changes
FROM events
WHERE thread_id = @thread_id AND id > @id AND target_type = @target_type::text
  AND coalesce(target_id, 0) = @target_id::bigint AND kind NOT IN ('locked_skip', 'proposed', 'proposal_dismissed');

-- name: EventChangesOnTarget :many
-- The events after id that changed the same target, oldest first (a revert back through them).
SELECT * FROM events
WHERE thread_id = @thread_id AND id > @id AND target_type = @target_type::text
  AND coalesce(target_id, 0) = @target_id::bigint AND kind NOT IN ('locked_skip', 'proposed', 'proposal_dismissed')
ORDER BY id
LIMIT @max_rows;

-- name: EventLastID :one
-- The thread's last event id (0 for none).
SELECT (next_event_id - 1)::bigint AS last_id FROM threads WHERE id = @thread_id;

-- name: EventPrune :execrows
-- HISTORY_RETENTION: events older than the cutoff. It waits for no row another transaction
-- holds (a thread's DELETE, whose cascade locks the thread's rows in its own order): those are
-- left to the next prune, so the two never deadlock.
DELETE FROM events
WHERE (thread_id, id) IN (SELECT o.thread_id, o.id FROM events o WHERE o.at < @cutoff FOR UPDATE SKIP LOCKED);

-- name: EventAnswer :one
-- The event that answered a proposal (applied it, or dismissed it), if any.
SELECT id, kind FROM events WHERE thread_id = @thread_id AND answers = @proposal ORDER BY id LIMIT 1;

-- name: EventPendingProposals :many
-- The thread's proposals no event answered yet, oldest first: review mode's (proposed) and a
-- locked item's (a locked_skip that kept what the agent asked for).
SELECT * FROM events e
WHERE e.thread_id = @thread_id AND (e.kind = 'proposed' OR (e.kind = 'locked_skip' AND e.proposed IS NOT NULL))
  AND NOT EXISTS (SELECT FROM events a WHERE a.thread_id = e.thread_id AND a.answers = e.id)
ORDER BY e.id
LIMIT @max_rows;

-- name: EventPreferenceStatesAfter :many
-- Each preference changed after event after_id, as it stood before the first event on it after
-- then (null: it did not exist then): with the list as it stands, the list after that event (an
-- MCP call's as_of, docs/spec.md §15).
SELECT DISTINCT ON (target_id) target_id::bigint AS id, before FROM events
WHERE thread_id = @thread_id AND id > @after_id::bigint AND target_type = 'preference' AND target_id IS NOT NULL
ORDER BY target_id, id;

-- name: EventCompactionInsert :one
-- Records a client's compaction of its history (docs/spec.md §18; thread_compacted,
-- db/schema/2_workspace.sql): the thread created when new (past its tombstone), a compaction event by the client
-- under the thread's row lock. Returns the event's id.
SELECT c::bigint AS id FROM thread_compacted(@thread_id::text) c;

-- name: EventProposalBook :one
-- What a tool call that would make proposals must know of the thread's (docs/spec.md §17, §19),
-- read under the thread's row lock: how many proposals wait for the user (review mode's, and the
-- locked_skips that kept one, that no event answered), review mode's latest pending objective
-- proposal (0 none: a newer one replaces it), and for each of the call's candidates (target_types,
-- target_ids (0: an addition) and proposals (the fields, as JSON) of one proposal each) whether
-- an equal one waits (1) or was dismissed (2), else 0. Equal: the same target, and the same
-- fields (jsonb's equality).
WITH p AS MATERIALIZED (
    SELECT e.id, e.kind, e.target_type, coalesce(e.target_id, 0) AS target_id, e.proposed,
           (SELECT a.kind FROM events a WHERE a.thread_id = e.thread_id AND a.answers = e.id ORDER BY a.id LIMIT 1) AS answer
    FROM events e
    WHERE e.thread_id = @thread_id AND (e.kind = 'proposed' OR (e.kind = 'locked_skip' AND e.proposed IS NOT NULL))
)
SELECT (SELECT count(*) FROM p WHERE p.answer IS NULL)::bigint AS pending,
       coalesce((SELECT max(p.id) FROM p WHERE p.answer IS NULL AND p.kind = 'proposed' AND p.target_type = 'objective'), 0)::bigint AS objective,
       ARRAY(SELECT CASE WHEN EXISTS (SELECT FROM p WHERE p.answer IS NULL AND p.target_type = c.target_type
                                        AND p.target_id = c.target_id AND p.proposed = c.proposed::jsonb) THEN 1
                         WHEN EXISTS (SELECT FROM p WHERE p.answer = 'proposal_dismissed' AND p.target_type = c.target_type
                                        AND p.target_id = c.target_id AND p.proposed = c.proposed::jsonb) THEN 2
                         ELSE 0 END
             FROM ROWS FROM (unnest(@target_types::text[]), unnest(@target_ids::bigint[]), unnest(@proposals::text[]))
                  WITH ORDINALITY AS c (target_type, target_id, proposed, n)
             ORDER BY c.n)::integer[] AS known;
