-- No workspace write takes a lock shared by the whole database (docs/spec.md §13): a NOTIFY in a
-- writing transaction holds PostgreSQL's notification queue lock from its pre-commit to the end
-- of its commit, so every notifying commit of every replica waited for the one before it and its
-- flush. Each replica now follows the threads it watches by their next_event_id (eventhub), and
-- the functions that append events no longer notify: thread_set_parents as in 017, and
-- thread_compacted as in 013, each without its pg_notify. Nothing stored changes.

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
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION thread_compacted(thread_id text) RETURNS bigint
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
    RETURN event_id;
END
$$;
