-- Periodic effects (docs/schedules.md): the last slot of each schedule that was submitted (or
-- passed by catch_up), across instances and restarts. Only ever moved forward. Kept apart from
-- the claims, which retention deletes. Expand-only.
CREATE TABLE IF NOT EXISTS schedule_slots (
    name          TEXT PRIMARY KEY,
    last_slot_utc TIMESTAMPTZ NOT NULL,
    updated_utc   TIMESTAMPTZ NOT NULL DEFAULT now()
);
