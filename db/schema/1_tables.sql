-- The schema as db/migration/ leaves it, each table, index and function once: what sqlc reads
-- (sqlc.yaml), and what a reader reads. The migrations stay the upgrade path (db.Migrate); a
-- change of the schema is a new migration and the same change here, and TestSchemaFiles
-- (db/schema_test.go) checks that a database migrated from empty equals one built from these
-- files, executed in the order of their names (tables first: a function of LANGUAGE sql is
-- checked against them when it is created). schema_migrations is Migrate's own and is not here.
--
-- Columns are in the order the migrations leave them, each added at its table's end: a row's
-- columns (SELECT *, and sqlc's structs) come in that order.
--
-- Every table that belongs to a thread carries thread_id and every key of it includes it, so the
-- tables can be distributed by thread (Citus) or threads split across databases without changing
-- a query (docs/scaling.md).

CREATE TABLE threads (
    id                   text        PRIMARY KEY,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    -- turns counts the thread's chat turns; the last turn's number.
    turns                integer     NOT NULL DEFAULT 0,
    -- next_preference_id is the id the thread's next preference gets: preference ids are per
    -- thread, never reused, and increase in creation order.
    next_preference_id   bigint      NOT NULL DEFAULT 1,
    -- Usage (docs/spec.md §8): what the upstream reported for the thread's turns, in tokens. A
    -- thread's usage is these totals (what thread_usage's stale writer rows were folded into) plus
    -- its rows of thread_usage.
    prompt_tokens        bigint      NOT NULL DEFAULT 0,
    cached_prompt_tokens bigint      NOT NULL DEFAULT 0,
    completion_tokens    bigint      NOT NULL DEFAULT 0,
    -- next_event_id is the id the thread's next event gets, taken under the thread's row lock, so
    -- that a thread's events commit in id order: the workspace's version, which every change of
    -- the workspace moves on.
    next_event_id        bigint      NOT NULL DEFAULT 1,
    -- Prompt tokens written to the upstream's prompt cache (docs/spec.md §14: the Messages API's
    -- cache_creation_input_tokens, billed above the input price); part of prompt_tokens, as
    -- cached_prompt_tokens (the tokens read from the cache) are.
    cache_write_tokens   bigint      NOT NULL DEFAULT 0,
    -- Scopes (docs/spec.md §17): a scope is a thread like any other, that other threads name among
    -- their parents (nearest first, the parents' stored ids, in the thread's own client
    -- namespace).
    parents              text[]      NOT NULL DEFAULT '{}',
    -- The workspace's review setting: 'direct' (the tools write), 'propose' (every change a tool
    -- would make becomes a proposal the user decides), or NULL: as the nearest ancestor that sets
    -- it, else 'direct'.
    agent_writes         text        CHECK (agent_writes IN ('direct', 'propose')),
    -- What becomes of a tainted turn's write the user's words do not ground (docs/spec.md §19):
    -- 'propose', 'apply', 'refuse', or NULL: as the nearest ancestor that sets it, else the
    -- deployment's UNTRUSTED_WRITES.
    untrusted_writes     text        CHECK (untrusted_writes IN ('propose', 'apply', 'refuse')),
    -- tainted: a turn of the thread read untrusted content (it stays so). client_tools: a turn of
    -- the thread carried the client's own tools. A thread whose turns all came before migration
    -- 019 is neither: what they read was not classified.
    tainted              boolean     NOT NULL DEFAULT false,
    client_tools         boolean     NOT NULL DEFAULT false,
    -- Shared scopes (docs/spec.md §20): the names of the clients a thread outside every client's
    -- namespace (the admin's) is shared with, or '*' for every client ('{}': none). A change of it
    -- is an event (shared_with_set), so that the threads that inherit it see a new version of
    -- their ancestors at their next turn.
    shared_with          text[]      NOT NULL DEFAULT '{}',
    -- What tells threads apart in the panel's list (docs/spec.md §13, §17): title, the name the
    -- user gives it (NULL none); agent, the User-Agent of the request of its first turn, and
    -- first_words, the user's own words in it (each cut to 200 characters; NULL for a thread whose
    -- first turn came before migration 023, or that the user path made). None of them is the
    -- workspace: no event records them, and updated_at does not move for them.
    title                text,
    agent                text,
    first_words          text
);

