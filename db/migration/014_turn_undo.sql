-- A turn that never reached its model is no turn (docs/spec.md §2): when a thread turn's first
-- upstream round fails (the upstream unreachable, or refusing the request, a
-- previous_response_id it does not know among the reasons), the edge gives the turn back.
-- turn_undo takes back its number when no later turn took one since (the thread's row lock
-- orders turn starts: a later start would have moved the count on), the snapshot it made, and
-- the thread itself when that turn created it and nothing has been written to it since (no
-- event, preference or objective, no thread naming it as a parent): the same test turn_start
-- makes when it gives back a turn whose parents it refused (012). The thread's tombstone, if it
-- had one, stays: a thread made again later still numbers on past it. A turn that did reach its
-- model keeps its number, failed or not.
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
