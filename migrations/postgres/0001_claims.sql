-- Claims: one row per (consumer, tenant, message_id). The unique key is the only arbiter of
-- "duplicate". tenant is NOT NULL DEFAULT '' because PostgreSQL treats NULLs as distinct.
CREATE TABLE claims (
    id                BIGSERIAL PRIMARY KEY,
    consumer          TEXT        NOT NULL,
    tenant            TEXT        NOT NULL DEFAULT '',
    message_id        TEXT        NOT NULL,
    idem_key          TEXT        NOT NULL,
    fingerprint       TEXT        NOT NULL,
    payload           BYTEA       NOT NULL,
    content_type      TEXT        NOT NULL DEFAULT '',
    state             TEXT        NOT NULL DEFAULT 'started'
                      CHECK (state IN ('started', 'completed', 'failed', 'needs_attention')),
    attempt           INTEGER     NOT NULL DEFAULT 1,
    lease_owner       TEXT,
    lease_until       TIMESTAMPTZ,
    received_utc      TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_utc       TIMESTAMPTZ NOT NULL DEFAULT now(),
    processed_utc     TIMESTAMPTZ,
    updated_utc       TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error        TEXT,
    provider_status   INTEGER,
    provider_response TEXT,
    duplicate_count   BIGINT      NOT NULL DEFAULT 0,
    mismatch_count    BIGINT      NOT NULL DEFAULT 0,
    reconciled        BOOLEAN     NOT NULL DEFAULT false,
    resent_count      INTEGER     NOT NULL DEFAULT 0,
    -- How the holder of attempt handoff_attempt let go: 'not_applied' (an answer proved
    -- nothing was applied) or 'operator_redrive'. Lets the sweeper send again safely.
    handoff           TEXT,
    handoff_attempt   INTEGER,
    CONSTRAINT claims_identity UNIQUE (consumer, tenant, message_id)
);

-- The sweeper scans only started claims by lease end.
CREATE INDEX claims_started_lease ON claims (consumer, lease_until) WHERE state = 'started';
-- Retention scans only terminal claims by the time they became terminal.
CREATE INDEX claims_terminal_updated ON claims (updated_utc) WHERE state IN ('completed', 'failed');
-- Report and list by consumer, state and receive time.
CREATE INDEX claims_consumer_state_received ON claims (consumer, state, received_utc);
-- Report windows.
CREATE INDEX claims_received ON claims (received_utc);
-- Attention list.
CREATE INDEX claims_attention ON claims (consumer, received_utc) WHERE state = 'needs_attention';

-- History: attempts, sweeper decisions and operator notes.
CREATE TABLE claim_events (
    id              BIGSERIAL   PRIMARY KEY,
    claim_id        BIGINT      NOT NULL REFERENCES claims (id) ON DELETE CASCADE,
    attempt         INTEGER     NOT NULL,
    at_utc          TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor           TEXT        NOT NULL,
    action          TEXT        NOT NULL,
    outcome         TEXT        NOT NULL,
    provider_status INTEGER,
    detail          TEXT
);
CREATE INDEX claim_events_claim ON claim_events (claim_id, id);

-- Heartbeats of periodic jobs (sweeper, retention), readable by every instance.
CREATE TABLE claimd_heartbeats (
    name     TEXT        PRIMARY KEY,
    instance TEXT        NOT NULL,
    at_utc   TIMESTAMPTZ NOT NULL DEFAULT now()
);
