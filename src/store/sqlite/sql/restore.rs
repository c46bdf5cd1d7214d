//! The statements that find a claim after a fenced write of it changed nothing, and write a
//! claim that vanished from the store back (`Statements::locate_claim`,
//! `Statements::restore_claim`).

/// The row of a claim's key, whatever its id: a re-sent message may have created it again
/// under a new id.
pub(super) const LOCATE_CLAIM: &str =
    "SELECT id, state FROM claims WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3";

/// The claim written back with what its worker learnt, returning `id, attempt` (its history
/// line and outcome events follow in the same transaction); nothing when a row of its key
/// exists (`ON CONFLICT DO NOTHING`: a claim created again meanwhile is never overwritten).
pub(super) const RESTORE_CLAIM: &str = concat!(
    "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
       content_type, state, attempt, provider_status, provider_response, last_error, \
       reconciled, provider_id, lease_until, received_utc, resent_count, order_key, \
       trace_parent, waits, handoff, handoff_attempt, lease_owner, processed_utc, pending_utc, \
       started_utc, updated_utc) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
       CASE WHEN ?15 IS NOT NULL THEN ",
    now_ms!(),
    " + ?15 END, ?16, ?17, ?18, ?19, ?20, ?21, CASE WHEN ?21 IS NOT NULL THEN ?9 END, ?22, \
       CASE WHEN ?8 IN ('completed', 'failed') THEN ",
    now_ms!(),
    " END, CASE WHEN ?8 = 'pending' THEN ",
    now_ms!(),
    " END, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ") ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING id, attempt"
);
