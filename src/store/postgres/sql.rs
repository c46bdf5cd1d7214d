//! The PostgreSQL statements, each under its name in [`STATEMENTS`] (the batched ones live in `batch`).
//! Times are `timestamptz` from the database's `now()`, never the worker's.

use crate::store::dialect::Statements;

/// Key of the advisory lock that serialises retention across instances ("claimd-prune").
pub(super) const PRUNE_LOCK_KEY: i64 = 0x636c_6169_6d64_7072;

/// Opens the transaction that holds the retention lock.
pub(super) const PRUNE_BEGIN: &str = "BEGIN";
/// Takes the retention lock until the transaction ends (`$1`: [`PRUNE_LOCK_KEY`]).
pub(super) const TRY_PRUNE_LOCK: &str = "SELECT pg_try_advisory_xact_lock($1)";
/// The lock a take of waiting claims by order keys' lines holds until its commit, one per
/// consumer (`$1`: `claimd:line:` and the consumer's name): such takes of one consumer run one
/// at a time across instances, each seeing what the one before took.
pub(super) const LINE_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

/// Gives the retention lock back: ends its transaction.
pub(super) const PRUNE_UNLOCK: &str = "ROLLBACK";

/// The begin of a database effect's transaction, its `effect.timeout` in milliseconds
/// following: the limit of each of its statements, set in the same round trip.
pub(super) const BEGIN_WITH_TIMEOUT_MS: &str = "BEGIN; SET LOCAL statement_timeout = ";

/// A transaction for a count over many rows: JIT compiling off ([`Dialect::fetch_count`]).
///
/// [`Dialect::fetch_count`]: crate::store::dialect::Dialect::fetch_count
pub(super) const BEGIN_WITHOUT_JIT: &str = "BEGIN; SET LOCAL jit = off";

/// The filters `list_claims` and `search_claims` share (see `Statements::list_claims`).
macro_rules! pg_list_where {
    () => {
        "($1::text IS NULL OR state = $1) \
       AND ($2::text IS NULL OR consumer = $2) \
       AND (NOT $3 OR (state = 'started' AND lease_until < now())) \
       AND ($4::timestamptz IS NULL OR received_utc >= $4) \
       AND ($6::timestamptz IS NULL OR received_utc < $6) \
       AND ($7::text IS NULL OR tenant = $7) \
       AND ($8::timestamptz IS NULL OR (received_utc, id) < ($8, $9::bigint))"
    };
}

/// Newest first, the keyset's order.
macro_rules! pg_list_order {
    () => {
        " ORDER BY received_utc DESC, id DESC LIMIT $5"
    };
}

/// What a settle's update returns for its outcome event (the row after the change).
macro_rules! outbox_returning {
    () => {
        "id, attempt, consumer, tenant, message_id, idem_key, state, provider_status, \
         provider_id, provider_response, last_error, version"
    };
}

/// The CTE `o` that writes the outcome events of each row of `$from` (a settle's or an
/// operator move's `RETURNING`, with the claim's `version`): one per destination of its
/// consumer in the JSON array `$consumers` of `[consumer, destination]` pairs (`[]`: none, and
/// then it writes nothing). In the same statement, so they commit exactly with the change.
macro_rules! outbox_insert {
    ($reason:literal, $actor:literal, $action:literal, $from:literal, $consumers:literal) => {
        concat!(
            "o AS (INSERT INTO outcome_events (claim_id, consumer, tenant, message_id, \
             idem_key, state, attempt, provider_status, provider_id, provider_response, reason, \
             actor, action, destination, claim_version) SELECT id, consumer, tenant, message_id, \
             idem_key, state, attempt, provider_status, provider_id, provider_response, ",
            $reason,
            ", ",
            $actor,
            ", ",
            $action,
            ", dst.dd, version FROM ",
            $from,
            " CROSS JOIN LATERAL (SELECT d->>0 AS dc, d->>1 AS dd FROM jsonb_array_elements(",
            $consumers,
            "::jsonb) d) dst WHERE dst.dc = consumer)"
        )
    };
}

/// The fence of a write that names its claims by id, batched or chosen (I2: the claim is still
/// `started`), in a form no index of open claims can serve, so the planner finds each row by
/// its primary key whatever its statistics say. With `c.state = 'started'` and statistics from before a
/// backlog of waiting claims, it walked a partial index of every started claim and hashed
/// them all, once per batch: 160 ms for a settle of 20 claims with 200,000 waiting, against
/// 80 buffers by primary key (docs/performance.md, "A backlog of enqueued claims").
macro_rules! pg_still_started {
    () => {
        "c.state || '' = 'started'"
    };
}

