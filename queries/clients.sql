-- name: ClientsVersion :one
-- Where the clients stand: it moves with every change a replica must see (docs/spec.md §20).
SELECT version FROM clients_version;

-- name: ClientsLock :exec
-- Takes the clients' version row for the transaction: changes of the clients (a seed of every
-- replica starting at once among them) run one after the other, each seeing the one before.
SELECT version FROM clients_version FOR UPDATE;

-- name: ClientsBump :exec
-- Moves the clients' version, in the transaction that changes them.
UPDATE clients_version SET version = version + 1;

-- name: ClientKeysLive :many
-- Every key that authenticates: not revoked, its client not deleted; with its client's limits.
SELECT k.hash, k.client, c.requests_per_minute, c.tokens_per_day, c.max_threads FROM client_keys k JOIN clients c ON c.name = k.client
WHERE k.revoked_at IS NULL AND c.deleted_at IS NULL;

-- name: ClientsExist :one
-- Whether any client was ever made: from then on every /v1 request needs a client key.
SELECT EXISTS (SELECT FROM clients) AS exist;

-- name: ClientCreate :one
-- Creates a client, or makes one of a deleted client's name anew; no row when a live client has
-- the name.
INSERT INTO clients AS c (name, requests_per_minute, tokens_per_day, max_threads)
VALUES (@name, sqlc.narg(requests_per_minute), sqlc.narg(tokens_per_day), sqlc.narg(max_threads))
ON CONFLICT (name) DO UPDATE SET created_at = now(), deleted_at = NULL, last_used_at = NULL,
    requests_per_minute = excluded.requests_per_minute, tokens_per_day = excluded.tokens_per_day,
    max_threads = excluded.max_threads
WHERE c.deleted_at IS NOT NULL
RETURNING *;

-- name: ClientEnsure :one
-- The client of a CLIENT_KEYS entry: created when missing, undeleted when deleted.
INSERT INTO clients AS c (name) VALUES (@name)
ON CONFLICT (name) DO UPDATE SET deleted_at = NULL,
    created_at = CASE WHEN c.deleted_at IS NULL THEN c.created_at ELSE now() END
RETURNING *;

-- name: ClientGet :one
SELECT * FROM clients WHERE name = @name AND deleted_at IS NULL;

-- name: ClientList :many
SELECT * FROM clients WHERE deleted_at IS NULL ORDER BY name;

-- name: ClientKeyInsert :one
-- Adds a key to a live client; no row when there is none of that name.
INSERT INTO client_keys (client, hash, prefix, seeded)
SELECT c.name, @hash, @prefix, @seeded FROM clients c WHERE c.name = @client AND c.deleted_at IS NULL
RETURNING id, client, prefix, seeded, created_at;

-- name: ClientKeyByHash :one
SELECT id, client, seeded, revoked_at FROM client_keys WHERE hash = @hash;

-- name: ClientKeyList :many
-- The live keys of the clients named, by client then age.
SELECT id, client, prefix, seeded, created_at FROM client_keys
WHERE client = ANY (@clients::text[]) AND revoked_at IS NULL
ORDER BY client, id;

-- name: ClientKeyRevoke :execrows
UPDATE client_keys SET revoked_at = now() WHERE client = @client AND id = @id AND revoked_at IS NULL;

-- name: ClientKeysRevokeAll :exec
UPDATE client_keys SET revoked_at = now() WHERE client = @client AND revoked_at IS NULL;

-- name: ClientKeysRevokeUnseeded :many
-- Revokes the keys that came from CLIENT_KEYS and are no longer in it; returns their clients.
UPDATE client_keys SET revoked_at = now()
WHERE seeded AND revoked_at IS NULL AND NOT (hash = ANY (@keep::bytea[]))
RETURNING client;

-- name: ClientDelete :execrows
UPDATE clients SET deleted_at = now() WHERE name = @name AND deleted_at IS NULL;

-- name: ClientSetLimits :one
-- Sets the limits given (set_*), each to its value or to none (NULL).
UPDATE clients SET
    requests_per_minute = CASE WHEN @set_requests_per_minute::boolean THEN sqlc.narg(requests_per_minute) ELSE requests_per_minute END,
    tokens_per_day = CASE WHEN @set_tokens_per_day::boolean THEN sqlc.narg(tokens_per_day) ELSE tokens_per_day END,
    max_threads = CASE WHEN @set_max_threads::boolean THEN sqlc.narg(max_threads) ELSE max_threads END
WHERE name = @name AND deleted_at IS NULL
RETURNING *;

-- name: ClientsTouch :exec
-- Notes the clients used since the last time (a replica's batch; does not move the version).
UPDATE clients SET last_used_at = greatest(last_used_at, @at) WHERE name = ANY (@names::text[]);
