-- turn_start_unless_held is turn_start (migration 006), unless another transaction holds the
-- thread's row (an edit, a tool call, a thread's deletion, a batch of usage): then it begins no
-- turn and returns at once, its turn null. Batches of turn starts call it, so that a held thread
-- delays none of the other threads in its batch; the proxy then starts the held thread's turn on
-- its own, waiting for the row (turn_start). It tries the lock turn_start's update takes (FOR NO
-- KEY UPDATE: a row held only for a foreign key's check, as an event's insert holds it, delays
-- nothing). A row locked by the calling transaction itself (an earlier start of the same batch)
-- is not held. A thread that another transaction is creating at that moment is the one wait left:
-- its row is not visible yet, and turn_start's insert waits for that transaction's end. Only an
-- added function: replicas of the previous version go on calling turn_start.
CREATE FUNCTION turn_start_unless_held(thread_id text, OUT turn integer, OUT objective text,
                                       OUT preferences jsonb, OUT created_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM FROM threads t WHERE t.id = turn_start_unless_held.thread_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND AND EXISTS (SELECT FROM threads t WHERE t.id = turn_start_unless_held.thread_id) THEN
        RETURN; -- held
    END IF;
    SELECT s.turn, s.objective, s.preferences, s.created_at INTO turn, objective, preferences, created_at
    FROM turn_start(turn_start_unless_held.thread_id) s;
END
$$;