-- Admin listing: most recently updated first, id as the tie-breaker.
CREATE INDEX threads_updated_at_idx ON threads (updated_at DESC, id DESC);
-- A scope's children (GET …/children): the threads whose parents name it.
CREATE INDEX threads_parents_idx ON threads USING gin (parents);

-- source, of an objective and of a preference (docs/spec.md §19): 'user' (written or edited by
-- the user path), 'confirmed' (a proposal the user applied, or an agent's item the user locked),
-- 'agent' (an agent write that was not tainted, or grounded), 'unconfirmed' (applied under
-- untrusted_writes 'apply' from a tainted, ungrounded write).
CREATE TABLE objectives (
    thread_id  text        PRIMARY KEY REFERENCES threads (id) ON DELETE CASCADE,
    text       text        NOT NULL,
    updated_by text        NOT NULL CHECK (updated_by IN ('agent', 'user')),
    updated_at timestamptz NOT NULL DEFAULT now(),
    source     text        NOT NULL DEFAULT 'agent' CHECK (source IN ('user', 'confirmed', 'agent', 'unconfirmed'))
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
    source     text        NOT NULL DEFAULT 'agent' CHECK (source IN ('user', 'confirmed', 'agent', 'unconfirmed')),
    PRIMARY KEY (thread_id, id)
);

-- A turn's snapshot of the workspace its block showed (turn_start_with, 4_turns.sql): stored
-- when the workspace changed since the thread's last snapshot, which a turn otherwise reuses.
CREATE TABLE workspace_snapshots (
    thread_id        text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    turn             integer     NOT NULL,
    objective        text,
    -- [{id, title, subtitle, kind, locked, source}] in id order (source absent from a snapshot
    -- stored before migration 019).
    preferences      jsonb       NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- The thread's next_event_id when the workspace was read (NULL: stored before migration 005,
    -- compared by its contents instead).
    version          bigint,
    -- What the ancestors gave: [{scope, preferences}] nearest first (NULL: no ancestors), and
    -- their next_event_id when read, so that a turn whose thread and ancestors are all unchanged
    -- reuses the snapshot.
    inherited        jsonb,
    scope_versions   bigint[],
    -- The objective's source (NULL: no objective, or stored before migration 019).
    objective_source text,
    PRIMARY KEY (thread_id, turn)
);

CREATE TABLE tool_calls (
    thread_id            text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id                   bigint      GENERATED ALWAYS AS IDENTITY,
    -- A tool call over MCP belongs to no turn: its turn and round are null.
    turn                 integer,
    round                integer,
    tool                 text        NOT NULL,
    -- arguments as the model sent them: the JSON value, or a JSON string of the raw text when it
    -- was not JSON.
    arguments            jsonb       NOT NULL,
    action_and_reasoning text        NOT NULL DEFAULT '',
    ok                   boolean     NOT NULL,
    -- result is the envelope the model got back.
    result               jsonb       NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    -- call_id is the id the model gave the call (a chat tool_call's id, a Responses call_id); ''
    -- for calls recorded before migration 003. A thread's calls are found through the primary
    -- key's thread_id, so no index of its own.
    call_id              text        NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, id)
);

-- Change history (docs/spec.md §13): one event per change of a workspace, by the agent, a user or
-- the client, written in the change's transaction.
CREATE TABLE events (
    thread_id    text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id           bigint      NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    -- 'client': a parents_set by a turn's X-Workspace-Parents header, or a compaction.
    actor        text        NOT NULL CHECK (actor IN ('agent', 'user', 'client')),
    -- turn, round, tool_call_id and reason are the agent's: null for a user's change.
    turn         integer,
    round        integer,
    tool_call_id bigint,
    reason       text,
    kind         text        NOT NULL CHECK (kind IN ('objective_set', 'preference_added', 'preference_updated',
                     'preference_locked', 'preference_unlocked', 'preference_removed', 'revert', 'locked_skip',
                     'parents_set', 'agent_writes_set', 'proposed', 'proposal_dismissed', 'preference_moved',
                     'compaction', 'untrusted_writes_set', 'shared_with_set')),
    -- target: the objective (target_id null), a preference by its stable id, or the thread (its
    -- parents, review settings, sharing, a compaction).
    target_type  text        NOT NULL CHECK (target_type IN ('objective', 'preference', 'thread')),
    target_id    bigint,
    -- before and after: the target's fields, null where it did not exist.
    before       jsonb,
    after        jsonb,
    -- reverts: the event a revert undid.
    reverts      bigint,
    -- proposed: on a locked_skip, the preference's fields as the refused update would have left
    -- them ({title, subtitle, kind}), or the JSON null for a refused removal, which the user may
    -- apply; on a proposed event, the proposal. SQL NULL where nothing is kept.
    proposed     jsonb,
    -- via: the path a change came by. 'proxy': a tool call of a proxied turn; 'mcp': a tool call
    -- over MCP; 'admin': a user's change through the admin REST (or the panel, which calls it).
    -- The default serves replicas of a version that named none.
    via          text        NOT NULL DEFAULT 'proxy' CHECK (via IN ('proxy', 'mcp', 'admin')),
    -- answers: the proposal a change (or a proposal_dismissed) answers.
    answers      bigint,
    -- moved: a preference_moved's {"from", "to"}, the two threads' stored ids.
    moved        jsonb,
    -- context: on an agent write's events, {tainted, grounded, ungrounded, nearest, sources}: what
    -- its turn had read (docs/spec.md §19). NULL on others.
    context      jsonb,
    PRIMARY KEY (thread_id, id)
);