/// The fenced update of a settle (I2), up to its `RETURNING`: from `started` for the worker
/// holding the attempt, from `pending` (or another state) for a poll or a provider event that
/// read the claim at that attempt and version (`$12`; NULL for the worker, whose attempt is its
/// own). Every settle bumps the version. Parameters as `Statements::settle` lists them.
// A claim that completes drops its last error: a transient error that did not decide the
// outcome would read as the reason for it (the history keeps every error). `processed_utc` is
// the settle's own moment, not its transaction's start: a database effect's settle ends the
// transaction that did its work.
macro_rules! pg_settle_update {
    () => {
        " \
      UPDATE claims SET \
        state = COALESCE($3::text, state), \
        provider_status = COALESCE($4, provider_status), \
        provider_response = COALESCE($5, provider_response), \
        last_error = CASE WHEN $3::text = 'completed' THEN NULL ELSE COALESCE($6, last_error) END, \
        reconciled = reconciled OR $7, \
        handoff = COALESCE($8::text, handoff), \
        handoff_attempt = CASE WHEN $8::text IS NOT NULL THEN attempt ELSE handoff_attempt END, \
        waits = waits + CASE WHEN $8::text IS NOT NULL THEN 1 ELSE 0 END, \
        processed_utc = CASE WHEN $3::text IN ('completed', 'failed') THEN clock_timestamp() \
                             ELSE processed_utc END, \
        lease_owner = CASE WHEN $3::text IS NULL OR $3::text = 'started' THEN lease_owner END, \
        lease_until = CASE WHEN $9::bigint IS NOT NULL THEN now() + $9 * interval '1 millisecond' \
                           WHEN $3::text IS NULL OR $3::text = 'started' THEN lease_until END, \
        provider_id = COALESCE($10, provider_id), \
        pending_utc = CASE WHEN $3::text = 'pending' THEN COALESCE(pending_utc, now()) \
                           ELSE pending_utc END, \
        version = version + 1, \
        updated_utc = now() \
      WHERE id = $1 AND attempt = $2 AND state = $11 \
        AND ($12::bigint IS NULL OR version = $12)"
    };
}

/// The CTE `e` that writes a settle's history line for the row of `s` it changed: actor,
/// action, outcome, provider status and detail are `$13` to `$17`.
macro_rules! pg_settle_event {
    () => {
        "e AS ( \
      INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, \
                                detail) \
      SELECT id, attempt, $13, $14, $15, $16, $17 FROM s)"
    };
}

/// Retention's condition that a claim has no follow-up still open (docs/follow-ups.md): a
/// parent stays while a child it created is not finished.
macro_rules! open_child {
    () => {
        "NOT EXISTS (SELECT 1 FROM claims k WHERE k.parent_id = claims.id \
         AND k.state NOT IN ('completed', 'failed'))"
    };
}

#[macro_use]
mod lines;
pub(super) mod accounts;
mod erasure;
mod follow_ups;
mod reads;
mod restore;
mod schedules;
pub(super) mod seal;
mod takes;

pub(super) use erasure::ERASE_DUE_BATCH;

