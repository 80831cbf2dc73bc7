-- Scopes and review mode (docs/spec.md §17).
--
-- A scope is a thread like any other; what makes it one is that other threads name it among
-- their parents (nearest first). parents holds the parents' stored ids, in the thread's own
-- client namespace. agent_writes is the workspace's review setting: 'direct' (the tools write),
-- 'propose' (every change a tool would make becomes a proposal the user decides), or NULL: as the
-- nearest ancestor that sets it, else 'direct'. Both default to what every thread had before.
ALTER TABLE threads ADD COLUMN parents text[] NOT NULL DEFAULT '{}',
    ADD COLUMN agent_writes text CONSTRAINT threads_agent_writes_check CHECK (agent_writes IN ('direct', 'propose'));
-- A scope's children (GET …/children): the threads whose parents name it.
CREATE INDEX threads_parents_idx ON threads USING gin (parents);

-- A turn's snapshot holds what its block showed of the ancestors too: inherited is
-- [{scope, preferences}] nearest first (NULL: no ancestors, as every snapshot stored before), and
-- scope_versions the ancestors' next_event_id when it was read, so that a turn whose thread and
-- ancestors are all unchanged reuses it.
ALTER TABLE workspace_snapshots ADD COLUMN inherited jsonb, ADD COLUMN scope_versions bigint[];

-- Events: a thread's parents and review setting are changes with events too (target 'thread',
-- kinds parents_set and agent_writes_set; a parents_set by a turn's X-Workspace-Parents header is
-- the client's); review mode's proposals (proposed) and their answers (a change with answers =
-- the proposal's id, or proposal_dismissed); and a preference moved between scopes
-- (preference_moved in each workspace, moved = {"from","to"} the two threads' stored ids). The
-- checks are replaced NOT VALID: the rows stored before satisfy the narrower ones, and a large
-- events table is not scanned.
ALTER TABLE events ADD COLUMN answers bigint, ADD COLUMN moved jsonb;
ALTER TABLE events DROP CONSTRAINT events_actor_check,
    ADD CONSTRAINT events_actor_check CHECK (actor IN ('agent', 'user', 'client')) NOT VALID;
ALTER TABLE events DROP CONSTRAINT events_kind_check,
    ADD CONSTRAINT events_kind_check CHECK (kind IN ('objective_set', 'preference_added', 'preference_updated',
        'preference_locked', 'preference_unlocked', 'preference_removed', 'revert', 'locked_skip',
        'parents_set', 'agent_writes_set', 'proposed', 'proposal_dismissed', 'preference_moved')) NOT VALID;
ALTER TABLE events DROP CONSTRAINT events_target_type_check,
    ADD CONSTRAINT events_target_type_check CHECK (target_type IN ('objective', 'preference', 'thread')) NOT VALID;
-- A proposal's answer, found by the proposal.
CREATE INDEX events_answers_idx ON events (thread_id, answers) WHERE answers IS NOT NULL;

-- thread_inherited is what ancestors hold: [{scope, preferences}] in their order, each list in
-- creation order (a thread that does not exist holds none).
CREATE FUNCTION thread_inherited(ancestors text[]) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('scope', a.id, 'preferences',
               (SELECT coalesce(jsonb_agg(jsonb_build_object(
                           'id', p.id, 'title', p.title, 'subtitle', p.subtitle, 'kind', p.kind, 'locked', p.locked)
                           ORDER BY p.id), '[]'::jsonb)
                FROM preferences p WHERE p.thread_id = a.id)) ORDER BY a.n), '[]'::jsonb)
    FROM unnest(ancestors) WITH ORDINALITY AS a(id, n)
$$;

