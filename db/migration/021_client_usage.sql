-- What each client used per window (docs/spec.md §20, limits per client), kept per usage writer
-- (a replica's counter, its id random per process): each replica counts its clients' requests
-- and tokens in memory, and every interval writes its own totals of the current windows here
-- (an upsert of absolute values: a write sent again after its answer was lost changes nothing)
-- and reads the other writers' sums in the same statement. A request's admission never waits
-- for this table. Windows are UTC calendar windows: 'minute' rows count requests_per_minute,
-- 'day' rows the requests and tokens of the day (tokens_per_day, and what GET /admin/v1/me
-- shows). Minute rows are deleted after an hour, day rows after 400 days, by the writers.
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
