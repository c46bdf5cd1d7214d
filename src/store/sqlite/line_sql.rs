//! The parts of the SQLite statements that read order keys' lines, shared by the takes in
//! [`super::sql`]: which claims a line holds back, and what a take of waiting claims writes
//! and returns.

/// Whether the waiting claim `w` must wait for another claim of its order key's line (see
/// the PostgreSQL statement): `?5` hold, `?6` lines apply.
macro_rules! sqlite_behind_in_line {
    () => {
        "(?6 AND w.order_key IS NOT NULL AND EXISTS (SELECT 1 FROM claims o \
           WHERE o.consumer = w.consumer AND o.tenant = w.tenant AND o.order_key = w.order_key \
             AND o.id <> w.id AND o.state IN ('started', 'pending', 'needs_attention') \
             AND (o.state = 'started' OR ?5) \
             AND (o.id < w.id OR o.state <> 'started' \
                  OR (o.lease_owner IS NOT NULL AND o.lease_owner <> 'schedule'))))"
    };
}

/// Whether the stale claim `w` belongs to its order key's line rather than to a takeover (see
/// the PostgreSQL statement); the argument binds the hold.
macro_rules! sqlite_stale_in_line {
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
/// scheduled claim of an ordered consumer): it waits, it is not stuck (see the PostgreSQL
/// statement).
macro_rules! sqlite_held_in_line {
    () => {
        concat!(
            "(w.state = 'started' AND w.lease_until < ",
            now_ms!(),
            " AND ",
            sqlite_stale_in_line!("1"),
            ")"
        )
    };
}

/// What a take of waiting claims sets: the lease to the taker, attempt unchanged, and the
/// "not called yet" marker cleared on claims received within the parameter `$within`
/// milliseconds (see the PostgreSQL statement).
macro_rules! sqlite_take_waiting_set {
    ($within:literal) => {
        concat!(
            "UPDATE claims SET lease_owner = ?3, lease_until = ",
            now_ms!(),
            " + ?4, started_utc = ",
            now_ms!(),
            ", updated_utc = ",
            now_ms!(),
            ", ",
            sqlite_clear_marker!($within),
            " "
        )
    };
}

/// `clear_marker!` on claims received within the parameter `$within` milliseconds.
macro_rules! sqlite_clear_marker {
    ($within:literal) => {
        clear_marker!("received_utc >= ", now_ms!(), " - ", $within)
    };
}

/// What a take of waiting claims returns (see the PostgreSQL statement).
macro_rules! sqlite_take_waiting_returning {
    () => {
        concat!(
            " RETURNING ",
            claim_cols!(),
            ", payload, (",
            now_ms!(),
            " - received_utc) AS age_ms, NULL AS held_by, priority, \
             (SELECT o.message_id FROM claims o WHERE claims.order_key IS NOT NULL \
                AND o.consumer = claims.consumer AND o.tenant = claims.tenant \
                AND o.order_key = claims.order_key AND o.id < claims.id \
                AND o.state IN ('pending', 'needs_attention') ORDER BY o.id LIMIT 1) \
             AS went_ahead_of"
        )
    };
}
