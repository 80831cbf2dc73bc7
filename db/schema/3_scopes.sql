-- Functions of scopes (docs/spec.md §17, §20): a thread's ancestors, what they give it, and a
-- change of its parents (1_tables.sql says how these files are read).

-- thread_client is the client whose namespace a stored thread id is in (client~thread), NULL for
-- a thread outside every client's namespace (the admin's).
CREATE FUNCTION thread_client(id text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN strpos(id, '~') > 0 THEN split_part(id, '~', 1) END
$$;

-- thread_visible says whether an ancestor reaches a thread of client (NULL: the admin's, which
-- every ancestor reaches): one of the client's own threads, or a thread of the admin's shared
-- with the client (shared_with, of a row the caller read). Another client's thread never does.
CREATE FUNCTION thread_visible(client text, ancestor text, shared_with text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT client IS NULL OR coalesce(thread_client(ancestor) = client, false)
        OR (thread_client(ancestor) IS NULL AND shared_with && ARRAY[client, '*'])
$$;

-- thread_scope is a thread's place among its scopes, as a turn or a tool call of it sees them,
-- from parents (its stored ones, or ones about to be stored): its ancestors, found breadth-first
-- and nearest first, each once at its nearest place, 8 at most; their versions (next_event_id, 0
-- for one that does not exist); and the review setting in force (its own, else the nearest
-- ancestor's, else 'direct'). cycle says the walk met the thread itself, more that it found a
-- ninth ancestor (a list thread_set_parents refuses). For a thread in a client's namespace, an
-- ancestor that does not reach it (thread_visible: another client's thread, or an admin's thread
-- not shared with its client, unshared since or never) is neither an ancestor nor walked through;
-- its parents reach the thread only by another way. So unsharing a scope ends what it gives at the
-- next turn of every thread that named it (their ancestors and versions change), and a shared
-- scope never carries another client's thread, or an admin's thread not shared, into a client's.
-- The walk is the one every parents check and lock takes (thread_set_parents,
-- thread_parents_lock): a cycle it does not see passes through a thread that no walk of the
-- client's reaches, and every walk keeps each thread once. One index probe per ancestor; none
-- without parents.
CREATE FUNCTION thread_scope(thread_id text, parents text[], own_agent_writes text,
                             OUT ancestors text[], OUT versions bigint[], OUT agent_writes text,
                             OUT cycle boolean, OUT more boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    client text := thread_client(thread_scope.thread_id);
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
            SELECT t.parents, t.next_event_id, t.agent_writes, t.shared_with INTO a FROM threads t WHERE t.id = p;
            CONTINUE WHEN client IS NOT NULL AND NOT thread_visible(client, p, coalesce(a.shared_with, '{}'));
            IF cardinality(ancestors) = 8 THEN
                more := true;
                EXIT;
            END IF;
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

-- thread_inherited is what ancestors hold: [{scope, preferences}] in their order, each list in
-- creation order, each preference with its source (a thread that does not exist holds none).
CREATE FUNCTION thread_inherited(ancestors text[]) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('scope', a.id, 'preferences',
               (SELECT coalesce(jsonb_agg(jsonb_build_object(
                           'id', p.id, 'title', p.title, 'subtitle', p.subtitle, 'kind', p.kind, 'locked', p.locked,
                           'source', p.source)
                           ORDER BY p.id), '[]'::jsonb)
                FROM preferences p WHERE p.thread_id = a.id)) ORDER BY a.n), '[]'::jsonb)
    FROM unnest(ancestors) WITH ORDINALITY AS a(id, n)
$$;

-- thread_untrusted_writes is the untrusted_writes in force for a thread whose own is own and whose
-- ancestors (thread_scope's, nearest first) are ancestors: its own, else the nearest ancestor's
-- that sets one; NULL for none (the deployment's default).
CREATE FUNCTION thread_untrusted_writes(ancestors text[], own text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(own, (SELECT t.untrusted_writes FROM unnest(ancestors) WITH ORDINALITY AS a(id, n)
                          JOIN threads t ON t.id = a.id
                          WHERE t.untrusted_writes IS NOT NULL ORDER BY a.n LIMIT 1))
$$;

-- A parents change of a thread holds its thread's key exclusively, and the key of each of its
-- ancestors as the new list makes them shared, until its transaction ends: transaction-scoped
-- advisory locks, keyed (classid 2004054136, "wspx" in ASCII, objid the id's hashtext) by thread
-- id. Two changes that would make a cycle only together each find the other's thread among their
-- ancestors (the first thread along the cycle whose change the other did not see is one of them:
-- the path to it is made of what that change saw), so the later of them waits for the earlier and
-- sees what it stored; two changes that share only ancestors (threads that name the same scopes)
-- hold those keys shared and never wait for each other. No lock is shared by every write: a
-- workspace write takes none, a turn start only when it stores parents, and then only the keys of
-- its thread and of that thread's ancestors. Two ids of one hash only share a lock.
--
-- thread_parents_lock takes them for thread_id about to store parents: it finds the ancestors
-- (thread_scope), takes the keys in the order of their values (own before another id of the same
-- value: exclusive before shared), then finds the ancestors again, which only a change holding a
-- key it now holds could have moved; when they grew meanwhile, it gives up this attempt's keys (a
-- subtransaction rolled back) and takes the larger set again, in order. So its waits are always
-- for a key above every key it holds: a waiting parents change never deadlocks another. wait false
-- takes none that another transaction holds: then it holds none of them and returns false. A
-- caller that waits does so before it locks any row: a parents change never waits for a key while
-- it holds a row (it tries the keys under a row lock, and gives up when one is held).
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

-- thread_set_parents stores a thread's parents (nearest first) when they differ from its stored
-- ones, as actor says, with a parents_set event (no NOTIFY: see thread_compacted); parents that do
-- not exist are created empty (past their tombstones). The caller holds the thread's row lock. It
-- refuses (returns the reason, changing nothing) a list that names the thread itself, names a
-- thread twice, makes a cycle or gives the thread more than 8 ancestors; NULL when stored or
-- unchanged. A thread in a client's namespace may name, besides its client's threads (created
-- when new), an admin's thread only when it exists and is shared with the client; any other name
-- is refused with 'not shared: <name>' before anything is created (the caller answers 404: for the
-- client the name does not exist, docs/spec.md §20). It holds the parents keys
-- (thread_parents_lock, taken without waiting: its caller took them before it locked any row; one
-- that did not, and finds a key held, gets SQLSTATE 40001 and nothing changed), so that its checks
-- see every parents change that could make a cycle with it; and it creates only the parents it
-- does not find, so that it waits for no parent's row an edit holds (a parent that another
-- transaction is creating at that moment is the one wait left).
CREATE FUNCTION thread_set_parents(thread_id text, parents text[], actor text, via text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    client text := thread_client(thread_set_parents.thread_id);
    stored text[];
    walk record;
    first bigint;
    p text;
BEGIN
    SELECT t.parents INTO stored FROM threads t WHERE t.id = thread_set_parents.thread_id;
    IF stored = parents THEN
        RETURN NULL;
    END IF;
    IF client IS NOT NULL THEN
        FOREACH p IN ARRAY parents LOOP
            IF thread_client(p) IS DISTINCT FROM client AND NOT EXISTS (
                SELECT FROM threads t WHERE t.id = p AND thread_visible(client, p, t.shared_with)) THEN
                RETURN 'not shared: ' || p;
            END IF;
        END LOOP;
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
    RETURN NULL;
END
$$;
