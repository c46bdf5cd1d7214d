//! The take of enqueued claims (the pickup's), apart for size.

/// Enqueued claims (a producer's committed transaction) no worker took yet: `$6` of them
/// oldest first (the aged share), the rest higher priority first, then oldest;
/// `attempt = 1` leaves out operator redrives, which the sweeper takes. The rows are
/// chosen and locked by the inner SELECTs (FOR UPDATE re-checks their predicate on the
/// row's latest version, and the lock keeps it so until the UPDATE), so the UPDATE finds
/// them by primary key alone: with the predicate repeated there, the planner walks the
/// whole partial index (and its dead entries) once per statement: 0.7 s at 65,000 claims.
/// The second SELECT leaves out the first's rows, which its own lock does not skip.
pub(super) const TAKE_ENQUEUED: &str = concat!(
    pg_take_waiting_set!("$5"),
    "WHERE id = ANY (ARRAY( \
   WITH aged AS MATERIALIZED ( \
     SELECT id FROM claims \
     WHERE consumer = $1 AND state = 'started' AND lease_owner IS NULL AND attempt = 1 \
     ORDER BY id LIMIT $6 FOR UPDATE SKIP LOCKED) \
   SELECT id FROM aged \
   UNION ALL \
   SELECT p.id FROM ( \
     SELECT id FROM claims \
     WHERE consumer = $1 AND state = 'started' AND lease_owner IS NULL AND attempt = 1 \
       AND id <> ALL (ARRAY(SELECT id FROM aged)) \
     ORDER BY priority DESC, id LIMIT $2 - $6 FOR UPDATE SKIP LOCKED) p)) \
 RETURNING ",
    claim_cols!(),
    ", payload, (EXTRACT(EPOCH FROM now() - received_utc) * 1000)::bigint AS age_ms, \
   NULL::text AS held_by, priority::bigint AS priority"
);
