-- Prompt tokens written to the upstream's prompt cache, per thread (docs/spec.md §14: the
-- Messages API's cache_creation_input_tokens, billed above the input price). They are part of
-- prompt_tokens, as cached_prompt_tokens (the tokens read from the cache) are. An existing
-- thread starts from 0.
ALTER TABLE threads
    ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0;
