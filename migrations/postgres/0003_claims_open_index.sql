-- Open work (report, /readyz, /metrics: started, stuck, needs_attention, oldest started) reads
-- only this small partial index. Its predicate is exactly the one COUNT_OPEN uses; the partial
-- indexes of 0001 each cover one state only, so PostgreSQL could not use them for
-- `state IN ('started', 'needs_attention')` and scanned the whole table.
-- Not CONCURRENTLY: two `claimd run` starting together both migrate, and CREATE INDEX
-- CONCURRENTLY waits for the other's session, which waits for the migration lock: a deadlock
-- (found by the two-worker RabbitMQ run). On a large table, build it by hand with
-- CONCURRENTLY before upgrading (docs/operations.md).
CREATE INDEX IF NOT EXISTS claims_open ON claims (consumer, state)
    INCLUDE (lease_until, received_utc)
    WHERE state IN ('started', 'needs_attention');
