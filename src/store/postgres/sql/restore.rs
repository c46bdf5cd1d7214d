//! The statements that find a claim after a fenced write of it changed nothing, and write a
//! claim that vanished from the store back (`Statements::locate_claim`,
//! `Statements::restore_claim`).

/// The row of a claim's key, whatever its id: a re-sent message may have created it again
/// under a new id.
pub(super) const LOCATE_CLAIM: &str =
    "SELECT id, state FROM claims WHERE consumer = $1 AND tenant = $2 AND message_id = $3";

/// The claim written back with what its worker learnt, its history line (`$23` to `$27`:
/// actor, action, outcome, provider status, detail) and its outcome events for the consumers
/// bound as `$28`, in one statement; nothing when a row of its key exists (`ON CONFLICT DO
/// NOTHING`: a claim created again meanwhile is never overwritten). A new id: the ids a lost
/// primary handed out may be handed out again by the new one.
pub(super) const RESTORE_CLAIM: &str = concat!(
    "WITH s AS (INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, \
       payload, content_type, state, attempt, provider_status, provider_response, last_error, \
       reconciled, provider_id, lease_until, received_utc, resent_count, order_key, \
       trace_parent, waits, handoff, handoff_attempt, lease_owner, processed_utc, pending_utc) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text, $9::int, $10, $11, $12, $13, $14, \
       CASE WHEN $15::bigint IS NOT NULL THEN now() + $15 * interval '1 millisecond' END, \
       $16, $17, $18, $19, $20, $21::text, CASE WHEN $21::text IS NOT NULL THEN $9::int END, \
       $22, CASE WHEN $8::text IN ('completed', 'failed') THEN now() END, \
       CASE WHEN $8::text = 'pending' THEN now() END) \
     ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING ",
    outbox_returning!(),
    "), e AS ( \
       INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, \
                                 detail) \
       SELECT id, attempt, $23, $24, $25, $26, $27 FROM s), ",
    outbox_insert!("COALESCE($27, last_error)", "$23", "$24", "s", "$28"),
    " SELECT id, attempt FROM s"
);
