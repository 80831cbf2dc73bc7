-- Every table carries thread_id and every key includes it, so the tables can be distributed by
-- thread (Citus) or threads split across databases without changing a query.

CREATE TABLE threads (
    id           text        PRIMARY KEY,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- turns counts the thread's chat turns; the last turn's number.
    turns        integer     NOT NULL DEFAULT 0,
    -- next_preference_id is the id the thread's next preference gets: preference ids are
    -- per thread, never reused, and increase in creation order.
    next_preference_id bigint NOT NULL DEFAULT 1
);

-- Admin listing: most recently updated first, id as the tie-breaker.
CREATE INDEX threads_updated_at_idx ON threads (updated_at DESC, id DESC);

CREATE TABLE objectives (
    thread_id  text        PRIMARY KEY REFERENCES threads (id) ON DELETE CASCADE,
    text       text        NOT NULL,
    updated_by text        NOT NULL CHECK (updated_by IN ('agent', 'user')),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE preferences (
    thread_id  text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    -- id is stable and doubles as the creation-order position: a thread's list is ORDER BY id.
    id         bigint      NOT NULL,
    title      text        NOT NULL,
    subtitle   text        NOT NULL DEFAULT '',
    kind       text        NOT NULL CHECK (kind IN ('hard', 'soft')),
    locked     boolean     NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, id)
);

CREATE TABLE workspace_snapshots (
    thread_id   text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    turn        integer     NOT NULL,
    objective   text,
    preferences jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, turn)
);

CREATE TABLE tool_calls (
    thread_id            text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id                   bigint      GENERATED ALWAYS AS IDENTITY,
    turn                 integer     NOT NULL,
    round                integer     NOT NULL,
    tool                 text        NOT NULL,
    -- arguments as the model sent them: the JSON value, or a JSON string of the raw text when
    -- it was not JSON.
    arguments            jsonb       NOT NULL,
    action_and_reasoning text        NOT NULL DEFAULT '',
    ok                   boolean     NOT NULL,
    -- result is the envelope the model got back.
    result               jsonb       NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, id)
);
