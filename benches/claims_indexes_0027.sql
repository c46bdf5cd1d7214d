-- The indexes of `claims` before migration 0028, for measuring the path against them:
--   BENCH_EXTRA_SQL="$(cat benches/claims_indexes_0027.sql)" cargo bench --features full --bench producers
-- (run on each bench database after claimd migrated it; docs/performance.md).
CREATE INDEX claims_started_lease ON claims (consumer, lease_until) WHERE state = 'started';
CREATE INDEX claims_consumer_state_received ON claims (consumer, state, received_utc);
CREATE INDEX claims_attention ON claims (consumer, received_utc) WHERE state = 'needs_attention';
CREATE INDEX claims_pending_poll ON claims (consumer, lease_until) WHERE state = 'pending';
CREATE INDEX claims_open_work ON claims (consumer, state)
    INCLUDE (lease_until, received_utc, pending_utc)
    WHERE state IN ('started', 'pending', 'needs_attention');
CREATE INDEX claims_waiting_tenant ON claims (consumer, tenant, id)
    WHERE state = 'started' AND lease_owner IS NULL;
DROP INDEX claims_open_lease;
DROP INDEX claims_not_started_received;
