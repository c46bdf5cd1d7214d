-- Attempts that ended waiting rather than deciding (see the PostgreSQL migration of the same
-- name): `max_attempts` counts `attempt - waits`.
ALTER TABLE claims ADD COLUMN waits INTEGER NOT NULL DEFAULT 0;
