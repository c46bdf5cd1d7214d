-- SQLite mirror of migrations/postgres/0001_claims.sql. Times are INTEGER milliseconds since
-- the Unix epoch, taken from SQLite's clock (unixepoch('subsec')), never the worker's.
CREATE TABLE claims (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer          TEXT    NOT NULL,
    tenant            TEXT    NOT NULL DEFAULT '',
    message_id        TEXT    NOT NULL,
    idem_key          TEXT    NOT NULL,
    fingerprint       TEXT    NOT NULL,
    payload           BLOB    NOT NULL,
    content_type      TEXT    NOT NULL DEFAULT '',
    state             TEXT    NOT NULL DEFAULT 'started'
                      CHECK (state IN ('started', 'completed', 'failed', 'needs_attention')),
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
    -- How the holder of attempt handoff_attempt let go: 'not_applied' (an answer proved
    -- nothing was applied) or 'operator_redrive'. Lets the sweeper send again safely.
    handoff           TEXT,
    handoff_attempt   INTEGER,
    CONSTRAINT claims_identity UNIQUE (consumer, tenant, message_id)
);

CREATE INDEX claims_started_lease ON claims (consumer, lease_until) WHERE state = 'started';
CREATE INDEX claims_terminal_updated ON claims (updated_utc) WHERE state IN ('completed', 'failed');
CREATE INDEX claims_consumer_state_received ON claims (consumer, state, received_utc);
CREATE INDEX claims_received ON claims (received_utc);
CREATE INDEX claims_attention ON claims (consumer, received_utc) WHERE state = 'needs_attention';

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
CREATE INDEX claim_events_claim ON claim_events (claim_id, id);

CREATE TABLE claimd_heartbeats (
    name     TEXT    PRIMARY KEY,
    instance TEXT    NOT NULL,
    at_utc   INTEGER NOT NULL
);
