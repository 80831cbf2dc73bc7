-- Change history (SPEC §13): one event per change of a workspace, by the agent or a user,
-- written in the change's transaction. Existing threads start with an empty history.

-- next_event_id is the id the thread's next event gets: taken under the thread's row lock, so
-- a thread's events commit in id order.
ALTER TABLE threads ADD COLUMN next_event_id bigint NOT NULL DEFAULT 1;

CREATE TABLE events (
    thread_id    text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id           bigint      NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    actor        text        NOT NULL CHECK (actor IN ('agent', 'user')),
    -- turn, round, tool_call_id and reason are the agent's: null for a user's change.
    turn         integer,
    round        integer,
    tool_call_id bigint,
    reason       text,
    kind         text        NOT NULL CHECK (kind IN ('objective_set', 'preference_added', 'preference_updated',
                     'preference_locked', 'preference_unlocked', 'preference_removed', 'revert', 'locked_skip')),
    -- target: the objective (target_id null) or a preference by its stable id.
    target_type  text        NOT NULL CHECK (target_type IN ('objective', 'preference')),
    target_id    bigint,
    -- before and after: the target's fields, null where it did not exist.
    before       jsonb,
    after        jsonb,
    -- reverts: the event a revert undid.
    reverts      bigint,
    PRIMARY KEY (thread_id, id)
);

-- A target's history, and retention by age.
CREATE INDEX events_target_idx ON events (thread_id, target_type, target_id, id);
CREATE INDEX events_at_idx ON events (at);