-- thread_scope is a thread's place among its scopes, as a turn or a tool call of it sees them,
-- from parents (its stored ones, or ones about to be stored): its ancestors, found breadth-first
-- and nearest first, each once at its nearest place, 8 at most; their versions (next_event_id, 0
-- for one that does not exist); and the review setting in force (its own, else the nearest
-- ancestor's, else 'direct'). One index probe per ancestor; none without parents. cycle says the
-- walk met the thread itself, more that it found a ninth ancestor (a list thread_set_parents
-- refuses).
CREATE FUNCTION thread_scope(thread_id text, parents text[], own_agent_writes text,
                             OUT ancestors text[], OUT versions bigint[], OUT agent_writes text,
                             OUT cycle boolean, OUT more boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    frontier text[] := parents;
    later text[];
    p text;
    a record;
BEGIN
    ancestors := '{}';
    versions := '{}';
    agent_writes := own_agent_writes;
    cycle := false;
    more := false;
    WHILE cardinality(frontier) > 0 AND NOT more LOOP
        later := '{}';
        FOREACH p IN ARRAY frontier LOOP
            IF p = thread_scope.thread_id THEN
                cycle := true;
                CONTINUE;
            END IF;
            CONTINUE WHEN p = ANY (ancestors);
            IF cardinality(ancestors) = 8 THEN
                more := true;
                EXIT;
            END IF;
            SELECT t.parents, t.next_event_id, t.agent_writes INTO a FROM threads t WHERE t.id = p;
            ancestors := ancestors || p;
            versions := versions || coalesce(a.next_event_id, 0);
            agent_writes := coalesce(agent_writes, a.agent_writes);
            later := later || coalesce(a.parents, '{}');
        END LOOP;
        frontier := later;
    END LOOP;
    agent_writes := coalesce(agent_writes, 'direct');
END
$$;

-- thread_set_parents stores a thread's parents (nearest first) when they differ from its stored
-- ones, as actor says, with a parents_set event and its NOTIFY; parents that do not exist are
-- created empty (past their tombstones). The caller holds the thread's row lock. It refuses
-- (returns the reason, changing nothing) a list that names the thread itself, names a thread
-- twice, makes a cycle or gives the thread more than 8 ancestors; NULL when stored or unchanged.
CREATE FUNCTION thread_set_parents(thread_id text, parents text[], actor text, via text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    stored text[];
    walk record;
    first bigint;
    p text;
BEGIN
    SELECT t.parents INTO stored FROM threads t WHERE t.id = thread_set_parents.thread_id;
    IF stored = parents THEN
        RETURN NULL;
    END IF;
    IF thread_set_parents.thread_id = ANY (parents) THEN
        RETURN 'a thread cannot be its own parent';
    END IF;
    IF cardinality(parents) <> (SELECT count(DISTINCT x) FROM unnest(parents) x) THEN
        RETURN 'a parent is named twice';
    END IF;
    walk := thread_scope(thread_set_parents.thread_id, parents, NULL);
    IF walk.cycle THEN
        RETURN 'a cycle: the thread would be its own ancestor';
    END IF;
    IF walk.more THEN
        RETURN 'more than 8 ancestors';
    END IF;
    FOREACH p IN ARRAY parents LOOP
        INSERT INTO threads (id) VALUES (p) ON CONFLICT (id) DO NOTHING;
        IF FOUND THEN
            PERFORM thread_revive(p);
        END IF;
    END LOOP;
    UPDATE threads t SET parents = thread_set_parents.parents, next_event_id = t.next_event_id + 1, updated_at = now()
    WHERE t.id = thread_set_parents.thread_id
    RETURNING t.next_event_id - 1 INTO first;
    INSERT INTO events (thread_id, id, at, actor, via, kind, target_type, before, after)
    VALUES (thread_set_parents.thread_id, first, clock_timestamp(), actor, via, 'parents_set', 'thread',
            jsonb_build_object('parents', to_jsonb(stored)), jsonb_build_object('parents', to_jsonb(parents)));
    PERFORM pg_notify('wsproxy_events', thread_set_parents.thread_id || ',' || first);
    RETURN NULL;
END
$$;

-- turn_start as in 006, and: new_parents (when not NULL: a turn's X-Workspace-Parents, or
-- THREAD_PARENTS for a thread it creates, parents_if_new) are stored first as thread_set_parents
-- says, by the client; a list it refuses begins no turn (refused says why, turn is NULL). It
-- reads the ancestors with the thread (thread_scope, thread_inherited): the snapshot is reused
-- while neither the thread nor any ancestor changed, and holds what the ancestors gave. It
-- returns the review setting in force.
DROP FUNCTION turn_start(text);
CREATE FUNCTION turn_start(thread_id text, new_parents text[] DEFAULT NULL, parents_if_new boolean DEFAULT false,
                           OUT turn integer, OUT objective text, OUT preferences jsonb, OUT created_at timestamptz,
                           OUT inherited jsonb, OUT agent_writes text, OUT refused text)
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
    RETURNING th.turns, th.next_event_id, th.created_at, th.parents, th.agent_writes
    INTO turn, thread_version, created_at, thread_parents, own_agent_writes;
    IF turn = 1 THEN
        SELECT r.next_event_id INTO thread_version FROM thread_revive(turn_start.thread_id) r;
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
            RETURN;
        END IF;
        SELECT t.next_event_id, t.parents INTO thread_version, thread_parents FROM threads t WHERE t.id = turn_start.thread_id;
    END IF;
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

-- turn_start_unless_held as in 011, for turn_start's parents and what it now returns.
DROP FUNCTION turn_start_unless_held(text);
CREATE FUNCTION turn_start_unless_held(thread_id text, new_parents text[] DEFAULT NULL, parents_if_new boolean DEFAULT false,
                                       OUT turn integer, OUT objective text, OUT preferences jsonb, OUT created_at timestamptz,
                                       OUT inherited jsonb, OUT agent_writes text, OUT refused text)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM FROM threads t WHERE t.id = turn_start_unless_held.thread_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND AND EXISTS (SELECT FROM threads t WHERE t.id = turn_start_unless_held.thread_id) THEN
        RETURN; -- held
    END IF;
    SELECT s.turn, s.objective, s.preferences, s.created_at, s.inherited, s.agent_writes, s.refused
    INTO turn, objective, preferences, created_at, inherited, agent_writes, refused
    FROM turn_start(turn_start_unless_held.thread_id, new_parents, parents_if_new) s;
END
$$;