/// The statements the one body runs, in this dialect, each under its name.
pub(super) const STATEMENTS: Statements = Statements {
    // A claim that waits is written with its lease owner NULL (its line) or 'schedule' and
    // its lease ending at its time (`$13`), at attempt `$14` (NewClaim::lease_owner, ...).
    insert_claim: concat!(
        "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
     content_type, lease_owner, lease_until, claim_token, handoff, handoff_attempt, \
     order_key, not_before, attempt, trace_parent, priority) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, \
             COALESCE($13::timestamptz, CASE WHEN $8::text IS NOT NULL \
               THEN now() + $9 * interval '1 millisecond' END), \
             NULLIF($10, ''), CASE WHEN $11 THEN 'not_called' END, \
             CASE WHEN $11 THEN $14::int END, $12, $13, $14, $15, $16) \
     ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING ",
        claim_cols!()
    ),
    // Counts a repeat delivery, unless the row is this call's own (its token: a commit whose
    // reply was lost), which is no repeat.
    count_repeat: concat!(
        "UPDATE claims SET \
       duplicate_count = duplicate_count + CASE WHEN claim_token = NULLIF($5, '') THEN 0 \
                                                WHEN fingerprint = $4 THEN 1 ELSE 0 END, \
       mismatch_count = mismatch_count + CASE WHEN claim_token = NULLIF($5, '') THEN 0 \
                                              WHEN fingerprint = $4 THEN 0 ELSE 1 END \
     WHERE consumer = $1 AND tenant = $2 AND message_id = $3 RETURNING ",
        claim_cols!()
    ),
    get_claim: concat!(
        "SELECT ",
        claim_cols!(),
        ", payload FROM claims WHERE consumer = $1 AND tenant = $2 AND message_id = $3"
    ),
    find_claim: reads::FIND_CLAIM,
    state_of: "SELECT state FROM claims WHERE consumer = $1 AND tenant = $2 AND message_id = $3",
    // Fenced settle and its history line in one statement (I2), returning the row it changed,
    // and its outcome event for the consumers bound as `$18`.
    settle: concat!(
        "WITH s AS (",
        pg_settle_update!(),
        " RETURNING ",
        outbox_returning!(),
        "), ",
        pg_settle_event!(),
        ", ",
        outbox_insert!("COALESCE($17, last_error)", "$13", "$14", "s", "$18"),
        " SELECT id, attempt FROM s"
    ),
    // The same settle and history line without the outbox's CTE (no `$18`): chosen when the
    // settle writes no outcome event, which then costs nothing.
    settle_plain: concat!(
        "WITH s AS (",
        pg_settle_update!(),
        " RETURNING id, attempt), ",
        pg_settle_event!(),
        " SELECT id, attempt FROM s"
    ),
    insert_follow_up: follow_ups::INSERT_FOLLOW_UP,
    insert_event: "\
    INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, detail) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)",
    // A fenced write that lost, kept in the history with what the claim had become, read in
    // the same statement (no state change, no fence).
    insert_fenced_out_event: "\
    INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, detail) \
    SELECT id, $2, $3, $4, $5, $6, \
      COALESCE($7, '') || ' (claim was ' || state || '@v' || version || ', attempt ' || attempt \
        || ')' \
    FROM claims WHERE id = $1",
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
     WHERE id = $1 AND attempt = $2 AND state = 'started'",
    note_resent: "\
    UPDATE claims SET resent_count = resent_count + 1 \
    WHERE id = $1 AND attempt = $2 AND state = 'started'",
    unnote_resent: "\
    UPDATE claims SET resent_count = resent_count - 1 \
    WHERE id = $1 AND attempt = $2 AND state = 'started' AND resent_count > 0",
    list_claims: reads::LIST_CLAIMS,
    // Stuck claims alone: the literal predicate lets the planner walk the partial index
    // `claims_started_received` backwards (0012), in every plan, generic or not; `$3` is
    // true and only keeps the parameters of `list_claims`.
    list_stuck_claims: concat!(
        "SELECT ",
        claim_cols!(),
        " FROM claims WHERE state = 'started' AND lease_until < now() AND $3 AND ",
        pg_list_where!(),
        pg_list_order!()
    ),
    // One arm per way a text can match, each a range (or equality) on its own index
    // (0009_claim_search.sql) with every filter and its own order and limit: the newest page
    // of matches is within the union of each arm's newest page. A single OR let the planner
    // walk `claims_received` backwards in the hope of finding a page soon: 4 s at 10 million
    // claims for a text nothing matched (docs/performance.md, "Claim search").
    search_claims: concat!(
        "SELECT ",
        claim_cols!(),
        " FROM claims WHERE id IN ( \
       SELECT id FROM (SELECT id FROM claims \
         WHERE message_id COLLATE \"C\" >= $10 AND message_id COLLATE \"C\" < $11 AND ",
        pg_list_where!(),
        pg_list_order!(),
        ") AS by_id \
       UNION ALL SELECT id FROM (SELECT id FROM claims \
         WHERE idem_key COLLATE \"C\" >= $10 AND idem_key COLLATE \"C\" < $11 AND ",
        pg_list_where!(),
        pg_list_order!(),
        ") AS by_key \
       UNION ALL SELECT id FROM (SELECT id FROM claims \
         WHERE provider_id IS NOT NULL AND provider_id COLLATE \"C\" >= $10 \
           AND provider_id COLLATE \"C\" < $11 AND ",
        pg_list_where!(),
        pg_list_order!(),
        ") AS by_provider_id \
       UNION ALL SELECT id FROM (SELECT id FROM claims WHERE tenant <> '' AND tenant = $10 AND ",
        pg_list_where!(),
        pg_list_order!(),
        ") AS by_tenant)",
        pg_list_order!()
    ),
    // A prefix compared with substr (not LIKE): the operator's text may hold `%` or `_`.
    list_parked_by_reason: concat!(
        "SELECT ",
        claim_cols!(),
        " FROM claims \
     WHERE state = 'needs_attention' AND consumer = $1 \
       AND substr(COALESCE(last_error, ''), 1, length($2::text)) = $2::text \
     ORDER BY received_utc DESC, id DESC LIMIT $3"
    ),
    claim_parent: follow_ups::CLAIM_PARENT,
    claim_children: follow_ups::CLAIM_CHILDREN,
    list_events: reads::LIST_EVENTS,
    // Takeover: bump the fencing token and renew the lease in the same statement. The batch is
    // chosen once, in a materialised CTE (a `WHERE id IN (SELECT ... LIMIT n FOR UPDATE)`
    // subquery may be re-scanned by the plan and take more than `n`), and the predicate is
    // repeated on the UPDATE so a row settled meanwhile is never taken.
    // `held_by` is the lease holder the claim is taken from (a takeover's history says whose
    // lease ran out).
    take_stale: concat!(
        "WITH stale AS MATERIALIZED ( \
       SELECT id AS stale_id, lease_owner AS held_by FROM claims w \
       WHERE consumer = $1 AND state = 'started' AND lease_until < LEAST(now(), $5) AND NOT ",
        pg_stale_in_line!("$6"),
        " ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED) \
     UPDATE claims SET ",
        take_attempt!(),
        "lease_owner = $3, \
       lease_until = now() + $4 * interval '1 millisecond', started_utc = now(), \
       version = version + 1, updated_utc = now() \
     FROM stale WHERE id = stale_id \
       AND state = 'started' AND lease_until < LEAST(now(), $5) \
     RETURNING ",
        claim_cols!(),
        ", payload, (EXTRACT(EPOCH FROM now() - COALESCE(not_before, received_utc)) * 1000)::bigint AS age_ms, \
       stale.held_by"
    ),
    // Pending claims whose next poll is due, leased to this poller for `$4` ms (others skip
    // them meanwhile); the attempt is unchanged (nothing is sent). Chosen once, in a
    // materialised CTE, with the predicate repeated on the UPDATE, as `take_stale`.
    take_pending: concat!(
        "WITH due AS MATERIALIZED ( \
       SELECT id AS due_id FROM claims \
       WHERE consumer = $1 AND state = 'pending' AND lease_until < now() \
       ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED) \
     UPDATE claims SET lease_owner = $3, lease_until = now() + $4 * interval '1 millisecond' \
     FROM due WHERE id = due_id AND state = 'pending' AND lease_until < now() \
     RETURNING ",
        claim_cols!(),
        ", payload, (EXTRACT(EPOCH FROM now() - COALESCE(pending_utc, received_utc)) * 1000)::bigint \
       AS age_ms, NULL::text AS held_by"
    ),
    take_enqueued: takes::TAKE_ENQUEUED,
    // As take_enqueued (the aged share `$8`, then by priority), among the heads of their lines
    // only: priority chooses between lines, never within one. The rows locked by the inner
    // SELECTs are updated by primary key.
    take_ordered: concat!(
        pg_take_waiting_set!("$7"),
        "WHERE id = ANY (ARRAY( \
       WITH aged AS MATERIALIZED ( \
         SELECT w.id FROM claims w \
         WHERE w.consumer = $1 AND w.state = 'started' AND w.lease_owner IS NULL \
           AND w.attempt = 1 AND NOT ",
        pg_behind_in_line!(),
        " ORDER BY w.id LIMIT $8 FOR UPDATE OF w SKIP LOCKED) \
       SELECT id FROM aged \
       UNION ALL \
       SELECT p.id FROM ( \
         SELECT w.id FROM claims w \
         WHERE w.consumer = $1 AND w.state = 'started' AND w.lease_owner IS NULL \
           AND w.attempt = 1 AND w.id <> ALL (ARRAY(SELECT id FROM aged)) AND NOT ",
        pg_behind_in_line!(),
        " ORDER BY w.priority DESC, w.id LIMIT $2 - $8 FOR UPDATE OF w SKIP LOCKED) p))",
        pg_take_waiting_returning!()
    ),
    // The tenants with waiting claims, walked in the partial index
    // claims_waiting_tenant_priority one step each (a loose index scan: the cost grows with
    // tenants, not with claims), then each tenant's takeable claims (at most the limit),
    // higher priority first, then oldest, interleaved by turn; the chosen ids are computed
    // once (an InitPlan) and locked by primary key. The tenant is matched as a range and the
    // rows ordered by (tenant, priority, id) so that only claims_waiting_tenant_priority
    // serves them: with `tenant = t` the planner may walk the primary key instead, filtering,
    // which reads a whole backlog of one tenant to reach another's first claim. The lock's
    // fence is `pg_still_started!`: the chosen ids are locked by primary key whatever the
    // statistics say.
    take_fair: concat!(
        pg_take_waiting_set!("$8"),
        "WHERE id = ANY (ARRAY( \
       SELECT c.id FROM claims c WHERE c.id = ANY (ARRAY( \
         WITH RECURSIVE tenants(t) AS ( \
           (SELECT tenant FROM claims WHERE consumer = $1 AND state = 'started' \
              AND lease_owner IS NULL ORDER BY tenant LIMIT 1) \
           UNION ALL \
           SELECT (SELECT c.tenant FROM claims c WHERE c.consumer = $1 \
                     AND c.state = 'started' AND c.lease_owner IS NULL AND c.tenant > tenants.t \
                   ORDER BY c.tenant LIMIT 1) \
           FROM tenants WHERE tenants.t IS NOT NULL) \
         SELECT x.id FROM tenants \
         CROSS JOIN LATERAL ( \
           SELECT w.id, row_number() OVER (ORDER BY w.tenant, w.priority DESC, w.id) AS rn FROM claims w \
           WHERE w.consumer = $1 AND w.tenant >= tenants.t AND w.tenant <= tenants.t \
             AND w.state = 'started' AND w.lease_owner IS NULL AND w.attempt = 1 AND NOT ",
        pg_behind_in_line!(),
        " ORDER BY w.tenant, w.priority DESC, w.id LIMIT $2) x \
         LEFT JOIN jsonb_each_text($7::jsonb) AS wt(tenant, weight) ON wt.tenant = tenants.t \
         WHERE tenants.t IS NOT NULL \
         ORDER BY x.rn::float8 / COALESCE(wt.weight::float8, 1), x.id LIMIT $2)) \
       AND ",
        pg_still_started!(),
        " AND c.lease_owner IS NULL FOR UPDATE SKIP LOCKED))",
        pg_take_waiting_returning!()
    ),
    // take_stale, with the batch chosen round-robin across tenants: every stale claim of the
    // consumer is ranked (the cost grows with the stale claims, only when fairness is on).
    line_head: "\
    SELECT o.message_id, o.state, o.attempt FROM claims o \
    WHERE o.consumer = $1 AND o.tenant = $2 AND o.order_key = $3 AND o.id <> $4 \
      AND o.state IN ('started', 'pending', 'needs_attention') \
      AND (o.id < $4 OR o.state <> 'started' \
           OR (o.lease_owner IS NOT NULL AND o.lease_owner <> 'schedule')) \
    ORDER BY o.id LIMIT 1",
    behind_in_line: "\
    SELECT COUNT(*) AS n FROM claims w \
    WHERE w.consumer = $1 AND w.tenant = $2 AND w.order_key = $3 AND w.id > $4 \
      AND w.state = 'started' AND w.lease_owner IS NULL",
    // As count_open's in_line: a redriven claim (lease expired) waits for the sweeper.
    in_line: "\
    SELECT consumer, COUNT(*) AS n FROM claims \
    WHERE state = 'started' AND lease_owner IS NULL AND order_key IS NOT NULL \
      AND COALESCE(lease_until >= now(), true) \
    GROUP BY consumer",
    // One statement, so no crash or store error leaves a due claim taken and out of its line.
    release_due_to_line: concat!(
        "UPDATE claims SET lease_owner = NULL, lease_until = NULL, attempt = attempt + 1, \
       handoff_attempt = CASE WHEN handoff = 'not_called' THEN attempt + 1 ELSE handoff_attempt END, \
       version = version + 1, updated_utc = now() \
     WHERE id = ANY (ARRAY( \
       SELECT id FROM claims WHERE consumer = $1 AND state = 'started' \
         AND lease_owner = 'schedule' AND order_key IS NOT NULL AND lease_until < now() \
       ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED)) \
     RETURNING ",
        claim_cols!(),
        ", payload"
    ),
    take_stale_fair: concat!(
        "WITH stale AS MATERIALIZED ( \
       SELECT id AS stale_id, lease_owner AS held_by FROM claims \
       WHERE id = ANY (ARRAY( \
         SELECT r.id FROM ( \
           SELECT id, tenant, row_number() OVER (PARTITION BY tenant ORDER BY lease_until, id) AS rn \
           FROM claims w WHERE consumer = $1 AND state = 'started' \
             AND lease_until < LEAST(now(), $5) AND NOT ",
        pg_stale_in_line!("$7"),
        ") r \
         LEFT JOIN jsonb_each_text($6::jsonb) AS wt(tenant, weight) ON wt.tenant = r.tenant \
         ORDER BY r.rn::float8 / COALESCE(wt.weight::float8, 1), r.id LIMIT $2)) \
         AND state = 'started' AND lease_until < LEAST(now(), $5) \
       FOR UPDATE SKIP LOCKED) \
     UPDATE claims SET ",
        take_attempt!(),
        "lease_owner = $3, \
       lease_until = now() + $4 * interval '1 millisecond', started_utc = now(), \
       version = version + 1, updated_utc = now() \
     FROM stale WHERE id = stale_id \
       AND state = 'started' AND lease_until < LEAST(now(), $5) \
     RETURNING ",
        claim_cols!(),
        ", payload, (EXTRACT(EPOCH FROM now() - COALESCE(not_before, received_utc)) * 1000)::bigint AS age_ms, \
       stale.held_by"
    ),
    // A registration never overwrites a higher generation, nor the same one with another
    // effect kind (the first registered stands: `registered_consumer` tells the loser).
    register_consumer: "\
    INSERT INTO claimd_consumers (name, key_template, max_key_length, keys_tenant, \
      max_payload_bytes, ordered, url_segments, generation, effect_kind, updated_utc) \
      VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, now()) \
    ON CONFLICT (name) DO UPDATE SET key_template = EXCLUDED.key_template, \
      max_key_length = EXCLUDED.max_key_length, keys_tenant = EXCLUDED.keys_tenant, \
      max_payload_bytes = EXCLUDED.max_payload_bytes, ordered = EXCLUDED.ordered, \
      url_segments = EXCLUDED.url_segments, generation = EXCLUDED.generation, \
      effect_kind = EXCLUDED.effect_kind, updated_utc = now() \
    WHERE claimd_consumers.generation < EXCLUDED.generation \
       OR (claimd_consumers.generation = EXCLUDED.generation \
           AND claimd_consumers.effect_kind IN ('', EXCLUDED.effect_kind))",
    registered_consumer: "SELECT generation, effect_kind FROM claimd_consumers WHERE name = $1",
    peek_stale: concat!(
        "SELECT ",
        claim_cols!(),
        ", (EXTRACT(EPOCH FROM now() - COALESCE(not_before, received_utc)) * 1000)::bigint AS age_ms, \
       lease_owner AS held_by \
     FROM claims WHERE consumer = $1 AND state = 'started' AND lease_until < now() \
     ORDER BY lease_until LIMIT $2"
    ),
    // Operator resolve and its history line in one statement, allowed only from the two states
    // bound as `$5`, `$6` (the claim model's rule) and, when `$7` and `$8` are given, only at
    // that attempt and version (the ones the operator saw); the event's parameters follow.
    resolve: concat!(
        "WITH r AS ( \
       UPDATE claims SET state = $4, \
         processed_utc = CASE WHEN $4 IN ('completed', 'failed') THEN COALESCE(processed_utc, now()) \
                              ELSE processed_utc END, \
         lease_owner = NULL, lease_until = NULL, operator_resolved = true, \
         version = version + 1, updated_utc = now() \
       WHERE consumer = $1 AND tenant = $2 AND message_id = $3 AND state IN ($5, $6) \
         AND ($7::int IS NULL OR attempt = $7) AND ($8::bigint IS NULL OR version = $8) \
       RETURNING ",
        claim_cols!(),
        "), e AS ( \
       INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, \
                                 detail) \
       SELECT id, attempt, $9, $10, $11, $12, $13 FROM r), ",
        outbox_insert!("COALESCE($13, last_error)", "$9", "$10", "r", "$14"),
        " SELECT * FROM r"
    ),
    // Operator redrive (back to `started`, attempt + 1, lease expired, hand-off recorded) and its
    // history line in one statement, allowed only from the states bound as `$4`, `$5` (and at
    // attempt `$6` and version `$7` when given).
    redrive: concat!(
        "WITH r AS ( \
       UPDATE claims SET state = 'started', attempt = attempt + 1, lease_owner = NULL, \
         lease_until = now() - interval '1 millisecond', handoff = 'operator_redrive', \
         handoff_attempt = attempt + 1, processed_utc = NULL, operator_resolved = false, \
         version = version + 1, updated_utc = now() \
       WHERE consumer = $1 AND tenant = $2 AND message_id = $3 AND erased_utc IS NULL AND state IN ($4, $5) \
         AND ($6::int IS NULL OR attempt = $6) AND ($7::bigint IS NULL OR version = $7) \
       RETURNING ",
        claim_cols!(),
        "), e AS ( \
       INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, \
                                 detail) \
       SELECT id, attempt, $8, $9, $10, $11, $12 FROM r), ",
        outbox_insert!("COALESCE($12, last_error)", "$8", "$9", "r", "$13"),
        " SELECT * FROM r"
    ),
    // Open work, over all time: small sets served by the partial index `claims_open_lease`
    // (its predicate is this one). For pending claims the age is the time since they became
    // pending. A started claim waits for its time (held by 'schedule' until its lease, which
    // ends at not_before), in its line (no holder, no expired lease; or held by its line
    // after its lease ran out: redriven, or due and not yet in it) or for its provider; the
    // oldest age leaves out the first two (they are not in flight: I8 pages on the rest) and
    // counts a scheduled send from its time.
    count_open: concat!(
        "SELECT consumer, state, COUNT(*) AS n, \
      COUNT(*) FILTER (WHERE lease_until < now() AND NOT ",
        pg_held_in_line!(),
        ") AS stuck, \
      COUNT(*) FILTER (WHERE (lease_until >= now() AND handoff_attempt = attempt \
                              AND handoff IN ('not_applied', 'undecided')) \
                          OR (lease_owner = 'schedule' AND lease_until >= now()) \
                          OR (lease_owner IS NULL AND order_key IS NOT NULL \
                              AND COALESCE(lease_until >= now(), true)) OR ",
        pg_held_in_line!(),
        ") AS waiting, \
      COUNT(*) FILTER (WHERE lease_owner = 'schedule' AND lease_until >= now()) AS scheduled, \
      COUNT(*) FILTER (WHERE (lease_owner IS NULL AND order_key IS NOT NULL \
                         AND COALESCE(lease_until >= now(), true)) OR ",
        pg_held_in_line!(),
        ") AS in_line, \
      (EXTRACT(EPOCH FROM now() - MIN(CASE WHEN state = 'pending' THEN pending_utc \
          WHEN lease_owner = 'schedule' AND lease_until >= now() THEN NULL \
          WHEN lease_owner IS NULL AND order_key IS NOT NULL AND COALESCE(lease_until >= now(), true) \
            THEN NULL WHEN ",
        pg_held_in_line!(),
        " THEN NULL \
          ELSE GREATEST(received_utc, not_before) END)) * 1000)::bigint AS oldest_ms \
    FROM claims w WHERE state IN ('started', 'pending', 'needs_attention') \
    GROUP BY consumer, state"
    ),
    // Throughput figures over the report window. The percentiles leave out claims an operator
    // resolved (`timed` counts the rest): they measure the provider and claimd, not a person,
    // nor a scheduled send's wait for its time (measured from the later of receipt and it).
    count_window: "\
    SELECT consumer, COUNT(*) AS claims, \
      COALESCE(SUM(duplicate_count), 0)::bigint AS duplicates, \
      COALESCE(SUM(mismatch_count), 0)::bigint AS mismatches, \
      COUNT(*) FILTER (WHERE state = 'completed') AS completed, \
      COUNT(*) FILTER (WHERE state = 'failed') AS failed, \
      COUNT(*) FILTER (WHERE resent_count > 0) AS resent, \
      COUNT(*) FILTER (WHERE state = 'completed' AND NOT operator_resolved) AS timed, \
      percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM processed_utc - GREATEST(received_utc, not_before))) \
        FILTER (WHERE state = 'completed' AND NOT operator_resolved) AS p50, \
      percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM processed_utc - GREATEST(received_utc, not_before))) \
        FILTER (WHERE state = 'completed' AND NOT operator_resolved) AS p95 \
    FROM claims WHERE received_utc >= $1 GROUP BY consumer",
    insert_dead_letter: "INSERT INTO dead_letters (consumer, reason, message_id) VALUES ($1, $2, $3)",
    count_dead_letters: "\
    SELECT consumer, COUNT(*) AS n FROM dead_letters WHERE at_utc >= $1 GROUP BY consumer",
    // One batch of retention, of one state (`$3`; the literal list lets the plan use the partial
    // index `claims_terminal_updated`). The batch is chosen once, in a materialised CTE (a
    // `WHERE id IN (SELECT ... LIMIT n FOR UPDATE)` subquery may be re-scanned by the plan and
    // delete more than `n`), locking its rows and skipping those an operator holds. The
    // predicate stands on the DELETE too: under READ COMMITTED a row another transaction changed
    // meanwhile (an operator's redrive of an old `failed` claim) must be terminal when it is
    // deleted, not only when it was chosen (I7).
    prune_batch: concat!(
        "WITH batch AS MATERIALIZED ( \
      SELECT id AS batch_id FROM claims \
      WHERE state IN ('completed', 'failed') AND state = $3 \
        AND updated_utc < now() - $1 * interval '1 millisecond' AND ",
        open_child!(),
        " ORDER BY updated_utc LIMIT $2 FOR UPDATE SKIP LOCKED) \
    DELETE FROM claims USING batch WHERE id = batch_id \
      AND state = $3 AND updated_utc < now() - $1 * interval '1 millisecond' AND ",
        open_child!()
    ),
    prune_count: concat!(
        "SELECT COUNT(*) AS n FROM claims \
    WHERE state IN ('completed', 'failed') AND state = $2 \
      AND updated_utc < now() - $1 * interval '1 millisecond' AND ",
        open_child!()
    ),
    prune_dead_letters: "\
    DELETE FROM dead_letters WHERE id IN ( \
      SELECT id FROM dead_letters WHERE at_utc < now() - $1 * interval '1 millisecond' \
      ORDER BY at_utc LIMIT $2)",
    prune_dead_letters_count: "\
    SELECT COUNT(*) AS n FROM dead_letters WHERE at_utc < now() - $1 * interval '1 millisecond'",
    mark_sweep: "\
    INSERT INTO claimd_heartbeats (name, instance, at_utc) VALUES ('sweeper', $1, now()) \
    ON CONFLICT (name) DO UPDATE SET instance = EXCLUDED.instance, at_utc = EXCLUDED.at_utc",
    probe_write: "\
    INSERT INTO claimd_heartbeats (name, instance, at_utc) VALUES ('write_probe', $1, now()) \
    ON CONFLICT (name) DO UPDATE SET instance = EXCLUDED.instance, at_utc = EXCLUDED.at_utc",
    last_sweep: "SELECT at_utc FROM claimd_heartbeats WHERE name = 'sweeper'",
    mark_destination: "\
    INSERT INTO claimd_heartbeats (name, instance, at_utc, detail) VALUES ($1, $2, now(), $3) \
    ON CONFLICT (name) DO UPDATE SET instance = EXCLUDED.instance, at_utc = EXCLUDED.at_utc, \
      detail = EXCLUDED.detail",
    list_destinations: "\
    SELECT name, instance, at_utc, detail FROM claimd_heartbeats \
    WHERE name LIKE 'destination:%' ORDER BY name",
    prune_destinations: "\
    DELETE FROM claimd_heartbeats WHERE name LIKE 'destination:%' \
      AND at_utc < now() - $1 * interval '1 millisecond'",
    find_by_provider_id: concat!(
        "SELECT ",
        claim_cols!(),
        // Compared in the "C" collation, the index's (equality is byte equality either way).
        ", payload FROM claims WHERE consumer = $1 AND provider_id IS NOT NULL \
       AND provider_id COLLATE \"C\" = $2 ORDER BY id DESC LIMIT 1"
    ),
    provider_event_seen: "\
    SELECT COUNT(*) AS n FROM provider_events WHERE consumer = $1 AND event_id = $2",
    insert_provider_event: "\
    INSERT INTO provider_events (consumer, event_id, event_type, object_id, claim_id, result) \
    VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (consumer, event_id) DO NOTHING",
    list_unmatched_events: "\
    SELECT consumer, event_id, event_type, object_id, received_utc FROM provider_events \
    WHERE claim_id IS NULL AND received_utc >= $1 ORDER BY received_utc DESC, id DESC LIMIT $2",
    prune_provider_events: "\
    DELETE FROM provider_events WHERE id IN ( \
      SELECT id FROM provider_events \
      WHERE received_utc < now() - $1 * interval '1 millisecond' ORDER BY received_utc LIMIT $2)",
    list_ledger_claims: reads::LIST_LEDGER_CLAIMS,
    save_ledger_run: "\
    INSERT INTO ledger_runs (consumer, at_utc, summary) VALUES ($1, now(), $2) \
    ON CONFLICT (consumer) DO UPDATE SET at_utc = EXCLUDED.at_utc, summary = EXCLUDED.summary",
    list_ledger_runs: "SELECT consumer, at_utc, summary FROM ledger_runs ORDER BY consumer",
    now: "SELECT now() AS now",
    ping: "SELECT 1",
    // The relay of a consumer is held by one instance at a time (`hold_outcome_relay`), so
    // the events are read without a lock and without a write. A claim's event waits while an
    // earlier one is held back after a failed send; a due earlier one is in the same batch
    // (the store keeps the first per claim).
    hold_outcome_relay: "\
    INSERT INTO outbox_relays (consumer, destination, owner, lease_until) \
    VALUES ($1, $4, $2, now() + $3 * interval '1 millisecond') \
    ON CONFLICT (consumer, destination) DO UPDATE SET owner = EXCLUDED.owner, \
      lease_until = EXCLUDED.lease_until \
    WHERE outbox_relays.owner = EXCLUDED.owner OR outbox_relays.lease_until < now() \
    RETURNING owner",
    release_outcome_relay: "DELETE FROM outbox_relays WHERE consumer = $1 AND owner = $2 \
      AND destination = $3",
    due_outcomes: concat!(
        "SELECT ",
        outcome_cols!(),
        ", (SELECT p.consumer FROM claims c JOIN claims p ON p.id = c.parent_id \
           WHERE c.id = e.claim_id) AS parent_consumer, \
         (SELECT p.message_id FROM claims c JOIN claims p ON p.id = c.parent_id \
           WHERE c.id = e.claim_id) AS parent_message_id \
         FROM outcome_events e \
     WHERE e.consumer = $1 AND e.destination = $3 AND e.sent_utc IS NULL \
       AND (e.lease_until IS NULL OR e.lease_until < now()) \
       AND NOT EXISTS (SELECT 1 FROM outcome_events p WHERE p.claim_id = e.claim_id \
                       AND p.id < e.id AND p.sent_utc IS NULL AND p.tries > 0 \
                       AND p.destination = e.destination) \
     ORDER BY e.id LIMIT $2"
    ),
    // `sent_utc + interval '0 seconds'`: the same test as `sent_utc IS NULL` in a form no
    // index of unsent events can serve, so the events are found by primary key whatever the
    // statistics say. Written plainly, statistics from before a backlog had the planner read
    // every unsent event once per batch (121 ms for 100 of 200,000; 400 buffers by key).
    mark_outcomes_sent: "\
    UPDATE outcome_events SET sent_utc = now(), lease_owner = NULL, lease_until = NULL \
    WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb)) \
      AND (sent_utc + interval '0 seconds') IS NULL",
    oldest_unsent_outcome: concat!(
        "SELECT ",
        outcome_cols!(),
        " FROM outcome_events \
     WHERE consumer = $1 AND destination = $2 AND sent_utc IS NULL ORDER BY id LIMIT 1"
    ),
    trace_parents: "\
    SELECT id, trace_parent FROM claims \
    WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb)) \
      AND trace_parent IS NOT NULL",
    wake_outcomes: "\
    UPDATE outcome_events SET lease_until = NULL \
    WHERE consumer = $1 AND destination = $2 AND sent_utc IS NULL AND tries > 0 \
      AND lease_until > now()",
    // By primary key whatever the statistics say, as `mark_outcomes_sent`.
    retry_outcomes: "\
    UPDATE outcome_events SET lease_owner = NULL, \
      lease_until = now() + $2 * interval '1 millisecond', tries = tries + 1, last_error = $3 \
    WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb)) \
      AND (sent_utc + interval '0 seconds') IS NULL",
    count_outcomes: "\
    SELECT consumer, destination, COUNT(*) AS n, \
      (EXTRACT(EPOCH FROM now() - MIN(at_utc)) * 1000)::bigint AS oldest_ms \
    FROM outcome_events WHERE sent_utc IS NULL GROUP BY consumer, destination",
    adopt_outcomes: "\
    UPDATE outcome_events SET destination = $2 \
    WHERE consumer = $1 AND destination = '' AND sent_utc IS NULL",
    prune_outcomes: "\
    DELETE FROM outcome_events WHERE id IN ( \
      SELECT id FROM outcome_events \
      WHERE sent_utc < now() - $1 * interval '1 millisecond' ORDER BY sent_utc LIMIT $2)",
};

/// `take_stale`, for benchmarks that explain its plan.
pub const TAKE_STALE: &str = STATEMENTS.take_stale;

/// `count_open`, for benchmarks that explain its plan.
pub const COUNT_OPEN: &str = STATEMENTS.count_open;

/// `count_window`, for benchmarks that explain its plan.
pub const COUNT_WINDOW: &str = STATEMENTS.count_window;
