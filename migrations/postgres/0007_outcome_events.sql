-- Outcome events: a transactional outbox. A settle (or an operator's resolve or redrive) of a
-- claim whose consumer has an outcome destination writes one row here in the same statement
-- as the claim's update, so an event exists exactly when the change committed. The relay
-- publishes unsent rows, one claim's rows in order, and marks them sent after the destination
-- confirmed. `claim_id` has no foreign key: retention deletes old claims, their events stay
-- until they are sent and old enough. `lease_until` is both the relay's lease on a row taken
-- for sending and, after a failed send, when it may be tried again.
CREATE TABLE IF NOT EXISTS outcome_events (
    id                BIGSERIAL   PRIMARY KEY,
    claim_id          BIGINT      NOT NULL,
    consumer          TEXT        NOT NULL,
    tenant            TEXT        NOT NULL,
    message_id        TEXT        NOT NULL,
    idem_key          TEXT        NOT NULL,
    state             TEXT        NOT NULL,
    attempt           INTEGER     NOT NULL,
    provider_status   INTEGER,
    provider_id       TEXT,
    provider_response TEXT,
    reason            TEXT,
    actor             TEXT        NOT NULL,
    action            TEXT        NOT NULL,
    at_utc            TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_utc          TIMESTAMPTZ,
    lease_owner       TEXT,
    lease_until       TIMESTAMPTZ,
    tries             INTEGER     NOT NULL DEFAULT 0,
    last_error        TEXT
);
-- The relay's reads: unsent rows by consumer in order, and a claim's earlier unsent rows.
CREATE INDEX IF NOT EXISTS outcome_events_unsent ON outcome_events (consumer, id)
    WHERE sent_utc IS NULL;
CREATE INDEX IF NOT EXISTS outcome_events_unsent_claim ON outcome_events (claim_id, id)
    WHERE sent_utc IS NULL;
-- Retention of sent rows.
CREATE INDEX IF NOT EXISTS outcome_events_sent ON outcome_events (sent_utc)
    WHERE sent_utc IS NOT NULL;
