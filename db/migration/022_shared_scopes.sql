-- Shared scopes (docs/spec.md §20): a workspace outside any client's namespace (the admin's) that
-- the admin shares with clients, which name it among their threads' parents as ~name. It stays
-- read-only to them: its items reach their threads' blocks, nothing of theirs writes it.
--
-- shared_with holds the names of the clients it is shared with, or '*' for every client ('{}':
-- none, what every thread had before). Adding the column with a constant default rewrites no
-- row. A change of it is an event (shared_with_set), so that the threads that inherit it see a
-- new version of their ancestors at their next turn.
ALTER TABLE threads ADD COLUMN shared_with text[] NOT NULL DEFAULT '{}';
ALTER TABLE events DROP CONSTRAINT events_kind_check,
    ADD CONSTRAINT events_kind_check CHECK (kind IN ('objective_set', 'preference_added', 'preference_updated',
        'preference_locked', 'preference_unlocked', 'preference_removed', 'revert', 'locked_skip',
        'parents_set', 'agent_writes_set', 'proposed', 'proposal_dismissed', 'preference_moved',
        'compaction', 'untrusted_writes_set', 'shared_with_set')) NOT VALID;

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

-- thread_scope as in 012, and: for a thread in a client's namespace, an ancestor that does not
-- reach it (thread_visible: another client's thread, or an admin's thread not shared with its
-- client, unshared since or never) is neither an ancestor nor walked through; its parents reach
-- the thread only by another way. So unsharing a scope ends what it gives at the next turn of
-- every thread that named it (their ancestors and versions change), and a shared scope never
-- carries another client's thread, or an admin's thread not shared, into a client's. The walk is
-- the one every parents check and lock takes (thread_set_parents, thread_parents_lock): a cycle
-- it does not see passes through a thread that no walk of the client's reaches, and every walk
-- keeps each thread once. Still one index probe per ancestor.
CREATE OR REPLACE FUNCTION thread_scope(thread_id text, parents text[], own_agent_writes text,
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

-- thread_set_parents as in 018, and: a thread in a client's namespace may name, besides its
-- client's threads (created when new), an admin's thread only when it exists and is shared with
-- the client; any other name is refused with 'not shared: <name>' before anything is created
-- (the caller answers 404: for the client the name does not exist, docs/spec.md §20).
CREATE OR REPLACE FUNCTION thread_set_parents(thread_id text, parents text[], actor text, via text) RETURNS text
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
