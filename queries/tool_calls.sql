-- name: ToolCallInsert :exec
INSERT INTO tool_calls (thread_id, turn, round, call_id, tool, arguments, action_and_reasoning, ok, result)
VALUES (@thread_id, @turn, @round, @call_id, @tool, @arguments, @action_and_reasoning, @ok, @result);

-- name: ToolCallListByThread :many
SELECT * FROM tool_calls
WHERE thread_id = @thread_id AND id > @after_id
ORDER BY id
LIMIT @max_rows;

-- name: ToolCallPrune :execrows
-- HISTORY_RETENTION: tool-call records older than the cutoff, but those another transaction
-- holds (as EventPrune).
DELETE FROM tool_calls
WHERE (thread_id, id) IN (SELECT o.thread_id, o.id FROM tool_calls o WHERE o.created_at < @cutoff FOR UPDATE SKIP LOCKED);
