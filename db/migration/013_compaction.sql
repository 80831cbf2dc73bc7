-- A client's compaction in its thread's history (docs/spec.md §18): a coding agent's request that
-- summarizes the conversation for its own history is forwarded as it came, and the thread's
-- timeline says so — an event of kind compaction, by the client, via the proxy, on the thread
-- (target 'thread', no target id). It changed nothing of the workspace: before and after are
-- NULL, and it is not reverted. It carries no turn: a compaction is not a turn of the loop and
-- takes no turn number (turn numbers are the loop's, for its snapshots and tool calls); its id
-- and time place it among the thread's turns. The check is replaced NOT VALID, as in 012: the
-- rows stored before satisfy the narrower one, and a large events table is not scanned.
ALTER TABLE events DROP CONSTRAINT events_kind_check,
    ADD CONSTRAINT events_kind_check CHECK (kind IN ('objective_set', 'preference_added', 'preference_updated',
        'preference_locked', 'preference_unlocked', 'preference_removed', 'revert', 'locked_skip',
        'parents_set', 'agent_writes_set', 'proposed', 'proposal_dismissed', 'preference_moved',
        'compaction')) NOT VALID;

-- thread_compacted records a client's compaction of thread_id in one round trip and returns the
-- event's id: the thread is created when it does not exist (past its tombstone, as a turn's start
-- creates it, with no turn), the event id is taken under the thread's row lock (so events commit
-- in id order), and its NOTIFY (delivered at commit) wakes the thread's live panels and MCP
-- subscriptions. The thread counts as updated (the thread list's order). The first statement
-- finds an existing thread and locks it; when it found none (never created, or deleted
-- meanwhile), the thread is created, or found as another transaction created it, locked either
-- way, then moved past its tombstone by a statement of its own (thread_revive, migration 006:
-- only a later statement sees a tombstone the creation waited for), which moves nothing of a
-- thread that is not new.
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
    PERFORM pg_notify('wsproxy_events', thread_compacted.thread_id || ',' || event_id);
    RETURN event_id;
END
$$;
