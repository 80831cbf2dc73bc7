-- Responses continued and referenced only by the client whose requests made them (docs/spec.md
-- §12, with CLIENT_KEYS). Existing deployments start with none recorded: a client's
-- previous_response_id or item reference of a response made before the upgrade is a 404, as
-- another client's is.

-- client_responses records, per client, the ids of the responses made through wsproxy for it
-- and of their output items — pass-through requests and thread turns alike, read from the
-- answers as they pass. A request of the client may continue from (previous_response_id) or
-- reference (an input item's id) only these. It is keyed by client, not thread: a pass-through
-- request has no thread, and a client may continue on a thread what it began without one. Under
-- Citus, distribute it by client (docs/scaling.md).
CREATE TABLE client_responses (
    client     text        NOT NULL,
    id         text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (client, id)
);

-- Retention by age (HISTORY_RETENTION), for these and the Responses turns.
CREATE INDEX client_responses_created_at_idx ON client_responses (created_at);
CREATE INDEX response_turns_created_at_idx ON response_turns (created_at);
