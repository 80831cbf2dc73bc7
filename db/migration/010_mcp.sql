-- The workspace over MCP (docs/spec.md §15).

-- via: the path a change came by. 'proxy': a tool call of a proxied turn; 'mcp': a tool call
-- over MCP; 'admin': a user's change through the admin REST (or the panel, which calls it). The
-- events stored before this migration came by the proxy (the agent's) or the admin REST (the
-- user's). The default makes the column a change of the catalogue alone; the user's events are
-- then rewritten, and the default goes: every insert names its via.
ALTER TABLE events ADD COLUMN via text NOT NULL DEFAULT 'proxy';
UPDATE events SET via = 'admin' WHERE actor = 'user';
ALTER TABLE events ALTER COLUMN via DROP DEFAULT,
    ADD CONSTRAINT events_via_check CHECK (via IN ('proxy', 'mcp', 'admin'));

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
