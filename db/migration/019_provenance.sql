-- Provenance: what the model was told to remember (docs/spec.md §19). Every preference and
-- objective says where it came from; a thread remembers that a turn of it read content the user
-- did not write (tainted, for good) and that its client sent tools of its own (client_tools); a
-- workspace says what becomes of a tainted turn's ungrounded writes (untrusted_writes, inherited
-- like agent_writes); every agent write's event says what the turn had read (context); a
-- Responses turn keeps the user's words it was given, for a continuation that brings none.
-- Replicas of the previous version go on working against it: a row they add takes the column
-- defaults below, and the functions they call keep their names and the columns they read.

-- source: 'user' (written or edited by the user path), 'confirmed' (a proposal the user applied,
-- or an agent's item the user locked), 'agent' (an agent write that was not tainted, or
-- grounded), 'unconfirmed' (applied under untrusted_writes 'apply' from a tainted, ungrounded
-- write). The rows stored before take theirs from the last event that wrote their text: the
-- user's (through the admin REST) 'user', or 'confirmed' when it applied a proposal; the agent's
-- 'agent', or 'confirmed' when the user locked the item since; none kept (history pruned, or
-- older than the history) 'agent', or 'confirmed' for a locked one.
ALTER TABLE preferences ADD COLUMN source text NOT NULL DEFAULT 'agent'
    CONSTRAINT preferences_source_check CHECK (source IN ('user', 'confirmed', 'agent', 'unconfirmed'));
ALTER TABLE objectives ADD COLUMN source text NOT NULL DEFAULT 'agent'
    CONSTRAINT objectives_source_check CHECK (source IN ('user', 'confirmed', 'agent', 'unconfirmed'));
UPDATE preferences p SET source = CASE
        WHEN w.actor IN ('user', 'client') AND w.answers IS NOT NULL THEN 'confirmed'
        WHEN w.actor IN ('user', 'client') THEN 'user'
        WHEN p.locked THEN 'confirmed'
        ELSE 'agent' END
FROM preferences q LEFT JOIN LATERAL (
    SELECT e.actor, e.answers FROM events e
    WHERE e.thread_id = q.thread_id AND e.target_type = 'preference' AND e.target_id = q.id
      AND e.kind IN ('preference_added', 'preference_updated', 'revert')
    ORDER BY e.id DESC LIMIT 1) w ON true
WHERE p.thread_id = q.thread_id AND p.id = q.id;
UPDATE objectives o SET source = CASE
        WHEN o.updated_by = 'user' AND w.answers IS NOT NULL THEN 'confirmed'
        WHEN o.updated_by = 'user' THEN 'user'
        ELSE 'agent' END
FROM objectives q LEFT JOIN LATERAL (
    SELECT e.answers FROM events e
    WHERE e.thread_id = q.thread_id AND e.target_type = 'objective' AND e.kind IN ('objective_set', 'revert')
    ORDER BY e.id DESC LIMIT 1) w ON true
WHERE o.thread_id = q.thread_id;

-- source_lower is the source an agent write of source by leaves an item whose source was was:
-- the lower of the two ('user' > 'confirmed' > 'agent' > 'unconfirmed'): an agent write never
-- raises an item's source, whatever the proxy that planned it knew.
CREATE FUNCTION source_lower(was text, by text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN array_position(ARRAY['unconfirmed', 'agent', 'confirmed', 'user'], by)
                     < array_position(ARRAY['unconfirmed', 'agent', 'confirmed', 'user'], was)
                THEN by ELSE was END
$$;

-- untrusted_writes: what becomes of a tainted turn's write the user's words do not ground
-- ('propose', 'apply', 'refuse'; NULL: as the nearest ancestor that sets it, else the
-- deployment's UNTRUSTED_WRITES). tainted: a turn of the thread read untrusted content (it stays
-- so). client_tools: a turn of the thread carried the client's own tools. A thread stored before
-- is neither: what its earlier turns read was not classified.
ALTER TABLE threads ADD COLUMN untrusted_writes text
        CONSTRAINT threads_untrusted_writes_check CHECK (untrusted_writes IN ('propose', 'apply', 'refuse')),
    ADD COLUMN tainted boolean NOT NULL DEFAULT false,
    ADD COLUMN client_tools boolean NOT NULL DEFAULT false;

-- context: on an agent write's events, {tainted, grounded, ungrounded, nearest, sources}: what
-- its turn had read (docs/spec.md §19). NULL on others, and on those stored before. A thread's
-- untrusted_writes changes with an event of its own (untrusted_writes_set, target 'thread').
ALTER TABLE events ADD COLUMN context jsonb;
ALTER TABLE events DROP CONSTRAINT events_kind_check,
    ADD CONSTRAINT events_kind_check CHECK (kind IN ('objective_set', 'preference_added', 'preference_updated',
        'preference_locked', 'preference_unlocked', 'preference_removed', 'revert', 'locked_skip',
        'parents_set', 'agent_writes_set', 'proposed', 'proposal_dismissed', 'preference_moved',
        'compaction', 'untrusted_writes_set')) NOT VALID;

-- user_text: the user's words a Responses turn was given (its last two user messages, at most
-- 8 KB), which ground the writes of a turn that continues it with none of its own. '' for a
-- turn recorded before.
ALTER TABLE response_turns ADD COLUMN user_text text NOT NULL DEFAULT '';

