-- The stuck-claims listing newest first over the started claims only (see the PostgreSQL
-- migration of the same name).
CREATE INDEX IF NOT EXISTS claims_started_received ON claims (received_utc, id, lease_until)
    WHERE state = 'started';
