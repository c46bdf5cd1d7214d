-- Fewer indexes on claims: every settle and take writes a new entry into each index whose
-- predicate the row matches (none of those updates is HOT: `state`, `lease_until` and
-- `updated_utc` are indexed), and the indexes grow with that churn (docs/operations.md,
-- "Indexes that outgrew their rows"). Five indexes become two and one more goes: every
-- statement keeps an index path (docs/decisions.md, "Fewer indexes on claims"). Both new indexes are built
-- concurrently ahead of this migration, as every index; the drops wait for the lock on
-- claims a moment, as 0006's did.

-- Open claims by consumer, state and lease: the sweeper's expired leases (started), its due
-- polls (pending), the count of open work and the parked listings. Replaces
-- claims_started_lease, claims_pending_poll, claims_open_work and claims_attention.
CREATE INDEX IF NOT EXISTS claims_open_lease ON claims (consumer, state, lease_until)
    WHERE state IN ('started', 'pending', 'needs_attention');

-- Listings by consumer and state, newest first, of every state but started (whose listing
-- walks claims_started_received): the full claims_consumer_state_received without the entry
-- each take and re-lease of a started claim wrote.
CREATE INDEX IF NOT EXISTS claims_not_started_received ON claims (consumer, state, received_utc)
    WHERE state <> 'started';

DROP INDEX IF EXISTS claims_started_lease;
DROP INDEX IF EXISTS claims_pending_poll;
DROP INDEX IF EXISTS claims_open_work;
DROP INDEX IF EXISTS claims_attention;
DROP INDEX IF EXISTS claims_consumer_state_received;
-- The fair pickup walks claims_waiting_tenant_priority (0025) for its tenants too.
DROP INDEX IF EXISTS claims_waiting_tenant;
-- claims_provider_id stays: this release finds provider ids through claims_search_provider_id
-- (0009), but the release before it, which may run beside this one in a rolling upgrade, reads
-- them through claims_provider_id alone. A later contract migration drops it.
