-- Pending claims: the provider accepted the effect and has not finished it (a SEPA debit at
-- the bank, a payment waiting for capture). Their own state: not stuck, not a person's work,
-- never sent again; the provider's event or a poll of its status settles them.
ALTER TABLE claims DROP CONSTRAINT IF EXISTS claims_state_check;
ALTER TABLE claims ADD CONSTRAINT claims_state_check
    CHECK (state IN ('started', 'pending', 'completed', 'failed', 'needs_attention'));

-- The provider's own id of the effect (how its events find the claim), and when the claim
-- became pending. Nullable, no default: adding them rewrites nothing.
ALTER TABLE claims ADD COLUMN IF NOT EXISTS provider_id text;
ALTER TABLE claims ADD COLUMN IF NOT EXISTS pending_utc timestamptz;

-- Events find their claim by the provider's id; only claims that have one are indexed.
CREATE INDEX IF NOT EXISTS claims_provider_id ON claims (consumer, provider_id)
    WHERE provider_id IS NOT NULL;
-- The sweeper polls pending claims whose next poll is due (lease_until is that time).
CREATE INDEX IF NOT EXISTS claims_pending_poll ON claims (consumer, lease_until)
    WHERE state = 'pending';
-- Open work now includes pending claims: the open-work index of 0003, with the new state
-- (see 0003 for why not CONCURRENTLY).
CREATE INDEX IF NOT EXISTS claims_open_work ON claims (consumer, state)
    INCLUDE (lease_until, received_utc, pending_utc)
    WHERE state IN ('started', 'pending', 'needs_attention');
DROP INDEX IF EXISTS claims_open;

-- Every provider event received, once per (consumer, event id): a re-delivery of an event
-- already taken changes nothing. `claim_id` is the claim it settled or was recorded on (no
-- foreign key: retention deletes old claims); NULL for an object claimd has no claim for,
-- which `claimd reconcile` lists. `result` is what came of it.
CREATE TABLE IF NOT EXISTS provider_events (
    id           BIGSERIAL   PRIMARY KEY,
    consumer     TEXT        NOT NULL,
    event_id     TEXT        NOT NULL,
    event_type   TEXT        NOT NULL DEFAULT '',
    object_id    TEXT,
    claim_id     BIGINT,
    result       TEXT        NOT NULL,
    received_utc TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT provider_events_identity UNIQUE (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS provider_events_unmatched ON provider_events (consumer, received_utc)
    WHERE claim_id IS NULL;
CREATE INDEX IF NOT EXISTS provider_events_received ON provider_events (received_utc);