-- A turn's snapshot keeps its objective's source (NULL: stored before, or no objective); its
-- preferences (and inherited ones) carry theirs.
ALTER TABLE workspace_snapshots ADD COLUMN objective_source text;

-- thread_inherited as in 012, each preference with its source.
CREATE OR REPLACE FUNCTION thread_inherited(ancestors text[]) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('scope', a.id, 'preferences',
               (SELECT coalesce(jsonb_agg(jsonb_build_object(
                           'id', p.id, 'title', p.title, 'subtitle', p.subtitle, 'kind', p.kind, 'locked', p.locked,
                           'source', p.source)
                           ORDER BY p.id), '[]'::jsonb)
                FROM preferences p WHERE p.thread_id = a.id)) ORDER BY a.n), '[]'::jsonb)
    FROM unnest(ancestors) WITH ORDINALITY AS a(id, n)
$$;

-- thread_untrusted_writes is the untrusted_writes in force for a thread whose own is own and
-- whose ancestors (thread_scope's, nearest first) are ancestors: its own, else the nearest
-- ancestor's that sets one; NULL for none (the deployment's default).
CREATE FUNCTION thread_untrusted_writes(ancestors text[], own text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(own, (SELECT t.untrusted_writes FROM unnest(ancestors) WITH ORDINALITY AS a(id, n)
                          JOIN threads t ON t.id = a.id
                          WHERE t.untrusted_writes IS NOT NULL ORDER BY a.n LIMIT 1))
$$;

-- unsourced is a snapshot's preferences (or inherited, [{scope, preferences}]) without their
-- sources: what a snapshot stored before this migration holds. A turn start compares the
-- workspace with such a snapshot as it would have before, so that upgrading stores no copy of a
-- workspace that did not change.
CREATE FUNCTION unsourced(j jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_agg(CASE WHEN e ? 'scope' THEN jsonb_set(e, '{preferences}', unsourced(e->'preferences'))
                                   ELSE e - 'source' END ORDER BY n), '[]'::jsonb)
    FROM jsonb_array_elements(j) WITH ORDINALITY AS a(e, n)
$$;

-- turn_start_with as in 017, and: reads_untrusted and has_client_tools say what the turn's request
-- holds (docs/spec.md §19), stored on the thread when they make it tainted or a client of its own
-- tools (the only time the start writes them); thread_tainted and thread_client_tools are what
-- the thread had before; objective_source is the objective's source as the snapshot keeps it, and
-- each snapshot preference carries its source (a snapshot stored before, which holds none, is
-- compared without them: unsourced). The three turn start functions are dropped and
-- made again with these columns; a replica of the previous version calls turn_start and
-- turn_start_unless_held as before (the new arguments have defaults) and reads the columns it
-- knows.
DROP FUNCTION turn_start_unless_held(text, text[], boolean);
DROP FUNCTION turn_start(text, text[], boolean);
DROP FUNCTION turn_start_with(text, text[], boolean, boolean);
CREATE FUNCTION turn_start_with(thread_id text, new_parents text[], parents_if_new boolean, wait boolean,
                                reads_untrusted boolean, has_client_tools boolean,
                                OUT turn integer, OUT objective text, OUT preferences jsonb, OUT created_at timestamptz,
                                OUT inherited jsonb, OUT agent_writes text, OUT refused text,
                                OUT version bigint, OUT next_preference_id bigint,
                                OUT objective_source text, OUT thread_tainted boolean, OUT thread_client_tools boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    thread_version bigint;
    thread_parents text[];
    own_agent_writes text;
    seen_parents text[];
    seen_turns integer;
    keys_held boolean := false;
    scope record;
    last_turn integer;
    last_version bigint;
    last_scope_versions bigint[];
    current_objective text;
    current_objective_source text;
    current_preferences jsonb;
    current_inherited jsonb;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF new_parents IS NOT NULL THEN
        SELECT t.parents, t.turns INTO seen_parents, seen_turns FROM threads t WHERE t.id = turn_start_with.thread_id;
        IF NOT FOUND OR (new_parents <> seen_parents AND (NOT parents_if_new OR seen_turns = 0)) THEN
            IF NOT thread_parents_lock(turn_start_with.thread_id, new_parents, wait) THEN
                RETURN; -- held
            END IF;
            keys_held := true;
        END IF;
    END IF;
    INSERT INTO threads AS th (id, turns) VALUES (turn_start_with.thread_id, 1)
    ON CONFLICT (id) DO UPDATE SET turns = th.turns + 1,
        updated_at = CASE WHEN th.updated_at < now() - interval '1 second' THEN now() ELSE th.updated_at END
    RETURNING th.turns, th.next_event_id, th.created_at, th.parents, th.agent_writes, th.next_preference_id,
              th.tainted, th.client_tools
    INTO turn, thread_version, created_at, thread_parents, own_agent_writes, next_preference_id,
         thread_tainted, thread_client_tools;
    IF turn = 1 THEN
        SELECT r.next_event_id, r.next_preference_id INTO thread_version, next_preference_id
        FROM thread_revive(turn_start_with.thread_id) r;
    END IF;
    IF new_parents IS NOT NULL AND new_parents <> thread_parents AND (turn = 1 OR NOT parents_if_new) THEN
        IF NOT keys_held THEN
            keys_held := thread_parents_lock(turn_start_with.thread_id, new_parents, false);
            IF NOT keys_held AND wait THEN
                RAISE EXCEPTION 'the parents of thread % changed while its turn began; try again', turn_start_with.thread_id
                    USING ERRCODE = '40001';
            END IF;
        END IF;
        IF keys_held THEN
            refused := thread_set_parents(turn_start_with.thread_id, new_parents, 'client', 'proxy');
        END IF;
        IF refused IS NOT NULL OR NOT keys_held THEN
            -- No turn (its parents refused, or their keys held): its number is given back (the row
            -- lock is held: no other turn took one).
            UPDATE threads t SET turns = t.turns - 1 WHERE t.id = turn_start_with.thread_id;
            IF turn = 1 THEN
                DELETE FROM threads t WHERE t.id = turn_start_with.thread_id AND t.next_event_id = thread_version
                    AND NOT EXISTS (SELECT FROM preferences p WHERE p.thread_id = t.id)
                    AND NOT EXISTS (SELECT FROM objectives o WHERE o.thread_id = t.id);
            END IF;
            turn := NULL;
            created_at := NULL;
            next_preference_id := NULL;
            thread_tainted := NULL;
            thread_client_tools := NULL;
            RETURN;
        END IF;
        SELECT t.next_event_id, t.parents INTO thread_version, thread_parents FROM threads t WHERE t.id = turn_start_with.thread_id;
    END IF;
    IF (reads_untrusted AND NOT thread_tainted) OR (has_client_tools AND NOT thread_client_tools) THEN
        UPDATE threads t SET tainted = t.tainted OR reads_untrusted, client_tools = t.client_tools OR has_client_tools
        WHERE t.id = turn_start_with.thread_id;
    END IF;
    version := thread_version;
    IF cardinality(thread_parents) = 0 THEN -- no ancestors: nothing to read
        SELECT '{}'::text[] AS ancestors, '{}'::bigint[] AS versions, coalesce(own_agent_writes, 'direct') AS agent_writes INTO scope;
    ELSE
        scope := thread_scope(turn_start_with.thread_id, thread_parents, own_agent_writes);
    END IF;
    agent_writes := scope.agent_writes;

    SELECT s.turn, s.version, s.scope_versions, s.objective, s.objective_source, s.preferences, s.inherited
    INTO last_turn, last_version, last_scope_versions, objective, objective_source, preferences, inherited
    FROM workspace_snapshots s WHERE s.thread_id = turn_start_with.thread_id
    ORDER BY s.turn DESC LIMIT 1;
    IF last_version = thread_version AND coalesce(last_scope_versions, '{}') = scope.versions THEN
        RETURN; -- unchanged since the last snapshot: its workspace
    END IF;

    SELECT o.text, o.source INTO current_objective, current_objective_source FROM objectives o WHERE o.thread_id = turn_start_with.thread_id;
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', p.id, 'title', p.title, 'subtitle', p.subtitle, 'kind', p.kind, 'locked', p.locked, 'source', p.source)
               ORDER BY p.id), '[]'::jsonb)
    INTO current_preferences FROM preferences p WHERE p.thread_id = turn_start_with.thread_id;
    IF cardinality(scope.ancestors) > 0 THEN
        current_inherited := thread_inherited(scope.ancestors);
    END IF;
    IF last_turn IS NOT NULL AND objective IS NOT DISTINCT FROM current_objective
       AND (objective_source IS NOT DISTINCT FROM current_objective_source OR objective_source IS NULL)
       AND (preferences = current_preferences OR preferences = unsourced(current_preferences))
       AND (inherited IS NOT DISTINCT FROM current_inherited OR inherited = unsourced(current_inherited)) THEN
        -- The same workspace (events that changed nothing): no new copy, the versions recorded.
        UPDATE workspace_snapshots s SET version = thread_version, scope_versions = scope.versions
        WHERE s.thread_id = turn_start_with.thread_id AND s.turn = last_turn;
        RETURN;
    END IF;
    INSERT INTO workspace_snapshots (thread_id, turn, version, objective, objective_source, preferences, inherited, scope_versions)
    VALUES (turn_start_with.thread_id, turn, thread_version, current_objective, current_objective_source, current_preferences,
            current_inherited, scope.versions);
    objective := current_objective;
    objective_source := current_objective_source;
    preferences := current_preferences;
    inherited := current_inherited;
