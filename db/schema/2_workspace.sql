-- Functions of a thread's workspace: its counters past a tombstone, a compaction's event, the
-- check of a tool call planned on a version, and the sources of what it holds (1_tables.sql says
-- how these files are read).

-- thread_revive moves a thread's counters past its id's tombstone, if any, and returns them. It
-- runs as a statement of its own after the one that created the thread: that one may have waited
-- for a DELETE of the same id, whose tombstone only a later statement sees.
CREATE FUNCTION thread_revive(thread_id text, OUT next_event_id bigint, OUT next_preference_id bigint)
LANGUAGE sql VOLATILE AS $$
    UPDATE threads t
    SET next_event_id = greatest(t.next_event_id, d.next_event_id),
        next_preference_id = greatest(t.next_preference_id, d.next_preference_id)
    FROM thread_tombstones d
    WHERE t.id = thread_revive.thread_id AND d.thread_id = thread_revive.thread_id
      AND (t.next_event_id < d.next_event_id OR t.next_preference_id < d.next_preference_id);
    SELECT t.next_event_id, t.next_preference_id FROM threads t WHERE t.id = thread_revive.thread_id;
$$;

-- thread_compacted records a client's compaction of thread_id (docs/spec.md §18) in one round
-- trip and returns the event's id: an event of kind compaction, by the client, via the proxy, on
-- the thread (target 'thread', no target id, before and after NULL: it changed nothing of the
-- workspace, and it is not reverted; no turn: a compaction takes no turn number). The thread is
-- created when it does not exist (past its tombstone, as a turn's start creates it, with no turn),
-- and the event id is taken under the thread's row lock (so events commit in id order). The thread
-- counts as updated (the thread list's order). The first statement finds an existing thread and
-- locks it; when it found none (never created, or deleted meanwhile), the thread is created, or
-- found as another transaction created it, locked either way, then moved past its tombstone by a
-- statement of its own (thread_revive: only a later statement sees a tombstone the creation
-- waited for), which moves nothing of a thread that is not new. It sends no NOTIFY: a NOTIFY in a
-- writing transaction holds PostgreSQL's notification queue lock, which every notifying commit of
-- every replica shares (docs/spec.md §13); each replica follows its threads by next_event_id.
CREATE FUNCTION thread_compacted(thread_id text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    event_id bigint;
BEGIN
    UPDATE threads t SET next_event_id = t.next_event_id + 1, updated_at = now()
    WHERE t.id = thread_compacted.thread_id
    RETURNING t.next_event_id - 1 INTO event_id;
    IF NOT FOUND THEN
        INSERT INTO threads AS th (id) VALUES (thread_compacted.thread_id)
        ON CONFLICT (id) DO UPDATE SET updated_at = now();
        PERFORM thread_revive(thread_compacted.thread_id);
        UPDATE threads t SET next_event_id = t.next_event_id + 1
        WHERE t.id = thread_compacted.thread_id
        RETURNING t.next_event_id - 1 INTO event_id;
    END IF;
    INSERT INTO events (thread_id, id, at, actor, via, kind, target_type)
    VALUES (thread_compacted.thread_id, event_id, clock_timestamp(), 'client', 'proxy', 'compaction', 'thread');
    RETURN event_id;
END
$$;

-- A tool call of a turn in one round trip (docs/spec.md §5, docs/scaling.md): a call is planned on
-- the workspace of the version the proxy last saw (the thread's next_event_id, which every change
-- moves on under the thread's row lock), and sent in one pipeline whose first statement locks the
-- thread's row and checks that version (ToolCallGuard). workspace_moved raises the error
-- (SQLSTATE WS409) that ends such a pipeline, before anything is written, when the version moved
-- on (or the thread is gone, or is another of the same id); the call is then planned again on the
-- list read under the lock.
CREATE FUNCTION workspace_moved(thread_id text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'the workspace of thread % changed since the call was planned', workspace_moved.thread_id
        USING ERRCODE = 'WS409';
END
$$;

-- source_lower is the source an agent write of source by leaves an item whose source was was: the
-- lower of the two ('user' > 'confirmed' > 'agent' > 'unconfirmed'): an agent write never raises
-- an item's source, whatever the proxy that planned it knew.
CREATE FUNCTION source_lower(was text, by text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN array_position(ARRAY['unconfirmed', 'agent', 'confirmed', 'user'], by)
                     < array_position(ARRAY['unconfirmed', 'agent', 'confirmed', 'user'], was)
                THEN by ELSE was END
$$;

-- unsourced is a snapshot's preferences (or inherited, [{scope, preferences}]) without their
-- sources: what a snapshot stored before migration 019 holds. A turn start compares the workspace
-- with such a snapshot without the sources, so that it stores no copy of a workspace that did not
-- change.
CREATE FUNCTION unsourced(j jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_agg(CASE WHEN e ? 'scope' THEN jsonb_set(e, '{preferences}', unsourced(e->'preferences'))
                                   ELSE e - 'source' END ORDER BY n), '[]'::jsonb)
    FROM jsonb_array_elements(j) WITH ORDINALITY AS a(e, n)
$$;
