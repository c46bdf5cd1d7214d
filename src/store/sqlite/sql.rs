//! The SQLite statements, each under its name in [`STATEMENTS`]. Times are
//! INTEGER milliseconds from SQLite's clock (`unixepoch('subsec')`), never the worker's.

use crate::store::dialect::Statements;

/// SQLite's clock in milliseconds since the Unix epoch.
macro_rules! now_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

/// The k-th smallest time to complete (SQLite has no percentile function), from receipt or a
/// scheduled send's time, leaving out claims an operator resolved (as `count_window`'s `timed`
/// does).
pub(super) const COMPLETE_TIME_AT: &str = "\
    SELECT processed_utc - MAX(received_utc, COALESCE(not_before, received_utc)) AS ms \
    FROM claims \
    WHERE consumer = ?1 AND state = 'completed' AND operator_resolved = 0 AND received_utc >= ?2 \
    ORDER BY 1 LIMIT 1 OFFSET ?3";

/// A scheduled send whose time has not come (held by 'schedule' until its lease ends).
macro_rules! sqlite_scheduled {
    () => {
        concat!(
            "(lease_owner = 'schedule' AND lease_until >= ",
            now_ms!(),
            ")"
        )
    };
}

/// A claim waiting in its order key's line: no holder, and no expired lease (a redriven claim
/// waits for the sweeper instead).
macro_rules! sqlite_in_line {
    () => {
        concat!(
            "(lease_owner IS NULL AND order_key IS NOT NULL AND COALESCE(lease_until >= ",
            now_ms!(),
            ", 1))"
        )
    };
}

/// The filters `list_claims` and `search_claims` share (see `Statements::list_claims`).
macro_rules! sqlite_list_where {
    () => {
        concat!(
            "(?1 IS NULL OR state = ?1) \
       AND (?2 IS NULL OR consumer = ?2) \
       AND (NOT ?3 OR (state = 'started' AND lease_until < ",
            now_ms!(),
            ")) AND (?4 IS NULL OR received_utc >= ?4) \
       AND (?6 IS NULL OR received_utc < ?6) \
       AND (?7 IS NULL OR tenant = ?7) \
       AND (?8 IS NULL OR (received_utc, id) < (?8, ?9))"
        )
    };
}

/// Newest first, the keyset's order.
macro_rules! sqlite_list_order {
    () => {
        " ORDER BY received_utc DESC, id DESC LIMIT ?5"
    };
}

/// Fenced settle (I2), returning the row it changed; its history line follows in the same
/// transaction. A poll or a provider event also fences on the version it read (`?12`; NULL
/// for the worker, whose attempt is its own). Every settle bumps the version.
// A claim that completes drops its last error: a transient error that did not decide the
// outcome would read as the reason for it (the history keeps every error).
const SETTLE: &str = concat!(
    "UPDATE claims SET \
       state = COALESCE(?3, state), \
       provider_status = COALESCE(?4, provider_status), \
       provider_response = COALESCE(?5, provider_response), \
       last_error = CASE WHEN ?3 = 'completed' THEN NULL ELSE COALESCE(?6, last_error) END, \
       reconciled = reconciled OR ?7, \
       handoff = COALESCE(?8, handoff), \
       handoff_attempt = CASE WHEN ?8 IS NOT NULL THEN attempt ELSE handoff_attempt END, \
       waits = waits + CASE WHEN ?8 IS NOT NULL THEN 1 ELSE 0 END, \
       processed_utc = CASE WHEN ?3 IN ('completed', 'failed') THEN ",
    now_ms!(),
    " ELSE processed_utc END, \
       lease_owner = CASE WHEN ?3 IS NULL OR ?3 = 'started' THEN lease_owner END, \
       lease_until = CASE WHEN ?9 IS NOT NULL THEN ",
    now_ms!(),
    " + ?9 WHEN ?3 IS NULL OR ?3 = 'started' THEN lease_until END, \
       provider_id = COALESCE(?10, provider_id), \
       pending_utc = CASE WHEN ?3 = 'pending' THEN COALESCE(pending_utc, ",
    now_ms!(),
    ") ELSE pending_utc END, \
       version = version + 1, updated_utc = ",
    now_ms!(),
    " WHERE id = ?1 AND attempt = ?2 AND state = ?11 AND (?12 IS NULL OR version = ?12) \
       RETURNING id, attempt"
);

