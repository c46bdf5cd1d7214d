//! The parts of the PostgreSQL statements that read order keys' lines, shared by the takes
//! and the counts in [`super`]: which claims a line holds back, and what a take of waiting
//! claims writes and returns.

/// Whether the waiting claim `w` must wait for another claim of its order key's line: an
/// unfinished one earlier in the line, or one in flight whatever its place (it was taken before
/// `w` committed); a `pending` or `needs_attention` one only when `$5` (`order_hold = "hold"`).
/// A scheduled claim (held by 'schedule') holds only the claims after it. `$6`: lines apply.
macro_rules! pg_behind_in_line {
    () => {
        "($6 AND w.order_key IS NOT NULL AND EXISTS (SELECT 1 FROM claims o \
           WHERE o.consumer = w.consumer AND o.tenant = w.tenant AND o.order_key = w.order_key \
             AND o.id <> w.id AND o.state IN ('started', 'pending', 'needs_attention') \
             AND (o.state = 'started' OR $5) \
             AND (o.id < w.id OR o.state <> 'started' \
                  OR (o.lease_owner IS NOT NULL AND o.lease_owner <> 'schedule'))))"
    };
}

/// What a take of waiting claims sets: the lease to the taker, attempt unchanged, and the
/// "not called yet" marker cleared on claims received within the parameter `$within`
/// milliseconds (negative: none; [`crate::engine::policy::clear_marker_within`]).
macro_rules! pg_take_waiting_set {
    ($within:literal) => {
        concat!(
            "UPDATE claims SET lease_owner = $3, lease_until = now() + $4 * interval '1 millisecond', \
           started_utc = now(), updated_utc = now(), ",
            pg_clear_marker!($within),
            " "
        )
    };
}

/// `clear_marker!` on claims received within the parameter `$within` milliseconds.
macro_rules! pg_clear_marker {
    ($within:literal) => {
        clear_marker!(
            "received_utc >= now() - ",
            $within,
            " * interval '1 millisecond'"
        )
    };
}

/// What a take of waiting claims returns: the claim, its payload and age, and the earliest
/// `pending` or `needs_attention` claim of its line it went ahead of (`order_hold = "skip"`).
macro_rules! pg_take_waiting_returning {
    () => {
        concat!(
            " RETURNING ",
            claim_cols!(),
            ", payload, (EXTRACT(EPOCH FROM now() - received_utc) * 1000)::bigint AS age_ms, \
             NULL::text AS held_by, priority::bigint AS priority, \
             (SELECT o.message_id FROM claims o WHERE claims.order_key IS NOT NULL \
                AND o.consumer = claims.consumer AND o.tenant = claims.tenant \
                AND o.order_key = claims.order_key AND o.id < claims.id \
                AND o.state IN ('pending', 'needs_attention') ORDER BY o.id LIMIT 1) \
             AS went_ahead_of"
        )
    };
}

/// Whether the stale claim `w` belongs to its order key's line rather than to a takeover
/// (I10): a scheduled one (`release_due_to_line` puts it into its line at its time), or an
/// ownerless one (an operator's redrive) while an earlier claim of its line is unfinished or
/// another of its line is in flight, as `pg_behind_in_line`; the argument binds the hold.
macro_rules! pg_stale_in_line {
    ($hold:literal) => {
        concat!(
            "(w.order_key IS NOT NULL AND (COALESCE(w.lease_owner = 'schedule', false) \
               OR (w.lease_owner IS NULL AND EXISTS (SELECT 1 FROM claims o \
                 WHERE o.consumer = w.consumer AND o.tenant = w.tenant \
                   AND o.order_key = w.order_key AND o.id <> w.id \
                   AND o.state IN ('started', 'pending', 'needs_attention') \
                   AND (o.state = 'started' OR ",
            $hold,
            ") AND (o.id < w.id OR o.state <> 'started' \
                        OR (o.lease_owner IS NOT NULL AND o.lease_owner <> 'schedule'))))))"
        )
    };
}

/// A `started` claim `w` whose lease ran out but whose line holds it (a redriven or due
/// scheduled claim of an ordered consumer behind an unfinished claim of its line): it waits,
/// it is not stuck. Read as `order_hold = "hold"` whatever the consumer says: under `skip` such
/// a claim goes at the sweeper's next pass.
macro_rules! pg_held_in_line {
    () => {
        concat!(
            "(w.state = 'started' AND w.lease_until < now() AND ",
            pg_stale_in_line!("true"),
            ")"
        )
    };
}
