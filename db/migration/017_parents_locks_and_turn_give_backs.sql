-- Parents changes that never make a cycle together, turn starts that wait for no parent's row,
-- and turns given back by the thread they began on, with what their start made (docs/spec.md
-- §2, §17). Only functions change: tables and rows stay as they are, and the functions a replica
-- of the previous version calls keep their signatures (turn_undo(text, integer) stays as 014
-- made it, for those replicas alone).

-- A parents change of a thread holds its thread's key exclusively, and the key of each of its
-- ancestors as the new list makes them shared, until its transaction ends: transaction-scoped
-- advisory locks, keyed (classid 2004054136, "wspx" in ASCII, objid the id's hashtext) by thread
-- id. Two changes that would make a cycle only together each find the other's thread among their
-- ancestors (the first thread along the cycle whose change the other did not see is one of them:
-- the path to it is made of what that change saw), so the later of them waits for the earlier
-- and sees what it stored; two changes that share only ancestors (threads that name the same
-- scopes) hold those keys shared and never wait for each other. No lock is shared by every write:
-- a workspace write takes none, a turn start only when it stores parents, and then only the keys
-- of its thread and of that thread's ancestors. Two ids of one hash only share a lock.
--
-- thread_parents_lock takes them for thread_id about to store parents: it finds the ancestors
-- (thread_scope), takes the keys in the order of their values (own before another id of the same
-- value: exclusive before shared), then finds the ancestors again, which only a change holding a
-- key it now holds could have moved; when they grew meanwhile, it gives up this attempt's keys (a
-- subtransaction rolled back) and takes the larger set again, in order. So its waits are always
-- for a key above every key it holds: a waiting parents change never deadlocks another. wait
-- false takes none that another transaction holds: then it holds none of them and returns false.
-- A caller that waits does so before it locks any row: a parents change never waits for a key
-- while it holds a row (it tries the keys under a row lock, and gives up when one is held).
CREATE FUNCTION thread_parents_lock(thread_id text, parents text[], wait boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    want text[] := '{}';
    found text[];
    k text;
BEGIN
    found := (thread_scope(thread_parents_lock.thread_id, parents, NULL)).ancestors;
    LOOP
        want := ARRAY(SELECT DISTINCT a FROM unnest(want || found) a);
        BEGIN
            FOR k IN SELECT a FROM unnest(want || thread_parents_lock.thread_id) a
                     ORDER BY hashtext(a), a <> thread_parents_lock.thread_id LOOP
                IF k = thread_parents_lock.thread_id THEN
                    IF wait THEN
                        PERFORM pg_advisory_xact_lock(2004054136, hashtext(k));
                    ELSIF NOT pg_try_advisory_xact_lock(2004054136, hashtext(k)) THEN
                        RAISE EXCEPTION USING ERRCODE = 'WS423';
                    END IF;
                ELSIF wait THEN
                    PERFORM pg_advisory_xact_lock_shared(2004054136, hashtext(k));
                ELSIF NOT pg_try_advisory_xact_lock_shared(2004054136, hashtext(k)) THEN
                    RAISE EXCEPTION USING ERRCODE = 'WS423';
                END IF;
            END LOOP;
            found := (thread_scope(thread_parents_lock.thread_id, parents, NULL)).ancestors;
            IF found <@ want THEN
                RETURN true;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'WS412'; -- the ancestors grew: again, from none held
        EXCEPTION
            WHEN SQLSTATE 'WS423' THEN
                RETURN false;
            WHEN SQLSTATE 'WS412' THEN
                NULL;
        END;
    END LOOP;
END
$$;

-- thread_set_parents as in 012, and: it holds the parents keys (thread_parents_lock, taken
-- without waiting: its caller took them before it locked any row; one that did not, and finds a
-- key held, gets SQLSTATE 40001 and nothing changed), so that its checks see every parents change
-- that could make a cycle with it; and it creates only the parents it does not find, so that it
-- waits for no parent's row an edit holds (a parent that another transaction is creating at that
-- moment is the one wait left).
CREATE OR REPLACE FUNCTION thread_set_parents(thread_id text, parents text[], actor text, via text) RETURNS text
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
    IF NOT thread_parents_lock(thread_set_parents.thread_id, parents, false) THEN
        RAISE EXCEPTION 'the parents of thread % or of its ancestors are changing; try again', thread_set_parents.thread_id
            USING ERRCODE = '40001';
    END IF;
    walk := thread_scope(thread_set_parents.thread_id, parents, NULL);
    IF walk.cycle THEN
        RETURN 'a cycle: the thread would be its own ancestor';
    END IF;
    IF walk.more THEN
        RETURN 'more than 8 ancestors';
    END IF;
    FOREACH p IN ARRAY parents LOOP
        INSERT INTO threads (id) SELECT p WHERE NOT EXISTS (SELECT FROM threads t WHERE t.id = p)
        ON CONFLICT (id) DO NOTHING;
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

