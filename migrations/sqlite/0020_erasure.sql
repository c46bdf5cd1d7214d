-- Erasure (as on PostgreSQL, migration 0021): when a finished claim's payload, provider answer
-- and error were blanked, in milliseconds since the epoch. NULL: not erased.
ALTER TABLE claims ADD COLUMN erased_utc INTEGER;

CREATE INDEX IF NOT EXISTS claims_unerased_terminal ON claims (consumer, updated_utc)
    WHERE state IN ('completed', 'failed') AND erased_utc IS NULL;
