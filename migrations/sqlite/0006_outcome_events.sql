-- Outcome events: a transactional outbox (see migrations/postgres/0007_outcome_events.sql).
CREATE TABLE outcome_events (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    claim_id          INTEGER NOT NULL,
    consumer          TEXT    NOT NULL,
    tenant            TEXT    NOT NULL,
    message_id        TEXT    NOT NULL,
    idem_key          TEXT    NOT NULL,
    state             TEXT    NOT NULL,
    attempt           INTEGER NOT NULL,
    provider_status   INTEGER,
    provider_id       TEXT,
    provider_response TEXT,
    reason            TEXT,
    actor             TEXT    NOT NULL,
    action            TEXT    NOT NULL,
    at_utc            INTEGER NOT NULL,
    sent_utc          INTEGER,
    lease_owner       TEXT,
    lease_until       INTEGER,
    tries             INTEGER NOT NULL DEFAULT 0,
    last_error        TEXT
);
CREATE INDEX outcome_events_unsent ON outcome_events (consumer, id) WHERE sent_utc IS NULL;
CREATE INDEX outcome_events_unsent_claim ON outcome_events (claim_id, id) WHERE sent_utc IS NULL;
CREATE INDEX outcome_events_sent ON outcome_events (sent_utc) WHERE sent_utc IS NOT NULL;
