-- name: ClientUsageSync :many
-- Writes one writer's totals of its clients' windows (absolute values, so that a write sent
-- again changes nothing) and returns the other writers' sums of the current minute and day, per
-- client, in one round trip (docs/spec.md §20).
WITH written AS (
    INSERT INTO client_usage AS u (client, period, starts_at, writer_id, requests, tokens)
    SELECT unnest(@clients::text[]), unnest(@periods::text[]), unnest(@starts::timestamptz[]), @writer_id::text,
           unnest(@requests::bigint[]), unnest(@tokens::bigint[])
    ON CONFLICT (period, starts_at, client, writer_id)
    DO UPDATE SET requests = excluded.requests, tokens = excluded.tokens, at = now()
)
SELECT c.client, c.period, sum(c.requests)::bigint AS requests, sum(c.tokens)::bigint AS tokens
FROM client_usage c
WHERE c.writer_id <> @writer_id::text
  AND ((c.period = 'minute' AND c.starts_at = @minute::timestamptz) OR (c.period = 'day' AND c.starts_at = @day::timestamptz))
GROUP BY c.client, c.period;

-- name: ClientUsagePrune :exec
-- Deletes the windows no limit and no usage report reads any more: minutes older than an hour,
-- days older than 400 days.
DELETE FROM client_usage
WHERE (period = 'minute' AND starts_at < now() - interval '1 hour')
   OR (period = 'day' AND starts_at < now() - interval '400 days');

-- name: ClientThreadCount :one
-- How many threads a client's namespace holds (client~…), and whether the thread named is one
-- of them: what max_threads is checked against (docs/spec.md §20).
SELECT count(*)::bigint AS threads, coalesce(bool_or(id = @thread_id::text), false)::boolean AS exists
FROM threads
WHERE starts_with(id, @prefix::text);
