-- Erasure: when a finished claim's payload, provider answer and error were blanked (payload
-- retention per consumer, or `claimd claims erase`). The row stays, with its fingerprint, so a
-- redelivery is still a duplicate and a changed payload still a mismatch. NULL: not erased.
ALTER TABLE claims ADD COLUMN IF NOT EXISTS erased_utc TIMESTAMPTZ;

-- The finished claims not yet erased, by last change: what a retention pass looks through.
CREATE INDEX IF NOT EXISTS claims_unerased_terminal ON claims (consumer, updated_utc)
    WHERE state IN ('completed', 'failed') AND erased_utc IS NULL;