pub(super) mod accounts;
mod erasure;
mod follow_ups;
mod restore;
mod schedules;
pub(super) mod seal;
mod takes;

/// The statements the one body runs, in this dialect, each under its name.
pub(super) const STATEMENTS: Statements = Statements {
    insert_claim: concat!(
        "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
     content_type, lease_owner, claim_token, handoff, handoff_attempt, order_key, not_before, \
     attempt, trace_parent, priority, lease_until, received_utc, started_utc, updated_utc) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULLIF(?10, ''), CASE WHEN ?11 THEN 'not_called' \
     END, CASE WHEN ?11 THEN ?14 END, ?12, ?13, ?14, ?15, ?16, COALESCE(?13, CASE WHEN ?8 IS NOT NULL THEN ",
        now_ms!(),
        " + ?9 END), ",
        now_ms!(),
        ", ",
        now_ms!(),
        ", ",
        now_ms!(),
        ") ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING ",
        claim_cols!()
    ),
    // Counts a repeat delivery, unless the row is this call's own (its token: a commit whose
    // reply was lost), which is no repeat.
    count_repeat: concat!(
        "UPDATE claims SET \
       duplicate_count = duplicate_count + CASE WHEN claim_token = NULLIF(?5, '') THEN 0 \
                                                WHEN fingerprint = ?4 THEN 1 ELSE 0 END, \
       mismatch_count = mismatch_count + CASE WHEN claim_token = NULLIF(?5, '') THEN 0 \
                                              WHEN fingerprint = ?4 THEN 0 ELSE 1 END \
     WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3 RETURNING ",
        claim_cols!()
    ),
    get_claim: concat!(
        "SELECT ",
        claim_cols!(),
        ", payload FROM claims WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3"
    ),
    // SQLite keeps no archive.
    find_claim: concat!(
        "SELECT ",
        claim_cols!(),
        ", payload FROM claims WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3"
    ),
    state_of: "SELECT state FROM claims WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3",
    settle: SETTLE,
    // Its outcome event is a statement of its own, run only when there is one to write: the
    // settle itself is already plain.
    settle_plain: SETTLE,
    insert_follow_up: follow_ups::INSERT_FOLLOW_UP,
    insert_event: concat!(
        "INSERT INTO claim_events (claim_id, attempt, at_utc, actor, action, outcome, \
     provider_status, detail) VALUES (?1, ?2, ",
        now_ms!(),
        ", ?3, ?4, ?5, ?6, ?7)"
    ),
    // A fenced write that lost, kept in the history with what the claim had become, read in
    // the same statement (no state change, no fence).
    insert_fenced_out_event: concat!(
        "INSERT INTO claim_events (claim_id, attempt, at_utc, actor, action, outcome, \
     provider_status, detail) SELECT id, ?2, ",
        now_ms!(),
        ", ?3, ?4, ?5, ?6, COALESCE(?7, '') || ' (claim was ' || state || '@v' || version \
     || ', attempt ' || attempt || ')' FROM claims WHERE id = ?1"
    ),
    locate_claim: restore::LOCATE_CLAIM,
    restore_claim: restore::RESTORE_CLAIM,
    erase_claim: erasure::ERASE_CLAIM,
    erase_due: erasure::ERASE_DUE,
    erase_due_count: erasure::ERASE_DUE_COUNT,
    schedule_start: schedules::SCHEDULE_START,
    schedule_advance: schedules::SCHEDULE_ADVANCE,
    schedule_slots: schedules::SCHEDULE_SLOTS,
    // The worker is about to make the first call of attempt 1: the claim's "not called yet"
    // marker goes (fenced: changes nothing unless the worker still holds the claim).
    mark_called: "UPDATE claims SET \
       handoff = CASE WHEN handoff = 'not_called' THEN NULL ELSE handoff END, \
       handoff_attempt = CASE WHEN handoff = 'not_called' THEN NULL ELSE handoff_attempt END \
     WHERE id = ?1 AND attempt = ?2 AND state = 'started'",
    note_resent: "\
    UPDATE claims SET resent_count = resent_count + 1 \
    WHERE id = ?1 AND attempt = ?2 AND state = 'started'",
    unnote_resent: "\
    UPDATE claims SET resent_count = resent_count - 1 \
    WHERE id = ?1 AND attempt = ?2 AND state = 'started' AND resent_count > 0",
    list_claims: concat!(
        "SELECT ",
        claim_cols!(),
        " FROM claims WHERE ",
        sqlite_list_where!(),
        sqlite_list_order!()
    ),
    // Stuck claims alone, over the partial index `claims_started_received` (0011).
    list_stuck_claims: concat!(
        "SELECT ",
        claim_cols!(),
        " FROM claims WHERE state = 'started' AND lease_until < ",
        now_ms!(),
        " AND ?3 AND ",
        sqlite_list_where!(),
        sqlite_list_order!()
    ),
    // One arm per way a text can match, each on its own index (0008_claim_search.sql), as
    // the PostgreSQL statement does (see there).
    search_claims: concat!(
        "SELECT ",
        claim_cols!(),
        " FROM claims WHERE id IN ( \
       SELECT id FROM (SELECT id FROM claims WHERE message_id >= ?10 AND message_id < ?11 AND ",
        sqlite_list_where!(),
        sqlite_list_order!(),
        ") UNION ALL SELECT id FROM (SELECT id FROM claims \
         WHERE idem_key >= ?10 AND idem_key < ?11 AND ",
        sqlite_list_where!(),
        sqlite_list_order!(),
        ") UNION ALL SELECT id FROM (SELECT id FROM claims \
         WHERE provider_id IS NOT NULL AND provider_id >= ?10 AND provider_id < ?11 AND ",
        sqlite_list_where!(),
        sqlite_list_order!(),
        ") UNION ALL SELECT id FROM (SELECT id FROM claims WHERE tenant <> '' AND tenant = ?10 AND ",
        sqlite_list_where!(),
        sqlite_list_order!(),
        "))",
        sqlite_list_order!()
    ),
    // A prefix compared with substr (not LIKE): the operator's text may hold `%` or `_`.
    list_parked_by_reason: concat!(
        "SELECT ",
        claim_cols!(),
        " FROM claims \
     WHERE state = 'needs_attention' AND consumer = ?1 \
       AND substr(COALESCE(last_error, ''), 1, length(?2)) = ?2 \
     ORDER BY received_utc DESC, id DESC LIMIT ?3"
    ),
    claim_parent: follow_ups::CLAIM_PARENT,
    claim_children: follow_ups::CLAIM_CHILDREN,
    list_events: "\
    SELECT attempt, at_utc, actor, action, outcome, provider_status, detail \
    FROM claim_events WHERE claim_id = ?1 ORDER BY id",
    // Takeover: SQLite runs one writer at a time, so the statement alone is atomic.
    // `held_by`: the lease holder the claim is taken from, read from the materialised CTE
    // (RETURNING sees only new values; an UPDATE ... FROM table is not allowed in RETURNING).
    take_stale: concat!(
        "WITH stale AS MATERIALIZED (SELECT id AS stale_id, lease_owner AS held_by FROM claims w \
       WHERE consumer = ?1 AND state = 'started' AND lease_until < MIN(?5, ",
        now_ms!(),
        ") AND NOT ",
        sqlite_stale_in_line!("?6"),
        " ORDER BY lease_until LIMIT ?2) \
       UPDATE claims SET ",
        take_attempt!(),
        "version = version + 1, lease_owner = ?3, \
       lease_until = ",
        now_ms!(),
        " + ?4, started_utc = ",
        now_ms!(),
        ", updated_utc = ",
        now_ms!(),
        " WHERE id IN (SELECT stale_id FROM stale) RETURNING ",
        claim_cols!(),
        ", payload, (",
        now_ms!(),
        " - COALESCE(not_before, received_utc)) AS age_ms, (SELECT held_by FROM stale WHERE stale_id = claims.id) AS held_by"
    ),
    take_pending: concat!(
        "UPDATE claims SET lease_owner = ?3, lease_until = ",
        now_ms!(),
        " + ?4 WHERE id IN (SELECT id FROM claims WHERE consumer = ?1 AND state = 'pending' \
       AND lease_until < ",
        now_ms!(),
        " ORDER BY lease_until LIMIT ?2) RETURNING ",
        claim_cols!(),
        ", payload, (",
        now_ms!(),
        " - COALESCE(pending_utc, received_utc)) AS age_ms, NULL AS held_by"
    ),
    take_enqueued: takes::TAKE_ENQUEUED,
    // One writer at a time: the statement alone is atomic, no lock needed. The aged share
    // `?8`, then by priority, among the heads of their lines (see the PostgreSQL statement).
    take_ordered: concat!(
        sqlite_take_waiting_set!("?7"),
        "WHERE id IN (WITH heads AS (SELECT w.id, w.priority FROM claims w \
         WHERE w.consumer = ?1 AND w.state = 'started' AND w.lease_owner IS NULL \
           AND w.attempt = 1 AND NOT ",
        sqlite_behind_in_line!(),
        "), aged AS (SELECT id FROM heads ORDER BY id LIMIT ?8) \
       SELECT id FROM aged UNION ALL SELECT id FROM (SELECT id FROM heads \
         WHERE id NOT IN aged ORDER BY priority DESC, id LIMIT ?2 - ?8))",
        sqlite_take_waiting_returning!()
    ),
    // SQLite has no LATERAL: every waiting claim of the consumer is ranked within its tenant
    // (the cost grows with the waiting claims, only when fairness is on).
    take_fair: concat!(
        sqlite_take_waiting_set!("?8"),
        "WHERE id IN (SELECT r.id FROM ( \
         SELECT w.id, w.tenant, row_number() OVER (PARTITION BY w.tenant ORDER BY w.priority DESC, w.id) AS rn \
         FROM claims w \
         WHERE w.consumer = ?1 AND w.state = 'started' AND w.lease_owner IS NULL \
           AND w.attempt = 1 AND NOT ",
        sqlite_behind_in_line!(),
        ") r LEFT JOIN json_each(?7) wt ON wt.key = r.tenant \
       ORDER BY r.rn * 1.0 / COALESCE(wt.value, 1), r.id LIMIT ?2)",
        sqlite_take_waiting_returning!()
    ),
    line_head: "\
    SELECT o.message_id, o.state, o.attempt FROM claims o \
    WHERE o.consumer = ?1 AND o.tenant = ?2 AND o.order_key = ?3 AND o.id <> ?4 \
      AND o.state IN ('started', 'pending', 'needs_attention') \
      AND (o.id < ?4 OR o.state <> 'started' \
           OR (o.lease_owner IS NOT NULL AND o.lease_owner <> 'schedule')) \
    ORDER BY o.id LIMIT 1",
    behind_in_line: "\
    SELECT COUNT(*) AS n FROM claims w \
    WHERE w.consumer = ?1 AND w.tenant = ?2 AND w.order_key = ?3 AND w.id > ?4 \
      AND w.state = 'started' AND w.lease_owner IS NULL",
    // As count_open's in_line: a redriven claim (lease expired) waits for the sweeper.
    in_line: concat!(
        "SELECT consumer, COUNT(*) AS n FROM claims WHERE state = 'started' AND ",
        sqlite_in_line!(),
        " GROUP BY consumer"
    ),
    // One statement, so no crash or store error leaves a due claim taken and out of its line.
    release_due_to_line: concat!(
        "UPDATE claims SET lease_owner = NULL, lease_until = NULL, attempt = attempt + 1, \
       handoff_attempt = CASE WHEN handoff = 'not_called' THEN attempt + 1 ELSE handoff_attempt END, \
       version = version + 1, updated_utc = ",
        now_ms!(),
        " WHERE id IN (SELECT id FROM claims WHERE consumer = ?1 AND state = 'started' \
         AND lease_owner = 'schedule' AND order_key IS NOT NULL AND lease_until < ",
        now_ms!(),
        " ORDER BY lease_until LIMIT ?2) RETURNING ",
        claim_cols!(),
        ", payload"
    ),
    take_stale_fair: concat!(
        "WITH stale AS MATERIALIZED (SELECT r.id AS stale_id, r.lease_owner AS held_by FROM ( \
         SELECT id, tenant, lease_owner, \
           row_number() OVER (PARTITION BY tenant ORDER BY lease_until, id) AS rn \
         FROM claims w WHERE consumer = ?1 AND state = 'started' AND lease_until < MIN(?5, ",
        now_ms!(),
        ") AND NOT ",
        sqlite_stale_in_line!("?7"),
        ") r LEFT JOIN json_each(?6) wt ON wt.key = r.tenant \
       ORDER BY r.rn * 1.0 / COALESCE(wt.value, 1), r.id LIMIT ?2) \
       UPDATE claims SET ",
        take_attempt!(),
        "version = version + 1, lease_owner = ?3, \
       lease_until = ",
        now_ms!(),
        " + ?4, started_utc = ",
        now_ms!(),
        ", updated_utc = ",
        now_ms!(),
        " WHERE id IN (SELECT stale_id FROM stale) RETURNING ",
        claim_cols!(),
        ", payload, (",
        now_ms!(),
        " - COALESCE(not_before, received_utc)) AS age_ms, (SELECT held_by FROM stale WHERE stale_id = claims.id) AS held_by"
    ),
    register_consumer: concat!(
        "INSERT INTO claimd_consumers (name, key_template, max_key_length, keys_tenant, \
      max_payload_bytes, ordered, url_segments, generation, effect_kind, updated_utc) \
      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ",
        now_ms!(),
        ") ON CONFLICT (name) DO UPDATE SET key_template = excluded.key_template, \
      max_key_length = excluded.max_key_length, keys_tenant = excluded.keys_tenant, \
      max_payload_bytes = excluded.max_payload_bytes, ordered = excluded.ordered, \
      url_segments = excluded.url_segments, generation = excluded.generation, \
      effect_kind = excluded.effect_kind, updated_utc = excluded.updated_utc \
    WHERE claimd_consumers.generation < excluded.generation \
       OR (claimd_consumers.generation = excluded.generation \
           AND claimd_consumers.effect_kind IN ('', excluded.effect_kind))"
    ),
    registered_consumer: "SELECT generation, effect_kind FROM claimd_consumers WHERE name = ?1",
    peek_stale: concat!(
        "SELECT ",
        claim_cols!(),
        ", (",
        now_ms!(),
        " - COALESCE(not_before, received_utc)) AS age_ms, lease_owner AS held_by FROM claims \
       WHERE consumer = ?1 AND state = 'started' AND lease_until < ",
        now_ms!(),
        " ORDER BY lease_until LIMIT ?2"
    ),
    resolve: concat!(
        "UPDATE claims SET state = ?4, \
       processed_utc = CASE WHEN ?4 IN ('completed', 'failed') THEN COALESCE(processed_utc, ",
        now_ms!(),
        ") ELSE processed_utc END, \
       lease_owner = NULL, lease_until = NULL, operator_resolved = 1, version = version + 1, \
       updated_utc = ",
        now_ms!(),
        " WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3 AND state IN (?5, ?6) \
       AND (?7 IS NULL OR attempt = ?7) AND (?8 IS NULL OR version = ?8) RETURNING ",
        claim_cols!()
    ),
    redrive: concat!(
        "UPDATE claims SET state = 'started', attempt = attempt + 1, lease_owner = NULL, \
       lease_until = ",
        now_ms!(),
        " - 1, handoff = 'operator_redrive', handoff_attempt = attempt + 1, processed_utc = NULL, \
       operator_resolved = 0, version = version + 1, updated_utc = ",
        now_ms!(),
        " WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3 AND erased_utc IS NULL AND state IN (?4, ?5) \
       AND (?6 IS NULL OR attempt = ?6) AND (?7 IS NULL OR version = ?7) RETURNING ",
        claim_cols!()
    ),
    // What waits, as in the PostgreSQL statement: for its time, in its line (also once its
    // lease ran out, while its line holds it), for its provider.
    count_open: concat!(
        "SELECT consumer, state, COUNT(*) AS n, \
       SUM(CASE WHEN lease_until < ",
        now_ms!(),
        " AND NOT ",
        sqlite_held_in_line!(),
        " THEN 1 ELSE 0 END) AS stuck, \
       SUM(CASE WHEN (lease_until >= ",
        now_ms!(),
        " AND handoff_attempt = attempt AND handoff IN ('not_applied', 'undecided')) OR ",
        sqlite_scheduled!(),
        " OR ",
        sqlite_in_line!(),
        " OR ",
        sqlite_held_in_line!(),
        " THEN 1 ELSE 0 END) AS waiting, SUM(CASE WHEN ",
        sqlite_scheduled!(),
        " THEN 1 ELSE 0 END) AS scheduled, SUM(CASE WHEN ",
        sqlite_in_line!(),
        " OR ",
        sqlite_held_in_line!(),
        " THEN 1 ELSE 0 END) AS in_line, (",
        now_ms!(),
        " - MIN(CASE WHEN state = 'pending' THEN pending_utc WHEN ",
        sqlite_scheduled!(),
        " OR ",
        sqlite_in_line!(),
        " OR ",
        sqlite_held_in_line!(),
        " THEN NULL ELSE MAX(received_utc, COALESCE(not_before, received_utc)) END)) AS oldest_ms \
     FROM claims w WHERE state IN ('started', 'pending', 'needs_attention') \
     GROUP BY consumer, state"
    ),
    count_window: "\
    SELECT consumer, COUNT(*) AS claims, \
      COALESCE(SUM(duplicate_count), 0) AS duplicates, \
      COALESCE(SUM(mismatch_count), 0) AS mismatches, \
      SUM(CASE WHEN state = 'completed' THEN 1 ELSE 0 END) AS completed, \
      SUM(CASE WHEN state = 'failed' THEN 1 ELSE 0 END) AS failed, \
      SUM(CASE WHEN resent_count > 0 THEN 1 ELSE 0 END) AS resent, \
      SUM(CASE WHEN state = 'completed' AND operator_resolved = 0 THEN 1 ELSE 0 END) AS timed, \
      NULL AS p50, NULL AS p95 \
    FROM claims WHERE received_utc >= ?1 GROUP BY consumer",
    insert_dead_letter: concat!(
        "INSERT INTO dead_letters (consumer, reason, message_id, at_utc) VALUES (?1, ?2, ?3, ",
        now_ms!(),
        ")"
    ),
    count_dead_letters: "SELECT consumer, COUNT(*) AS n FROM dead_letters WHERE at_utc >= ?1 GROUP BY consumer",
    // One batch of retention, of one state (`?3`); the predicate is repeated on the DELETE itself, as in the
    // PostgreSQL driver, so a row is deleted only if it is terminal when it is deleted (I7).
    prune_batch: concat!(
        "DELETE FROM claims WHERE id IN (SELECT id FROM claims \
       WHERE state IN ('completed', 'failed') AND state = ?3 AND updated_utc < ",
        now_ms!(),
        " - ?1 AND NOT EXISTS (SELECT 1 FROM claims k WHERE k.parent_id = claims.id \
       AND k.state NOT IN ('completed', 'failed')) ORDER BY updated_utc LIMIT ?2) \
     AND state = ?3 AND updated_utc < ",
        now_ms!(),
        " - ?1 AND NOT EXISTS (SELECT 1 FROM claims k WHERE k.parent_id = claims.id \
       AND k.state NOT IN ('completed', 'failed'))"
    ),
    prune_count: concat!(
        "SELECT COUNT(*) AS n FROM claims WHERE state IN ('completed', 'failed') AND state = ?2 \
       AND updated_utc < ",
        now_ms!(),
        " - ?1 AND NOT EXISTS (SELECT 1 FROM claims k WHERE k.parent_id = claims.id \
       AND k.state NOT IN ('completed', 'failed'))"
    ),
    prune_dead_letters: concat!(
        "DELETE FROM dead_letters WHERE id IN (SELECT id FROM dead_letters WHERE at_utc < ",
        now_ms!(),
        " - ?1 ORDER BY at_utc LIMIT ?2)"
    ),
    prune_dead_letters_count: concat!(
        "SELECT COUNT(*) AS n FROM dead_letters WHERE at_utc < ",
        now_ms!(),
        " - ?1"
    ),
    mark_sweep: concat!(
        "INSERT INTO claimd_heartbeats (name, instance, at_utc) VALUES ('sweeper', ?1, ",
        now_ms!(),
        ") ON CONFLICT (name) DO UPDATE SET instance = excluded.instance, at_utc = excluded.at_utc"
    ),
    probe_write: concat!(
        "INSERT INTO claimd_heartbeats (name, instance, at_utc) VALUES ('write_probe', ?1, ",
        now_ms!(),
        ") ON CONFLICT (name) DO UPDATE SET instance = excluded.instance, at_utc = excluded.at_utc"
    ),
    last_sweep: "SELECT at_utc FROM claimd_heartbeats WHERE name = 'sweeper'",
    mark_destination: concat!(
        "INSERT INTO claimd_heartbeats (name, instance, at_utc, detail) VALUES (?1, ?2, ",
        now_ms!(),
        ", ?3) ON CONFLICT (name) DO UPDATE SET instance = excluded.instance, \
         at_utc = excluded.at_utc, detail = excluded.detail"
    ),
    list_destinations: "SELECT name, instance, at_utc, detail FROM claimd_heartbeats \
     WHERE name LIKE 'destination:%' ORDER BY name",
    prune_destinations: concat!(
        "DELETE FROM claimd_heartbeats WHERE name LIKE 'destination:%' AND at_utc < ",
        now_ms!(),
        " - ?1"
    ),
    find_by_provider_id: concat!(
        "SELECT ",
        claim_cols!(),
        ", payload FROM claims WHERE consumer = ?1 AND provider_id = ?2 \
     ORDER BY id DESC LIMIT 1"
    ),
    provider_event_seen: "\
    SELECT COUNT(*) AS n FROM provider_events WHERE consumer = ?1 AND event_id = ?2",
    insert_provider_event: concat!(
        "INSERT INTO provider_events (consumer, event_id, event_type, object_id, claim_id, \
     result, received_utc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ",
        now_ms!(),
        ") ON CONFLICT (consumer, event_id) DO NOTHING"
    ),
    list_unmatched_events: "\
    SELECT consumer, event_id, event_type, object_id, received_utc FROM provider_events \
    WHERE claim_id IS NULL AND received_utc >= ?1 ORDER BY received_utc DESC, id DESC LIMIT ?2",
    prune_provider_events: concat!(
        "DELETE FROM provider_events WHERE id IN ( \
      SELECT id FROM provider_events WHERE received_utc < ",
        now_ms!(),
        " - ?1 ORDER BY received_utc LIMIT ?2)"
    ),
    list_ledger_claims: "\
    SELECT id, tenant, message_id, idem_key, state, received_utc, payload, provider_id FROM claims \
    WHERE consumer = ?1 AND received_utc >= ?2 AND received_utc < ?3 \
      AND (idem_key, id) > (?4, ?5) \
    ORDER BY consumer, idem_key, id LIMIT ?6",
    save_ledger_run: concat!(
        "INSERT INTO ledger_runs (consumer, at_utc, summary) VALUES (?1, ",
        now_ms!(),
        ", ?2) ON CONFLICT (consumer) DO UPDATE SET at_utc = excluded.at_utc, \
         summary = excluded.summary"
    ),
    list_ledger_runs: "SELECT consumer, at_utc, summary FROM ledger_runs ORDER BY consumer",
    now: concat!("SELECT ", now_ms!(), " AS now"),
    ping: "SELECT 1",
    // As PostgreSQL's: one relay per consumer holds it, the events are read without a write.
    hold_outcome_relay: concat!(
        "INSERT INTO outbox_relays (consumer, destination, owner, lease_until) \
         VALUES (?1, ?4, ?2, ",
        now_ms!(),
        " + ?3) ON CONFLICT (consumer, destination) DO UPDATE SET owner = excluded.owner, \
         lease_until = excluded.lease_until \
         WHERE outbox_relays.owner = excluded.owner OR outbox_relays.lease_until < ",
        now_ms!(),
        " RETURNING owner"
    ),
    release_outcome_relay: "DELETE FROM outbox_relays WHERE consumer = ?1 AND owner = ?2 \
                            AND destination = ?3",
    due_outcomes: concat!(
        "SELECT ",
        outcome_cols!(),
        ", (SELECT p.consumer FROM claims c JOIN claims p ON p.id = c.parent_id \
           WHERE c.id = e.claim_id) AS parent_consumer, \
         (SELECT p.message_id FROM claims c JOIN claims p ON p.id = c.parent_id \
           WHERE c.id = e.claim_id) AS parent_message_id \
         FROM outcome_events e \
     WHERE e.consumer = ?1 AND e.destination = ?3 AND e.sent_utc IS NULL \
       AND (e.lease_until IS NULL OR e.lease_until < ",
        now_ms!(),
        ") AND NOT EXISTS (SELECT 1 FROM outcome_events p WHERE p.claim_id = e.claim_id \
                       AND p.id < e.id AND p.sent_utc IS NULL AND p.tries > 0 \
                       AND p.destination = e.destination) \
     ORDER BY e.id LIMIT ?2"
    ),
    mark_outcomes_sent: concat!(
        "UPDATE outcome_events SET sent_utc = ",
        now_ms!(),
        ", lease_owner = NULL, lease_until = NULL \
     WHERE id IN (SELECT value FROM json_each(?1)) AND sent_utc IS NULL"
    ),
    oldest_unsent_outcome: concat!(
        "SELECT ",
        outcome_cols!(),
        " FROM outcome_events \
     WHERE consumer = ?1 AND destination = ?2 AND sent_utc IS NULL ORDER BY id LIMIT 1"
    ),
    trace_parents: "SELECT id, trace_parent FROM claims \
     WHERE id IN (SELECT value FROM json_each(?1)) AND trace_parent IS NOT NULL",
    wake_outcomes: concat!(
        "UPDATE outcome_events SET lease_until = NULL \
     WHERE consumer = ?1 AND destination = ?2 AND sent_utc IS NULL AND tries > 0 \
       AND lease_until > ",
        now_ms!()
    ),
    retry_outcomes: concat!(
        "UPDATE outcome_events SET lease_owner = NULL, lease_until = ",
        now_ms!(),
        " + ?2, tries = tries + 1, last_error = ?3 \
     WHERE id IN (SELECT value FROM json_each(?1)) AND sent_utc IS NULL"
    ),
    count_outcomes: concat!(
        "SELECT consumer, destination, COUNT(*) AS n, ",
        now_ms!(),
        " - MIN(at_utc) AS oldest_ms FROM outcome_events WHERE sent_utc IS NULL \
     GROUP BY consumer, destination"
    ),
    adopt_outcomes: "UPDATE outcome_events SET destination = ?2 \
     WHERE consumer = ?1 AND destination = '' AND sent_utc IS NULL",
    prune_outcomes: concat!(
        "DELETE FROM outcome_events WHERE id IN (SELECT id FROM outcome_events \
     WHERE sent_utc < ",
        now_ms!(),
        " - ?1 ORDER BY sent_utc LIMIT ?2)"
    ),
};

