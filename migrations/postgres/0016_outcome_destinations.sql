-- Several outcome destinations per consumer: a settle writes one event row per destination
-- (`destination`, the destination's name), each with its own sent mark, tries and wait, and
-- each destination has its own relay (`outbox_relays` keyed by consumer and destination).
-- `claim_version` is the claim's version after the change: the event id is made from the
-- claim's id and it, so the same change has the same id at every destination. Rows written
-- before this migration have neither: the worker gives them to the consumer's first
-- destination at start and they keep their old id.
ALTER TABLE outcome_events ADD COLUMN IF NOT EXISTS destination TEXT NOT NULL DEFAULT '';
ALTER TABLE outcome_events ADD COLUMN IF NOT EXISTS claim_version BIGINT;
DROP INDEX IF EXISTS outcome_events_unsent;
CREATE INDEX IF NOT EXISTS outcome_events_unsent ON outcome_events (consumer, destination, id)
    WHERE sent_utc IS NULL;
-- Relay leases are short-lived (15 s); the new key starts them afresh.
DROP TABLE IF EXISTS outbox_relays;
CREATE TABLE outbox_relays (
    consumer    TEXT        NOT NULL,
    destination TEXT        NOT NULL,
    owner       TEXT        NOT NULL,
    lease_until TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (consumer, destination)
);
