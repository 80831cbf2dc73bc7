-- The workspace over MCP (docs/spec.md §15).

-- via: the path a change came by. 'proxy': a tool call of a proxied turn; 'mcp': a tool call
-- over MCP; 'admin': a user's change through the admin REST (or the panel, which calls it). The
-- events stored before this migration came by the proxy (the agent's) or the admin REST (the
-- user's): the column and its check are a change of the catalogue alone (the check NOT VALID:
-- no scan, the rows it would read are all 'proxy' or 'admin'), and the user's events are then
-- rewritten. The default stays: a replica of the previous version, during a rolling deploy,
-- inserts events naming no via (its users' edits among them, which then say 'proxy'); this
-- version names it on every insert.
ALTER TABLE events ADD COLUMN via text NOT NULL DEFAULT 'proxy',
    ADD CONSTRAINT events_via_check CHECK (via IN ('proxy', 'mcp', 'admin')) NOT VALID;
UPDATE events SET via = 'admin' WHERE actor = 'user';

-- A tool call over MCP belongs to no turn: its turn and round are null.
ALTER TABLE tool_calls ALTER COLUMN turn DROP NOT NULL, ALTER COLUMN round DROP NOT NULL;

-- links are the thread tokens the admin REST issues (POST …/links): a panel link's, which opens
-- the thread's panel, and an MCP token's, which reads and keeps its workspace over MCP. A token
-- is signed (it names its thread, its id and its expiry); its row says it is still valid: a
-- revoked token (DELETE …/links/{id}) has none, and a deleted thread takes its tokens with it.
-- Expired rows go when the thread's next token is issued.
CREATE TABLE links (
    thread_id  text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id         bigint      GENERATED ALWAYS AS IDENTITY,
    kind       text        NOT NULL CHECK (kind IN ('panel', 'mcp')),
    expires_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, id)
);
