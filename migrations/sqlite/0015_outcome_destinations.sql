-- Several outcome destinations per consumer (see the PostgreSQL migration of the same name).
ALTER TABLE outcome_events ADD COLUMN destination TEXT NOT NULL DEFAULT '';
ALTER TABLE outcome_events ADD COLUMN claim_version INTEGER;
DROP INDEX IF EXISTS outcome_events_unsent;
CREATE INDEX outcome_events_unsent ON outcome_events (consumer, destination, id)
    WHERE sent_utc IS NULL;
DROP TABLE IF EXISTS outbox_relays;
CREATE TABLE outbox_relays (
    consumer    TEXT    NOT NULL,
    destination TEXT    NOT NULL,
    owner       TEXT    NOT NULL,
    lease_until INTEGER NOT NULL,
    PRIMARY KEY (consumer, destination)
);
