-- Attempts that ended waiting rather than deciding (see the PostgreSQL migration of the same
-- name): `max_attempts` counts `attempt - waits`.
ALTER TABLE claims ADD COLUMN waits INTEGER NOT NULL DEFAULT 0;

-- Each instance's view of each consumer's provider (see the PostgreSQL migration).
ALTER TABLE claimd_heartbeats ADD COLUMN detail TEXT;
