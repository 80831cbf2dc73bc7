-- A tool call of a turn in one round trip (docs/spec.md §5, docs/scaling.md). The proxy knows the
-- workspace a turn's call will find when nothing changed it since the turn began or since the
-- turn's last call: every change of a workspace appends its events in its own transaction, which
-- moves the thread's next_event_id (its version) on, under the thread's row lock. So a call is
-- planned on the workspace of the version the proxy last saw, and sent in one pipeline whose
-- first statement locks the thread's row and checks that version; workspace_moved ends the
-- transaction, before anything is written, when the version moved on (or the thread is gone, or
-- is another of the same id), and the call is then planned again on the list read under the lock.

-- workspace_moved raises the error (SQLSTATE WS409) that ends a call's pipeline whose workspace
-- moved on since it was planned.
CREATE FUNCTION workspace_moved(thread_id text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'the workspace of thread % changed since the call was planned', workspace_moved.thread_id
        USING ERRCODE = 'WS409';
END
$$;

-- turn_start as in 012, and: it returns the workspace's version (the thread's next_event_id as
-- the workspace was read) and the thread's next preference id, on which the turn's first call is
-- planned.
DROP FUNCTION turn_start_unless_held(text, text[], boolean);
DROP FUNCTION turn_start(text, text[], boolean);
CREATE FUNCTION turn_start(thread_id text, new_parents text[] DEFAULT NULL, parents_if_new boolean DEFAULT false,
                           OUT turn integer, OUT objective text, OUT preferences jsonb, OUT created_at timestamptz,
                           OUT inherited jsonb, OUT agent_writes text, OUT refused text,
                           OUT version bigint, OUT next_preference_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    thread_version bigint;
    thread_parents text[];
    own_agent_writes text;
    scope record;
    last_turn integer;
    last_version bigint;
    last_scope_versions bigint[];
    current_objective text;
    current_preferences jsonb;
    current_inherited jsonb;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO threads AS th (id, turns) VALUES (turn_start.thread_id, 1)
    ON CONFLICT (id) DO UPDATE SET turns = th.turns + 1,
        updated_at = CASE WHEN th.updated_at < now() - interval '1 second' THEN now() ELSE th.updated_at END
    RETURNING th.turns, th.next_event_id, th.created_at, th.parents, th.agent_writes, th.next_preference_id
    INTO turn, thread_version, created_at, thread_parents, own_agent_writes, next_preference_id;
    IF turn = 1 THEN
        SELECT r.next_event_id, r.next_preference_id INTO thread_version, next_preference_id
        FROM thread_revive(turn_start.thread_id) r;
    END IF;
    IF new_parents IS NOT NULL AND new_parents <> thread_parents AND (turn = 1 OR NOT parents_if_new) THEN
        refused := thread_set_parents(turn_start.thread_id, new_parents, 'client', 'proxy');
        IF refused IS NOT NULL THEN
            -- No turn: its number is given back (the row lock is held: no other turn took one).
            UPDATE threads t SET turns = t.turns - 1 WHERE t.id = turn_start.thread_id;
            IF turn = 1 THEN
                DELETE FROM threads t WHERE t.id = turn_start.thread_id AND t.next_event_id = thread_version
                    AND NOT EXISTS (SELECT FROM preferences p WHERE p.thread_id = t.id)
                    AND NOT EXISTS (SELECT FROM objectives o WHERE o.thread_id = t.id);
            END IF;
            turn := NULL;
            created_at := NULL;
            next_preference_id := NULL;
            RETURN;
        END IF;
        SELECT t.next_event_id, t.parents INTO thread_version, thread_parents FROM threads t WHERE t.id = turn_start.thread_id;
    END IF;
    version := thread_version;
    IF cardinality(thread_parents) = 0 THEN -- no ancestors: nothing to read
        SELECT '{}'::text[] AS ancestors, '{}'::bigint[] AS versions, coalesce(own_agent_writes, 'direct') AS agent_writes INTO scope;
    ELSE
        scope := thread_scope(turn_start.thread_id, thread_parents, own_agent_writes);
    END IF;
    agent_writes := scope.agent_writes;

    SELECT s.turn, s.version, s.scope_versions, s.objective, s.preferences, s.inherited
    INTO last_turn, last_version, last_scope_versions, objective, preferences, inherited
    FROM workspace_snapshots s WHERE s.thread_id = turn_start.thread_id
    ORDER BY s.turn DESC LIMIT 1;
    IF last_version = thread_version AND coalesce(last_scope_versions, '{}') = scope.versions THEN
        RETURN; -- unchanged since the last snapshot: its workspace
    END IF;

    SELECT o.text INTO current_objective FROM objectives o WHERE o.thread_id = turn_start.thread_id;
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', p.id, 'title', p.title, 'subtitle', p.subtitle, 'kind', p.kind, 'locked', p.locked)
               ORDER BY p.id), '[]'::jsonb)
    INTO current_preferences FROM preferences p WHERE p.thread_id = turn_start.thread_id;
    IF cardinality(scope.ancestors) > 0 THEN
        current_inherited := thread_inherited(scope.ancestors);
    END IF;
    IF last_turn IS NOT NULL AND objective IS NOT DISTINCT FROM current_objective AND preferences = current_preferences
       AND inherited IS NOT DISTINCT FROM current_inherited THEN
        -- The same workspace (events that changed nothing): no new copy, the versions recorded.
        UPDATE workspace_snapshots s SET version = thread_version, scope_versions = scope.versions
        WHERE s.thread_id = turn_start.thread_id AND s.turn = last_turn;
        RETURN;
    END IF;
    INSERT INTO workspace_snapshots (thread_id, turn, version, objective, preferences, inherited, scope_versions)
    VALUES (turn_start.thread_id, turn, thread_version, current_objective, current_preferences, current_inherited, scope.versions);
    objective := current_objective;
    preferences := current_preferences;
    inherited := current_inherited;
END
$$;

-- turn_start_unless_held as in 012, for what turn_start now returns.
CREATE FUNCTION turn_start_unless_held(thread_id text, new_parents text[] DEFAULT NULL, parents_if_new boolean DEFAULT false,
                                       OUT turn integer, OUT objective text, OUT preferences jsonb, OUT created_at timestamptz,
                                       OUT inherited jsonb, OUT agent_writes text, OUT refused text,
                                       OUT version bigint, OUT next_preference_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM FROM threads t WHERE t.id = turn_start_unless_held.thread_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND AND EXISTS (SELECT FROM threads t WHERE t.id = turn_start_unless_held.thread_id) THEN
        RETURN; -- held
    END IF;
    SELECT s.turn, s.objective, s.preferences, s.created_at, s.inherited, s.agent_writes, s.refused, s.version, s.next_preference_id
    INTO turn, objective, preferences, created_at, inherited, agent_writes, refused, version, next_preference_id
    FROM turn_start(turn_start_unless_held.thread_id, new_parents, parents_if_new) s;
END
$$;
