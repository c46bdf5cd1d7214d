-- One relay per consumer at a time: an instance holds a consumer's relay for a lease it renews
-- each round (one row write a round), instead of leasing every event row (one write an event).
-- Events are read without a lock; a crash between a publish and its mark leaves the events
-- unsent, and whoever holds the relay next publishes them again with the same ids.
CREATE TABLE IF NOT EXISTS outbox_relays (
    consumer    TEXT        PRIMARY KEY,
    owner       TEXT        NOT NULL,
    lease_until TIMESTAMPTZ NOT NULL
);
-- A claim's later event waits while an earlier one is held back after a failed send (tries > 0);
-- a due earlier one is in the same batch and comes first. This index holds only those few rows,
-- so a settle's insert no longer maintains an index per claim.
DROP INDEX IF EXISTS outcome_events_unsent_claim;
CREATE INDEX IF NOT EXISTS outcome_events_held_back ON outcome_events (claim_id, id)
    WHERE sent_utc IS NULL AND tries > 0;
-- Row leases of the earlier scheme are void: those events are due again (at least once).
UPDATE outcome_events SET lease_owner = NULL, lease_until = NULL
    WHERE sent_utc IS NULL AND tries = 0 AND lease_until IS NOT NULL;
