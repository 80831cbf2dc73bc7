-- Usage written exactly once (docs/spec.md §8): a replica's usage writer (its id random per
-- process) numbers its batches, and a batch adds a thread's usage only when it moves that
-- writer's mark on the thread, in the same statement (ThreadUsageAdd): a batch sent again after
-- its answer was lost (the connection cut after the commit) adds nothing. A mark that no writer
-- moved for a week is removed by the thread's next usage. Existing threads start without marks.
CREATE TABLE usage_batches (
    thread_id text        NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    writer_id text        NOT NULL,
    batch     bigint      NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, writer_id)
);