-- turn_start_with is turn_start (015) with wait: false for a batch of turn starts (through
-- turn_start_unless_held), true for a start on its own (turn_start). A start that may store
-- parents (the thread is new, or the list differs from the stored one as last committed) takes
-- the parents keys before it locks the thread's row: waiting for them, or, with wait false,
-- returning at once when one is held (turn NULL and refused NULL: held, as a held row is; nothing
-- begun). A start that finds, under its row lock, that it must store parents after all (they
-- changed since it looked) tries the keys; when one is held it gives its turn back and returns
-- held, or with wait true fails with SQLSTATE 40001 (a turn start on its own is tried again).
CREATE FUNCTION turn_start_with(thread_id text, new_parents text[], parents_if_new boolean, wait boolean,
                                OUT turn integer, OUT objective text, OUT preferences jsonb, OUT created_at timestamptz,
                                OUT inherited jsonb, OUT agent_writes text, OUT refused text,
                                OUT version bigint, OUT next_preference_id bigint)
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
    RETURNING th.turns, th.next_event_id, th.created_at, th.parents, th.agent_writes, th.next_preference_id
    INTO turn, thread_version, created_at, thread_parents, own_agent_writes, next_preference_id;
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
            RETURN;
        END IF;
        SELECT t.next_event_id, t.parents INTO thread_version, thread_parents FROM threads t WHERE t.id = turn_start_with.thread_id;
    END IF;
    version := thread_version;
    IF cardinality(thread_parents) = 0 THEN -- no ancestors: nothing to read
        SELECT '{}'::text[] AS ancestors, '{}'::bigint[] AS versions, coalesce(own_agent_writes, 'direct') AS agent_writes INTO scope;
    ELSE
        scope := thread_scope(turn_start_with.thread_id, thread_parents, own_agent_writes);
    END IF;
    agent_writes := scope.agent_writes;

    SELECT s.turn, s.version, s.scope_versions, s.objective, s.preferences, s.inherited
    INTO last_turn, last_version, last_scope_versions, objective, preferences, inherited
    FROM workspace_snapshots s WHERE s.thread_id = turn_start_with.thread_id
    ORDER BY s.turn DESC LIMIT 1;
    IF last_version = thread_version AND coalesce(last_scope_versions, '{}') = scope.versions THEN
        RETURN; -- unchanged since the last snapshot: its workspace
    END IF;

    SELECT o.text INTO current_objective FROM objectives o WHERE o.thread_id = turn_start_with.thread_id;
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', p.id, 'title', p.title, 'subtitle', p.subtitle, 'kind', p.kind, 'locked', p.locked)
               ORDER BY p.id), '[]'::jsonb)
    INTO current_preferences FROM preferences p WHERE p.thread_id = turn_start_with.thread_id;
    IF cardinality(scope.ancestors) > 0 THEN
        current_inherited := thread_inherited(scope.ancestors);
    END IF;
    IF last_turn IS NOT NULL AND objective IS NOT DISTINCT FROM current_objective AND preferences = current_preferences
       AND inherited IS NOT DISTINCT FROM current_inherited THEN
        -- The same workspace (events that changed nothing): no new copy, the versions recorded.
        UPDATE workspace_snapshots s SET version = thread_version, scope_versions = scope.versions
        WHERE s.thread_id = turn_start_with.thread_id AND s.turn = last_turn;
        RETURN;
    END IF;
    INSERT INTO workspace_snapshots (thread_id, turn, version, objective, preferences, inherited, scope_versions)
    VALUES (turn_start_with.thread_id, turn, thread_version, current_objective, current_preferences, current_inherited, scope.versions);
    objective := current_objective;
    preferences := current_preferences;
    inherited := current_inherited;
END
$$;

