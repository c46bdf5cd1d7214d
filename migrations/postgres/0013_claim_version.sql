-- Every change of a claim's state, attempt, lease hand-off or provider id bumps `version`, and
-- every write fenced on what a reader saw (a provider event, a poll, an operator's form)
-- checks it: a claim that went away and came back to the same state at the same attempt
-- (pending -> needs_attention -> pending) is no longer the claim that was read. A constant
-- default: adding the column rewrites no row.
ALTER TABLE claims ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 1;
