//! The take of enqueued claims (the pickup's), apart for size.

/// Enqueued claims no worker took yet: `?6` oldest first, the rest by priority, then oldest
/// (see the PostgreSQL statement). Each part reads its own index up to its limit (a CTE read
/// twice would be materialized: the whole backlog read at every take).
pub(super) const TAKE_ENQUEUED: &str = concat!(
    sqlite_take_waiting_set!("?5"),
    "WHERE id IN (WITH aged AS (SELECT id FROM claims WHERE consumer = ?1 \
     AND state = 'started' AND lease_owner IS NULL AND attempt = 1 ORDER BY id LIMIT ?6) \
   SELECT id FROM aged UNION ALL SELECT id FROM (SELECT id FROM claims WHERE consumer = ?1 \
     AND state = 'started' AND lease_owner IS NULL AND attempt = 1 AND id NOT IN aged \
     ORDER BY priority DESC, id LIMIT ?2 - ?6)) \
   AND state = 'started' AND lease_owner IS NULL AND attempt = 1 RETURNING ",
    claim_cols!(),
    ", payload, (",
    now_ms!(),
    " - received_utc) AS age_ms, NULL AS held_by, priority"
);
