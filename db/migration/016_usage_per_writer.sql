-- A thread's usage totals, kept per usage writer (a replica's, its id random per process), in rows
-- of their own: a batch of usage no longer updates the thread's row, so it never holds that row
-- against a turn's start (which then had to wait for it on a round trip and a connection of its
-- own) or a tool call, and two replicas' writers never update the same row. A writer's row carries
-- the number of its last batch counted there, so that a batch sent again after its answer was
-- lost adds nothing (as usage_batches' marks did). A thread's usage is its row's totals (what was
-- counted before this migration, and what stale writers' rows were folded into) plus its writers'
-- rows; a writer's row unmoved for a week is folded into the thread's row by the thread's next
-- usage. usage_batches stays for replicas of the previous version during a rolling upgrade, which
-- go on counting into the thread's row.
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
