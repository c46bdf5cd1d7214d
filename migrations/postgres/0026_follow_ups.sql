-- Follow-ups: a claim created by another claim's settle points at it (docs/follow-ups.md).
-- Nullable, no default: adding it rewrites nothing.
ALTER TABLE claims ADD COLUMN IF NOT EXISTS parent_id BIGINT;
-- The children of a claim (the claim page, retention's check), only rows that have a parent.
CREATE INDEX IF NOT EXISTS claims_parent ON claims (parent_id) WHERE parent_id IS NOT NULL;