END
$$;

-- turn_start is a turn start on its own (db.TurnStartWaiting, and replicas of the previous
-- version): turn_start_with, waiting.
CREATE FUNCTION turn_start(thread_id text, new_parents text[] DEFAULT NULL, parents_if_new boolean DEFAULT false,
                           reads_untrusted boolean DEFAULT false, has_client_tools boolean DEFAULT false,
                           OUT turn integer, OUT objective text, OUT preferences jsonb, OUT created_at timestamptz,
                           OUT inherited jsonb, OUT agent_writes text, OUT refused text,
                           OUT version bigint, OUT next_preference_id bigint,
                           OUT objective_source text, OUT thread_tainted boolean, OUT thread_client_tools boolean)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM turn_start_with(thread_id, new_parents, parents_if_new, true, reads_untrusted, has_client_tools)
$$;

-- turn_start_unless_held as in 017, with the columns of turn_start_with.
CREATE FUNCTION turn_start_unless_held(thread_id text, new_parents text[] DEFAULT NULL, parents_if_new boolean DEFAULT false,
                                       reads_untrusted boolean DEFAULT false, has_client_tools boolean DEFAULT false,
                                       OUT turn integer, OUT objective text, OUT preferences jsonb, OUT created_at timestamptz,
                                       OUT inherited jsonb, OUT agent_writes text, OUT refused text,
                                       OUT version bigint, OUT next_preference_id bigint,
                                       OUT objective_source text, OUT thread_tainted boolean, OUT thread_client_tools boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM FROM threads t WHERE t.id = turn_start_unless_held.thread_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND AND EXISTS (SELECT FROM threads t WHERE t.id = turn_start_unless_held.thread_id) THEN
        RETURN; -- held
    END IF;
    SELECT s.turn, s.objective, s.preferences, s.created_at, s.inherited, s.agent_writes, s.refused, s.version, s.next_preference_id,
           s.objective_source, s.thread_tainted, s.thread_client_tools
    INTO turn, objective, preferences, created_at, inherited, agent_writes, refused, version, next_preference_id,
         objective_source, thread_tainted, thread_client_tools
    FROM turn_start_with(turn_start_unless_held.thread_id, new_parents, parents_if_new, false, reads_untrusted, has_client_tools) s;
END
$$;
