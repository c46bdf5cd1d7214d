-- Pending claims (see migrations/postgres/0006_pending.sql). SQLite cannot change a CHECK
-- constraint in place, so the claims table is rebuilt with the new state allowed, in this
-- migration's transaction. Its history is set aside first and put back after: dropping the
-- old table would otherwise delete it through the ON DELETE CASCADE of claim_events.
CREATE TABLE claim_events_kept AS SELECT * FROM claim_events;
DROP TABLE claim_events;

CREATE TABLE claims_rebuilt (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer          TEXT    NOT NULL,
    tenant            TEXT    NOT NULL DEFAULT '',
    message_id        TEXT    NOT NULL,
    idem_key          TEXT    NOT NULL,
    fingerprint       TEXT    NOT NULL,
    payload           BLOB    NOT NULL,
    content_type      TEXT    NOT NULL DEFAULT '',
    state             TEXT    NOT NULL DEFAULT 'started'
                      CHECK (state IN ('started', 'pending', 'completed', 'failed', 'needs_attention')),
    attempt           INTEGER NOT NULL DEFAULT 1,
    lease_owner       TEXT,
    lease_until       INTEGER,
    received_utc      INTEGER NOT NULL,
    started_utc       INTEGER NOT NULL,
    processed_utc     INTEGER,
    updated_utc       INTEGER NOT NULL,
    last_error        TEXT,
    provider_status   INTEGER,
    provider_response TEXT,
    duplicate_count   INTEGER NOT NULL DEFAULT 0,
    mismatch_count    INTEGER NOT NULL DEFAULT 0,
    reconciled        INTEGER NOT NULL DEFAULT 0,
    resent_count      INTEGER NOT NULL DEFAULT 0,
    handoff           TEXT,
    handoff_attempt   INTEGER,
    claim_token       TEXT,
    waits             INTEGER NOT NULL DEFAULT 0,
    provider_id       TEXT,
    pending_utc       INTEGER,
    CONSTRAINT claims_identity UNIQUE (consumer, tenant, message_id)
);
INSERT INTO claims_rebuilt (id, consumer, tenant, message_id, idem_key, fingerprint, payload,
    content_type, state, attempt, lease_owner, lease_until, received_utc, started_utc,
    processed_utc, updated_utc, last_error, provider_status, provider_response,
    duplicate_count, mismatch_count, reconciled, resent_count, handoff, handoff_attempt,
    claim_token, waits)
SELECT id, consumer, tenant, message_id, idem_key, fingerprint, payload,
    content_type, state, attempt, lease_owner, lease_until, received_utc, started_utc,
    processed_utc, updated_utc, last_error, provider_status, provider_response,
    duplicate_count, mismatch_count, reconciled, resent_count, handoff, handoff_attempt,
    claim_token, waits
FROM claims;
DROP TABLE claims;
ALTER TABLE claims_rebuilt RENAME TO claims;

CREATE INDEX claims_started_lease ON claims (consumer, lease_until) WHERE state = 'started';
CREATE INDEX claims_terminal_updated ON claims (updated_utc) WHERE state IN ('completed', 'failed');
CREATE INDEX claims_consumer_state_received ON claims (consumer, state, received_utc);
CREATE INDEX claims_received ON claims (received_utc);
CREATE INDEX claims_attention ON claims (consumer, received_utc) WHERE state = 'needs_attention';
CREATE INDEX claims_provider_id ON claims (consumer, provider_id) WHERE provider_id IS NOT NULL;
CREATE INDEX claims_pending_poll ON claims (consumer, lease_until) WHERE state = 'pending';

CREATE TABLE claim_events (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    claim_id        INTEGER NOT NULL REFERENCES claims (id) ON DELETE CASCADE,
    attempt         INTEGER NOT NULL,
    at_utc          INTEGER NOT NULL,
    actor           TEXT    NOT NULL,
    action          TEXT    NOT NULL,
    outcome         TEXT    NOT NULL,
    provider_status INTEGER,
    detail          TEXT
);
INSERT INTO claim_events (id, claim_id, attempt, at_utc, actor, action, outcome,
    provider_status, detail)
SELECT id, claim_id, attempt, at_utc, actor, action, outcome, provider_status, detail
FROM claim_events_kept;
DROP TABLE claim_events_kept;
CREATE INDEX claim_events_claim ON claim_events (claim_id, id);

-- Every provider event received (see the PostgreSQL migration).
CREATE TABLE provider_events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer     TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    event_type   TEXT    NOT NULL DEFAULT '',
    object_id    TEXT,
    claim_id     INTEGER,
    result       TEXT    NOT NULL,
    received_utc INTEGER NOT NULL,
    CONSTRAINT provider_events_identity UNIQUE (consumer, event_id)
);
CREATE INDEX provider_events_unmatched ON provider_events (consumer, received_utc)
    WHERE claim_id IS NULL;
CREATE INDEX provider_events_received ON provider_events (received_utc);
