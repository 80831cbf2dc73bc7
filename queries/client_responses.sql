-- name: ClientResponseRecord :exec
-- Records ids of responses (and their output items) made for the client; an id seen again
-- keeps its first record.
INSERT INTO client_responses (client, id)
SELECT @client::text, unnest(@ids::text[])
ON CONFLICT (client, id) DO NOTHING;

-- name: ClientResponseUnknown :many
-- The ids among ids that were not made for the client.
SELECT u.id::text AS id
FROM unnest(@ids::text[]) AS u (id)
WHERE NOT EXISTS (SELECT 1 FROM client_responses c WHERE c.client = @client::text AND c.id = u.id);

-- name: ClientResponsePrune :execrows
-- HISTORY_RETENTION: ids made longer ago than the cutoff, but those another transaction holds
-- (as EventPrune).
DELETE FROM client_responses
WHERE (client, id) IN (
    SELECT o.client, o.id FROM client_responses o WHERE o.created_at < @before FOR UPDATE SKIP LOCKED);
