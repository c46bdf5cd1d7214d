-- no-transaction
-- Open work (report, /readyz, /metrics: started, stuck, needs_attention, oldest started) reads
-- only this small partial index. Its predicate is exactly the one COUNT_OPEN uses; the partial
-- indexes of 0001 each cover one state only, so PostgreSQL could not use them for
-- `state IN ('started', 'needs_attention')` and scanned the whole table. Built concurrently so
-- claiming is not blocked on a large table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS claims_open ON claims (consumer, state)
    INCLUDE (lease_until, received_utc)
    WHERE state IN ('started', 'needs_attention');