/// [`INSERT_OUTCOME`] for many claims at once: the rows of a `VALUES` list `v(p1, p2, p3, p4)`
/// (claim id, actor, action, reason) joined to their claims, written after `WITH v(...) AS
/// (VALUES ...)`; the JSON array of `[consumer, destination]` pairs is the statement's last
/// parameter, `?{last}`.
pub(super) const INSERT_OUTCOMES_FROM_V: &str = concat!(
    "INSERT INTO outcome_events (claim_id, consumer, tenant, message_id, idem_key, state, \
     attempt, provider_status, provider_id, provider_response, reason, actor, action, at_utc, \
     destination, claim_version) \
     SELECT c.id, c.consumer, c.tenant, c.message_id, c.idem_key, c.state, c.attempt, \
     c.provider_status, c.provider_id, c.provider_response, COALESCE(v.p4, c.last_error), \
     v.p2, v.p3, ",
    now_ms!(),
    ", json_extract(d.value, '$[1]'), c.version FROM v JOIN claims c ON c.id = v.p1 \
     JOIN json_each(?{last}) d ON json_extract(d.value, '$[0]') = c.consumer"
);

/// The outcome events of the claim `?1` as it is now (after the change, in the change's
/// transaction), one per destination of its consumer in the JSON array `?5` of `[consumer,
/// destination]` pairs; `?2` actor, `?3` action, `?4` the reason when the history line gives
/// one (an operator's note), else the last error.
pub(super) const INSERT_OUTCOME: &str = concat!(
    "INSERT INTO outcome_events (claim_id, consumer, tenant, message_id, idem_key, state, \
     attempt, provider_status, provider_id, provider_response, reason, actor, action, at_utc, \
     destination, claim_version) \
     SELECT c.id, c.consumer, c.tenant, c.message_id, c.idem_key, c.state, c.attempt, \
     c.provider_status, c.provider_id, c.provider_response, COALESCE(?4, c.last_error), ?2, ?3, ",
    now_ms!(),
    ", json_extract(d.value, '$[1]'), c.version FROM claims c \
     JOIN json_each(?5) d ON json_extract(d.value, '$[0]') = c.consumer WHERE c.id = ?1"
);
