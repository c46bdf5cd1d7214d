//! The statements that read claims where they may have been archived (migration 0027):
//! `claims` first, then `claims_archive`, with the same columns.

/// The claim, else its archived copy (migration 0027): the newest, should the message have
/// been claimed again after its first claim left for the archive. Operators' reads only: the
/// paths that claim, answer producers or match provider events read `claims` alone.
pub(super) const FIND_CLAIM: &str = concat!(
    "SELECT ",
    claim_cols!(),
    ", payload FROM ((SELECT 0 AS archived, ",
    claim_cols!(),
    ", payload FROM claims WHERE consumer = $1 AND tenant = $2 AND message_id = $3) \
 UNION ALL (SELECT 1, ",
    claim_cols!(),
    ", payload FROM claims_archive WHERE consumer = $1 AND tenant = $2 AND message_id = $3 \
 ORDER BY id DESC LIMIT 1)) found ORDER BY archived LIMIT 1"
);

/// Claims and archived claims (0027), newest first. The archive's branch is cut off before
/// it runs when the filter asks for open claims (its one-time filter on `$1` and `$3`).
pub(super) const LIST_CLAIMS: &str = concat!(
    "SELECT * FROM ((SELECT ",
    claim_cols!(),
    " FROM claims WHERE ",
    pg_list_where!(),
    pg_list_order!(),
    ") UNION ALL (SELECT ",
    claim_cols!(),
    " FROM claims_archive WHERE ($1::text IS NULL OR $1 IN ('completed', 'failed')) \
   AND NOT $3 AND ",
    pg_list_where!(),
    pg_list_order!(),
    ")) u",
    pg_list_order!()
);

/// The history of a claim, or of an archived claim, kept with it (0027).
pub(super) const LIST_EVENTS: &str = "\
SELECT attempt, at_utc, actor, action, outcome, provider_status, detail FROM ( \
  SELECT id, attempt, at_utc, actor, action, outcome, provider_status, detail \
  FROM claim_events WHERE claim_id = $1 \
  UNION ALL SELECT e.id, e.attempt, e.at_utc, e.actor, e.action, e.outcome, \
    e.provider_status, e.detail \
  FROM claims_archive a \
  CROSS JOIN LATERAL jsonb_populate_recordset(NULL::claim_events, a.history) e \
  WHERE a.id = $1) h ORDER BY id";

/// Claims and archived claims (0027) in key order.
pub(super) const LIST_LEDGER_CLAIMS: &str = "\
SELECT * FROM ((SELECT id, tenant, message_id, idem_key, state, received_utc, payload, \
  provider_id FROM claims \
WHERE consumer = $1 AND received_utc >= $2 AND received_utc < $3 \
  AND (idem_key COLLATE \"C\", id) > ($4 COLLATE \"C\", $5) \
ORDER BY consumer, idem_key COLLATE \"C\", id LIMIT $6) \
UNION ALL (SELECT id, tenant, message_id, idem_key, state, received_utc, payload, \
  provider_id FROM claims_archive \
WHERE consumer = $1 AND received_utc >= $2 AND received_utc < $3 \
  AND (idem_key COLLATE \"C\", id) > ($4 COLLATE \"C\", $5) \
ORDER BY consumer, idem_key COLLATE \"C\", id LIMIT $6)) u \
ORDER BY idem_key COLLATE \"C\", id LIMIT $6";
