-- Every change of a claim's state, attempt, lease hand-off or provider id bumps `version`,
-- which every write fenced on what a reader saw checks (see the PostgreSQL migration of the
-- same name).
ALTER TABLE claims ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
