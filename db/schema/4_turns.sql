-- Functions of a turn's start and its give-back (docs/spec.md §2, §5, §17, §19). turn_start_with
-- is the one turn start; turn_start and turn_start_unless_held call it, waiting or not. The
-- queries TurnStartUnlessHeld and TurnStartsUnlessHeld (queries/threads.sql) begin the common
-- turn themselves, without these functions' PL/pgSQL statements: a thread with a snapshot of its
-- workspace as it stands and no ancestors; these functions begin every other. 1_tables.sql says
-- how these files are read.

-- turn_start_with begins a turn of thread_id: it creates the thread on its first turn (past its
-- id's tombstone: thread_revive), takes the next turn number under the thread's row lock (held
-- until the transaction ends: no edit of the workspace can commit in between), and returns the
-- workspace as it stood, its ancestors' included (thread_scope, thread_inherited), storing it as
-- the turn's snapshot when it differs from the last one: the snapshot is reused while neither the
-- thread nor any ancestor changed (their next_event_id, the snapshot's version and
-- scope_versions). It returns the thread's created_at, which tells one life of a thread id from
-- the next (a turn's tool calls run only against the thread its start saw); the review setting in
-- force; the workspace's version (the thread's next_event_id as the workspace was read) and the
-- thread's next preference id, on which the turn's first call is planned; the objective's source
-- (each snapshot preference carries its own; a snapshot stored without them is compared without
-- them: unsourced); and thread_tainted and thread_client_tools, what the thread had before.
-- reads_untrusted and has_client_tools say what the turn's request holds (docs/spec.md §19),
-- stored on the thread when they make it tainted or a client of its own tools (the only time the
-- start writes them). The calling transaction commits without waiting for the disk
-- (synchronous_commit off, for it alone). A volatile function: each of its statements sees what
-- committed before it, so the reads after the lock see every change committed before the turn.
-- updated_at (the admin listing's order) moves when it is a second old: a busy thread's turns
-- then change no indexed column, and its row is updated in place (HOT, no index entries).
--
-- new_parents (when not NULL: a turn's X-Workspace-Parents, or THREAD_PARENTS for a thread it
-- creates, parents_if_new) are stored first as thread_set_parents says, by the client; a list it
-- refuses begins no turn (refused says why, turn is NULL). A start that may store parents (the
-- thread is new, or the list differs from the stored one as last committed) takes the parents
-- keys (thread_parents_lock) before it locks the thread's row: waiting for them, or, with wait
-- false, returning at once when one is held (turn NULL and refused NULL: held, as a held row is;
-- nothing begun). A start that finds, under its row lock, that it must store parents after all
-- (they changed since it looked) tries the keys; when one is held it gives its turn back and
-- returns held, or with wait true fails with SQLSTATE 40001 (a turn start on its own is tried
-- again).
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

-- turn_start is a turn start on its own (db.TurnStartWaiting): turn_start_with, waiting.
CREATE FUNCTION turn_start(thread_id text, new_parents text[] DEFAULT NULL, parents_if_new boolean DEFAULT false,
                           reads_untrusted boolean DEFAULT false, has_client_tools boolean DEFAULT false,
                           OUT turn integer, OUT objective text, OUT preferences jsonb, OUT created_at timestamptz,
                           OUT inherited jsonb, OUT agent_writes text, OUT refused text,
                           OUT version bigint, OUT next_preference_id bigint,
                           OUT objective_source text, OUT thread_tainted boolean, OUT thread_client_tools boolean)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM turn_start_with(thread_id, new_parents, parents_if_new, true, reads_untrusted, has_client_tools)
$$;

-- turn_start_unless_held is turn_start, unless another transaction holds the thread's row (an
-- edit, a tool call, a thread's deletion) or a key of a parents change it would make: then it
-- begins no turn and returns at once, its turn null (turn_start_with without waiting). Batches of
-- turn starts call it, so that a held thread delays none of the other threads in its batch; the
-- proxy then starts the held thread's turn on its own, waiting (turn_start). It tries the lock
-- turn_start_with's update takes (FOR NO KEY UPDATE: a row held only for a foreign key's check,
-- as an event's insert holds it, delays nothing). A row locked by the calling transaction itself
-- (an earlier start of the same batch) is not held. A thread that another transaction is creating
-- at that moment is the one wait left: its row is not visible yet, and turn_start_with's insert
-- waits for that transaction's end.
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

-- turn_undo(thread_id, turn) gives back a turn of whichever thread has the id now, and only the
-- thread its first turn created: what replicas of versions before turn_undo(thread_id, turn,
-- created_at) call (docs/spec.md §2). It takes back the turn's number when no later turn took
-- one since (the thread's row lock orders turn starts: a later start would have moved the count
-- on), the snapshot it made, and the thread itself when that turn created it and nothing has been
-- written to it since (no event, preference or objective, no thread naming it as a parent).
CREATE FUNCTION turn_undo(thread_id text, turn integer) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE threads t SET turns = t.turns - 1 WHERE t.id = turn_undo.thread_id AND t.turns = turn_undo.turn;
    IF NOT FOUND THEN
        RETURN; -- a later turn began, or the thread is gone: nothing to give back
    END IF;
    DELETE FROM workspace_snapshots s WHERE s.thread_id = turn_undo.thread_id AND s.turn = turn_undo.turn;
    IF turn_undo.turn = 1 THEN
        DELETE FROM threads t WHERE t.id = turn_undo.thread_id AND t.turns = 0
            AND NOT EXISTS (SELECT FROM events e WHERE e.thread_id = t.id)
            AND NOT EXISTS (SELECT FROM preferences p WHERE p.thread_id = t.id)
            AND NOT EXISTS (SELECT FROM objectives o WHERE o.thread_id = t.id)
            AND NOT EXISTS (SELECT FROM threads c WHERE t.id = ANY (c.parents));
    END IF;
END
$$;

-- turn_undo gives back a turn that never reached its model, or whose caller gave up (docs/spec.md
-- §2), of the thread it began on: created_at names its life (a thread deleted and created again
-- under its id while the turn waited for its model is another, and nothing of it is given back).
-- It takes back the turn's number when no later turn took one since (the thread's row lock orders
-- turn starts: a later start would have moved the count on) and the snapshot it made. A first
-- turn takes with it what its start made: the thread, when nothing but the client's parents_set
-- events (its start's) was written to it — no other event, preference, objective, tool call or
-- link — and no thread names it as a parent; and then each parent those events named that was
-- created with the thread (in the same transaction: its created_at) and is still as it was made —
-- no turn, event, preference, objective, tool call, link, parents or review setting of its own,
-- and no other thread naming it. The thread's tombstone, if it had one, stays: a thread made again
-- later still numbers on past it. Nothing it removes can be written meanwhile, and it waits for
-- nothing: the thread's row is locked by its first statement (every workspace write locks it
-- first), a parent's row is locked unless another transaction holds it (then it stays), and a
-- thread or parent is removed only under its parents key (taken unless held: a parents change
-- naming it holds that key until it commits).
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
