-- One relay per consumer at a time (see the PostgreSQL migration of the same name): a lease on
-- the consumer's relay renewed each round, instead of a lease written on every event row.
CREATE TABLE IF NOT EXISTS outbox_relays (
    consumer    TEXT    PRIMARY KEY,
    owner       TEXT    NOT NULL,
    lease_until INTEGER NOT NULL
);
DROP INDEX IF EXISTS outcome_events_unsent_claim;
CREATE INDEX IF NOT EXISTS outcome_events_held_back ON outcome_events (claim_id, id)
    WHERE sent_utc IS NULL AND tries > 0;
UPDATE outcome_events SET lease_owner = NULL, lease_until = NULL
    WHERE sent_utc IS NULL AND tries = 0 AND lease_until IS NOT NULL;
