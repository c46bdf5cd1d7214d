-- Follow-ups: a claim created by another claim's settle points at it (docs/follow-ups.md).
ALTER TABLE claims ADD COLUMN parent_id INTEGER;
CREATE INDEX claims_parent ON claims (parent_id) WHERE parent_id IS NOT NULL;
