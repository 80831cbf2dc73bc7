-- A turn's start reads the workspace's tables only when the workspace changed since the thread's
-- last snapshot. Every change of a workspace appends its events in its own transaction, which
-- moves the thread's next_event_id on; a snapshot records the next_event_id it was read at, so a
-- thread whose next_event_id still equals its last snapshot's version has that snapshot's
-- workspace. Snapshots stored before this migration have no version: the first turn of their
-- thread compares their contents, as before, and records the version when they are equal. A turn
-- now moves its thread's updated_at only when it is a second old.
ALTER TABLE workspace_snapshots ADD COLUMN version bigint;

-- turn_start begins a turn of thread_id: it creates the thread on its first turn, takes the next
-- turn number under the thread's row lock (held until the transaction ends: no edit of the
-- workspace can commit in between), and returns the workspace as it stood, storing it as the
-- turn's snapshot when it differs from the last one. The calling transaction commits without
-- waiting for the disk (synchronous_commit off, for it alone). A volatile function: each of its
-- statements sees what committed before it, so the reads after the lock see every change
-- committed before the turn.
CREATE FUNCTION turn_start(thread_id text, OUT turn integer, OUT objective text, OUT preferences jsonb)
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
    RETURNING th.turns, th.next_event_id INTO turn, thread_version;

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
        -- item, or a snapshot from before this migration): no new copy, the version recorded.
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
