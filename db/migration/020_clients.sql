-- Clients are data (docs/spec.md §20): the clients of wsproxy and their keys, created, rotated and
-- revoked over the admin REST while every replica serves. A key is never stored: only its SHA-256
-- and at most its first 8 characters, to recognise it by. Each replica keeps the live keys in
-- memory and reloads them when clients_version moves (read every EVENTS_POLL_INTERVAL), so a
-- change holds everywhere within a second and no request reads this table.

CREATE TABLE clients (
    -- §2's client names: the namespace of the client's threads (alice~t1).
    name text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$'),
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Written by each replica in batches (at most every few seconds), never by a request.
    last_used_at timestamptz,
    -- A deleted client keeps its row (its name's threads stay, for the admin) and has no live key.
    deleted_at timestamptz,
    -- Limits (§20), each optional: NULL is none.
    requests_per_minute integer CHECK (requests_per_minute >= 0),
    tokens_per_day bigint CHECK (tokens_per_day >= 0),
    max_threads integer CHECK (max_threads >= 0)
);

CREATE TABLE client_keys (
    id bigserial PRIMARY KEY,
    client text NOT NULL REFERENCES clients (name) ON DELETE CASCADE,
    -- SHA-256 of the key; unique among every key ever issued, revoked ones included.
    hash bytea NOT NULL UNIQUE CHECK (length(hash) = 32),
    prefix text NOT NULL CHECK (length(prefix) <= 8),
    -- Came from CLIENT_KEYS: revoked at the next start once the entry is gone from it.
    seeded boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

CREATE INDEX client_keys_by_client ON client_keys (client) WHERE revoked_at IS NULL;

-- One row: moved by every change of clients or client_keys that a replica must see (not by
-- last_used_at), in the changing transaction, so a replica that reads it moved reads the change.
CREATE TABLE clients_version (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    version bigint NOT NULL
);

INSERT INTO clients_version (one, version) VALUES (true, 0);
