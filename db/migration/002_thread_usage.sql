-- Usage per thread: what the upstream reported for the thread's turns, summed (SPEC §8). An
-- existing thread starts from 0.
ALTER TABLE threads
    ADD COLUMN prompt_tokens        bigint NOT NULL DEFAULT 0,
    ADD COLUMN cached_prompt_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN completion_tokens    bigint NOT NULL DEFAULT 0;