-- A target's history, and retention by age.
CREATE INDEX events_target_idx ON events (thread_id, target_type, target_id, id);
CREATE INDEX events_at_idx ON events (at);
-- A proposal's answer, found by the proposal.
CREATE INDEX events_answers_idx ON events (thread_id, answers) WHERE answers IS NOT NULL;
-- The proposals of a thread, for the count of those waiting that the list gives each thread (and
-- the reads of the pending ones): without it, each listed thread's events are all read.
CREATE INDEX events_proposals_idx ON events (thread_id, id)
    WHERE kind = 'proposed' OR (kind = 'locked_skip' AND proposed IS NOT NULL);

-- links are the thread tokens the admin REST issues (POST …/links): a panel link's, which opens
-- the thread's panel, and an MCP token's, which reads and keeps its workspace over MCP. A token is
-- signed (it names its thread, its id and its expiry); its row says it is still valid: a revoked
-- token (DELETE …/links/{id}) has none, and a deleted thread takes its tokens with it. Expired
-- rows go when the thread's next token is issued.
CREATE TABLE links (
    thread_id  text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id         bigint      GENERATED ALWAYS AS IDENTITY,
    kind       text        NOT NULL CHECK (kind IN ('panel', 'mcp')),
    expires_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, id)
);

-- Ids never reused for a thread id (docs/spec.md §13): a deleted thread leaves a tombstone of its
-- counters (ThreadDelete), and a thread created again under its id numbers its events and
-- preferences on from there (thread_revive), so that a stream resuming with Last-Event-ID, a
-- revert or an edit of an id an open panel still shows never meets another change or item. One
-- row per deleted thread id, kept by thread id like every table.
CREATE TABLE thread_tombstones (
    thread_id          text   PRIMARY KEY,
    next_event_id      bigint NOT NULL,
    next_preference_id bigint NOT NULL
);

-- usage_batches: each usage writer's mark on a thread, under which a batch of usage added to the
-- thread's own totals only when it moved the mark on. Replicas of versions before thread_usage
-- count through it; this version writes only thread_usage.
CREATE TABLE usage_batches (
    thread_id text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    writer_id text        NOT NULL,
    batch     bigint      NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, writer_id)
);

-- A thread's usage totals kept per usage writer (a replica's, its id random per process), in rows
-- of their own: a batch of usage never updates the thread's row, so it never holds that row
-- against a turn's start or a tool call, and two replicas' writers never update the same row. A
-- writer's row carries the number of its last batch counted there, so that a batch sent again
-- after its answer was lost adds nothing (ThreadUsageAdd). A writer's row unmoved for a week is
-- folded into the thread's row by the thread's next usage.
CREATE TABLE thread_usage (
    thread_id            text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    writer_id            text        NOT NULL,
    batch                bigint      NOT NULL,
    at                   timestamptz NOT NULL DEFAULT now(),
    prompt_tokens        bigint      NOT NULL DEFAULT 0,
    cached_prompt_tokens bigint      NOT NULL DEFAULT 0,
    completion_tokens    bigint      NOT NULL DEFAULT 0,
    cache_write_tokens   bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (thread_id, writer_id)
);

