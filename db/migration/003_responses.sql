-- The Responses API (SPEC §12). Existing threads start with no recorded Responses turns.

-- response_turns records every Responses turn: the id its client got (the turn's first upstream
-- response) and the upstream response that ended it, so that a client continuing from any turn
-- (previous_response_id) continues from everything the model saw. owed_call_ids are the
-- workspace calls of that last response whose outputs the upstream has not been sent (the turn
-- ended on the client's calls); a continuation sends them first.
CREATE TABLE response_turns (
    thread_id        text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    response_id      text        NOT NULL,
    turn             integer     NOT NULL,
    last_response_id text        NOT NULL,
    owed_call_ids    text[]      NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, response_id)
);

-- call_id is the id the model gave a call (a chat tool_call's id, a Responses call_id); '' for
-- calls recorded before this column. A thread's calls are found through the primary key's
-- thread_id, so no index of its own.
ALTER TABLE tool_calls ADD COLUMN call_id text NOT NULL DEFAULT '';
