-- name: ResponseTurnRecord :exec
-- Records which upstream response ended a Responses turn, and the user's words it was given
-- (docs/spec.md §19). An id seen again (a stateless server that reuses ids) takes the latest turn.
INSERT INTO response_turns (thread_id, response_id, turn, last_response_id, owed_call_ids, user_text)
VALUES (@thread_id, @response_id, @turn, @last_response_id, @owed_call_ids::text[], @user_text)
ON CONFLICT (thread_id, response_id) DO UPDATE
SET turn = excluded.turn, last_response_id = excluded.last_response_id,
    owed_call_ids = excluded.owed_call_ids, user_text = excluded.user_text, created_at = now();

-- name: ResponseTurnContinuation :many
-- What continuing a Responses turn takes: the upstream response that ended it, and one row per
-- workspace call it owes the upstream an output for, with that call's latest record (null when
-- the call was not run); or one row with an empty call_id when it owes none. A call is that
-- turn's own (an upstream may reuse call ids in other turns). user_text is the user's words the
-- turn was given.
SELECT r.last_response_id, coalesce(o.call_id, '')::text AS call_id, tc.result, r.user_text
FROM response_turns r
LEFT JOIN LATERAL unnest(r.owed_call_ids) AS o (call_id) ON true
LEFT JOIN LATERAL (
    SELECT c.result FROM tool_calls c
    WHERE c.thread_id = r.thread_id AND c.turn = r.turn AND c.call_id = o.call_id
    ORDER BY c.id DESC
    LIMIT 1
) tc ON true
WHERE r.thread_id = @thread_id AND r.response_id = @response_id;

-- name: ResponseTurnPrune :execrows
-- HISTORY_RETENTION: records of turns older than the cutoff, but those another transaction
-- holds (as EventPrune).
DELETE FROM response_turns
WHERE (thread_id, response_id) IN (
    SELECT o.thread_id, o.response_id FROM response_turns o WHERE o.created_at < @before FOR UPDATE SKIP LOCKED);
