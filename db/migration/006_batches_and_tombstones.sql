-- Usage written exactly once (docs/spec.md §8): a replica's usage writer (its id random per
-- process) numbers its batches, and a batch adds a thread's usage only when it moves that
-- writer's mark on the thread, in the same statement (ThreadUsageAdd): a batch sent again after
-- its answer was lost (the connection cut after the commit) adds nothing. A mark that no writer
-- moved for a week is removed by the thread's next usage. Existing threads start without marks.
CREATE TABLE usage_batches (
    thread_id text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    writer_id text        NOT NULL,
    batch     bigint      NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, writer_id)
);

-- Ids never reused for a thread id (docs/spec.md §13): a deleted thread leaves a tombstone of its
-- counters (ThreadDelete), and a thread created again under its id numbers its events and
-- preferences on from there (thread_revive), so that a stream resuming with Last-Event-ID, a
-- revert or an edit of an id an open panel still shows never meets another change or item. One
-- row per deleted thread id, kept by thread id like every table.
CREATE TABLE thread_tombstones (
    thread_id          text   PRIMARY KEY,
    next_event_id      bigint NOT NULL,
    next_preference_id bigint NOT NULL
);

-- thread_revive moves a thread's counters past its id's tombstone, if any, and returns them. It
-- runs as a statement of its own after the one that created the thread: that one may have
-- waited for a DELETE of the same id, whose tombstone only a later statement sees.
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

-- turn_start as in 005, and: a thread it creates takes its counters past a tombstone
-- (thread_revive), and it returns the thread's created_at, which tells one life of a thread id
-- from the next: a turn's tool calls run only against the thread its start saw.
DROP FUNCTION turn_start(text);
CREATE FUNCTION turn_start(thread_id text, OUT turn integer, OUT objective text, OUT preferences jsonb,
                           OUT created_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    thread_version bigint;
    last_turn integer;
    last_version bigint;
    current_objective text;
    current_preferences jsonb;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- updated_at (the admin listing's order) moves when it is a second old: a busy thread's turns
    -- then change no indexed column, and its row is updated in place (HOT, no index entries).
    INSERT INTO threads AS th (id, turns) VALUES (turn_start.thread_id, 1)
    ON CONFLICT (id) DO UPDATE SET turns = th.turns + 1,
        updated_at = CASE WHEN th.updated_at < now() - interval '1 second' THEN now() ELSE th.updated_at END
    RETURNING th.turns, th.next_event_id, th.created_at INTO turn, thread_version, created_at;
    IF turn = 1 THEN
        SELECT r.next_event_id INTO thread_version FROM thread_revive(turn_start.thread_id) r;
    END IF;

    SELECT s.turn, s.version, s.objective, s.preferences
    INTO last_turn, last_version, objective, preferences
    FROM workspace_snapshots s WHERE s.thread_id = turn_start.thread_id
    ORDER BY s.turn DESC LIMIT 1;
    IF last_version = thread_version THEN
        RETURN; -- unchanged since the last snapshot: its workspace
    END IF;

    SELECT o.text INTO current_objective FROM objectives o WHERE o.thread_id = turn_start.thread_id;
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', p.id, 'title', p.title, 'subtitle', p.subtitle, 'kind', p.kind, 'locked', p.locked)
               ORDER BY p.id), '[]'::jsonb)
    INTO current_preferences FROM preferences p WHERE p.thread_id = turn_start.thread_id;
    IF last_turn IS NOT NULL AND objective IS NOT DISTINCT FROM current_objective AND preferences = current_preferences THEN
        -- The same workspace (events that changed nothing, such as a refused edit of a locked
        -- item, or a snapshot from before migration 005): no new copy, the version recorded.
        UPDATE workspace_snapshots s SET version = thread_version
        WHERE s.thread_id = turn_start.thread_id AND s.turn = last_turn;
        RETURN;
    END IF;
    INSERT INTO workspace_snapshots (thread_id, turn, version, objective, preferences)
    VALUES (turn_start.thread_id, turn, thread_version, current_objective, current_preferences);
    objective := current_objective;
    preferences := current_preferences;
END
$$;
