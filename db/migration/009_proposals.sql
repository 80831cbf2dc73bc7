-- Proposals for locked items (docs/spec.md §13): a locked_skip keeps what the agent asked for, so
-- that the user can apply it. proposed is the preference's fields as the refused update would
-- have left them ({title, subtitle, kind}), or the JSON null for a refused removal; SQL NULL
-- where nothing is kept (every other kind, and an update refused before this migration, whose
-- fields were not recorded). Like every column of events it is kept by thread (thread_id leads
-- the primary key).
ALTER TABLE events ADD COLUMN proposed jsonb;

-- The removals refused before this migration are known from their tool call's record: their
-- proposal is the removal.
UPDATE events e SET proposed = 'null'::jsonb
FROM tool_calls c
WHERE e.kind = 'locked_skip' AND c.thread_id = e.thread_id AND c.id = e.tool_call_id
  AND c.tool = 'remove_preferences';