-- The Responses API (docs/spec.md §12): response_turns records every Responses turn: the id its
-- client got (the turn's first upstream response) and the upstream response that ended it, so
-- that a client continuing from any turn (previous_response_id) continues from everything the
-- model saw. owed_call_ids are the workspace calls of that last response whose outputs the
-- upstream has not been sent (the turn ended on the client's calls); a continuation sends them
-- first.
CREATE TABLE response_turns (
    thread_id        text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    response_id      text        NOT NULL,
    turn             integer     NOT NULL,
    last_response_id text        NOT NULL,
    owed_call_ids    text[]      NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- The user's words the turn was given (its last two user messages, at most 8 KB), which
    -- ground the writes of a turn that continues it with none of its own (docs/spec.md §19); ''
    -- for a turn recorded before migration 019.
    user_text        text        NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, response_id)
);

-- Retention by age (HISTORY_RETENTION).
CREATE INDEX response_turns_created_at_idx ON response_turns (created_at);

-- client_responses records, per client, the ids of the responses made through wsproxy for it and
-- of their output items (docs/spec.md §12, with client keys) — pass-through requests and thread
-- turns alike, read from the answers as they pass. A request of the client may continue from
-- (previous_response_id) or reference (an input item's id) only these. It is keyed by client, not
-- thread: a pass-through request has no thread, and a client may continue on a thread what it
-- began without one. Under Citus, distribute it by client (docs/scaling.md).
CREATE TABLE client_responses (
    client     text        NOT NULL,
    id         text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (client, id)
);

-- Retention by age (HISTORY_RETENTION).
CREATE INDEX client_responses_created_at_idx ON client_responses (created_at);

-- Clients are data (docs/spec.md §20): the clients of wsproxy and their keys, created, rotated and
-- revoked over the admin REST while every replica serves. A key is never stored: only its SHA-256
-- and at most its first 8 characters, to recognise it by. Each replica keeps the live keys in
-- memory and reloads them when clients_version moves (read every EVENTS_POLL_INTERVAL), so a
-- change holds everywhere within a second and no request reads these tables.
CREATE TABLE clients (
    -- §2's client names: the namespace of the client's threads (alice~t1).
    name                text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$'),
    created_at          timestamptz NOT NULL DEFAULT now(),
    -- Written by each replica in batches (at most every few seconds), never by a request.
    last_used_at        timestamptz,
    -- A deleted client keeps its row (its name's threads stay, for the admin) and has no live key.
    deleted_at          timestamptz,
    -- Limits (§20), each optional: NULL is none.
    requests_per_minute integer     CHECK (requests_per_minute >= 0),
    tokens_per_day      bigint      CHECK (tokens_per_day >= 0),
    max_threads         integer     CHECK (max_threads >= 0)
);

CREATE TABLE client_keys (
    id         bigserial   PRIMARY KEY,
    client     text        NOT NULL REFERENCES clients (name) ON DELETE CASCADE,
    -- SHA-256 of the key; unique among every key ever issued, revoked ones included.
    hash       bytea       NOT NULL UNIQUE CHECK (length(hash) = 32),
    prefix     text        NOT NULL CHECK (length(prefix) <= 8),
    -- Came from CLIENT_KEYS: revoked at the next start once the entry is gone from it.
    seeded     boolean     NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

CREATE INDEX client_keys_by_client ON client_keys (client) WHERE revoked_at IS NULL;

-- One row: moved by every change of clients or client_keys that a replica must see (not by
-- last_used_at), in the changing transaction, so a replica that reads it moved reads the change.
CREATE TABLE clients_version (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    version bigint  NOT NULL
);

INSERT INTO clients_version (one, version) VALUES (true, 0);

-- What each client used per window (docs/spec.md §20, limits per client), kept per usage writer
-- (a replica's counter, its id random per process): each replica counts its clients' requests and
-- tokens in memory, and every interval writes its own totals of the current windows here (an
-- upsert of absolute values: a write sent again after its answer was lost changes nothing) and
-- reads the other writers' sums in the same statement. A request's admission never waits for this
-- table. Windows are UTC calendar windows: 'minute' rows count requests_per_minute, 'day' rows the
-- requests and tokens of the day (tokens_per_day, and what GET /admin/v1/me shows). Minute rows
-- are deleted after an hour, day rows after 400 days, by the writers.
CREATE TABLE client_usage (
    client    text        NOT NULL,
    period    text        NOT NULL CHECK (period IN ('minute', 'day')),
    starts_at timestamptz NOT NULL,
    writer_id text        NOT NULL,
    requests  bigint      NOT NULL DEFAULT 0,
    tokens    bigint      NOT NULL DEFAULT 0,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (period, starts_at, client, writer_id)
);
