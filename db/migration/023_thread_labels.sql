-- What tells threads apart in the panel's list (docs/spec.md §13, §17): title, the name the user
-- gives a thread (PATCH /admin/v1/threads/{t} {"title"}; NULL none); agent, the User-Agent of
-- the request of the thread's first turn, and first_words, the user's own words in it (each cut
-- to 200 characters; NULL for a thread whose first turn came before this migration, or that the
-- user path made). None of them is the workspace: no event records them, and a thread's
-- updated_at does not move for them.
ALTER TABLE threads ADD COLUMN title text,
    ADD COLUMN agent text,
    ADD COLUMN first_words text;

-- The proposals of a thread, for the count of those waiting that the list gives each thread
-- (and the reads of the pending ones): without it, each listed thread's events are all read.
CREATE INDEX events_proposals_idx ON events (thread_id, id)
    WHERE kind = 'proposed' OR (kind = 'locked_skip' AND proposed IS NOT NULL);