-- turn_start is a turn start on its own (db.TurnStartWaiting, and replicas of the previous
-- version): turn_start_with, waiting.
CREATE OR REPLACE FUNCTION turn_start(thread_id text, new_parents text[] DEFAULT NULL, parents_if_new boolean DEFAULT false,
                                      OUT turn integer, OUT objective text, OUT preferences jsonb, OUT created_at timestamptz,
                                      OUT inherited jsonb, OUT agent_writes text, OUT refused text,
                                      OUT version bigint, OUT next_preference_id bigint)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM turn_start_with(thread_id, new_parents, parents_if_new, true)
$$;

-- turn_start_unless_held as in 015, its turn begun by turn_start_with without waiting: a batch
-- of turn starts waits neither for a held thread's row nor for a parents change under way.
CREATE OR REPLACE FUNCTION turn_start_unless_held(thread_id text, new_parents text[] DEFAULT NULL, parents_if_new boolean DEFAULT false,
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
    FROM turn_start_with(turn_start_unless_held.thread_id, new_parents, parents_if_new, false) s;
END
$$;

-- turn_undo as in 014, for the thread the turn began on: created_at names its life (a thread
-- deleted and created again under its id while the turn waited for its model is another, and
-- nothing of it is given back). A first turn takes with it what its start made: the thread, when
-- nothing but the client's parents_set events (its start's) was written to it — no other event,
-- preference, objective, tool call or link — and no thread names it as a parent; and then each
-- parent those events named that was created with the thread (in the same transaction: its
-- created_at) and is still as it was made — no turn, event, preference, objective, tool call,
-- link, parents or review setting of its own, and no other thread naming it. Nothing it removes
-- can be written meanwhile, and it waits for nothing: the thread's row is locked by its first
-- statement (every workspace write locks it first), a parent's row is locked unless another
-- transaction holds it (then it stays), and a thread or parent is removed only under its parents
-- key (taken unless held: a parents change naming it holds that key until it commits).
CREATE FUNCTION turn_undo(thread_id text, turn integer, created_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    named text[];
    parent text;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE threads t SET turns = t.turns - 1
    WHERE t.id = turn_undo.thread_id AND t.turns = turn_undo.turn AND t.created_at = turn_undo.created_at;
    IF NOT FOUND THEN
        RETURN; -- a later turn began, or the thread is gone (or is another): nothing to give back
    END IF;
    DELETE FROM workspace_snapshots s WHERE s.thread_id = turn_undo.thread_id AND s.turn = turn_undo.turn;
    IF turn_undo.turn <> 1 OR NOT pg_try_advisory_xact_lock(2004054136, hashtext(turn_undo.thread_id)) THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(DISTINCT n), '{}') INTO named
    FROM events e, jsonb_array_elements_text(e.after->'parents') n
    WHERE e.thread_id = turn_undo.thread_id AND e.kind = 'parents_set' AND e.actor = 'client';
    DELETE FROM threads t WHERE t.id = turn_undo.thread_id AND t.turns = 0
        AND NOT EXISTS (SELECT FROM events e WHERE e.thread_id = t.id AND NOT (e.kind = 'parents_set' AND e.actor = 'client'))
        AND NOT EXISTS (SELECT FROM preferences p WHERE p.thread_id = t.id)
        AND NOT EXISTS (SELECT FROM objectives o WHERE o.thread_id = t.id)
        AND NOT EXISTS (SELECT FROM tool_calls c WHERE c.thread_id = t.id)
        AND NOT EXISTS (SELECT FROM links l WHERE l.thread_id = t.id)
        AND NOT EXISTS (SELECT FROM threads c WHERE t.id = ANY (c.parents));
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOREACH parent IN ARRAY named LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(2004054136, hashtext(parent));
        PERFORM FROM threads s WHERE s.id = parent AND s.created_at = turn_undo.created_at FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        DELETE FROM threads s WHERE s.id = parent AND s.turns = 0 AND cardinality(s.parents) = 0 AND s.agent_writes IS NULL
            AND NOT EXISTS (SELECT FROM events e WHERE e.thread_id = s.id)
            AND NOT EXISTS (SELECT FROM preferences x WHERE x.thread_id = s.id)
            AND NOT EXISTS (SELECT FROM objectives o WHERE o.thread_id = s.id)
            AND NOT EXISTS (SELECT FROM tool_calls c WHERE c.thread_id = s.id)
            AND NOT EXISTS (SELECT FROM links l WHERE l.thread_id = s.id)
            AND NOT EXISTS (SELECT FROM threads c WHERE s.id = ANY (c.parents));
    END LOOP;
END
$$;
