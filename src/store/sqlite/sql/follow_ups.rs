//! The statements of follow-ups (docs/follow-ups.md): the claim a settle creates, and a
//! claim's parent and children for the claim page and `claimd claims show`.

/// Waiting like an enqueued claim (no lease owner, "not called yet", the sweeper's after 60 s
/// if no pickup takes it), or parked with its reason (`?9`). Parameters as
/// `Statements::insert_follow_up` lists them.
pub(super) const INSERT_FOLLOW_UP: &str = concat!(
    "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
     content_type, lease_owner, handoff, handoff_attempt, parent_id, state, last_error, \
     lease_until, received_utc, started_utc, updated_utc) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, CASE WHEN ?9 IS NULL THEN 'not_called' END, \
     CASE WHEN ?9 IS NULL THEN 1 END, ?8, \
     CASE WHEN ?9 IS NULL THEN 'started' ELSE 'needs_attention' END, ?9, \
     CASE WHEN ?9 IS NULL THEN ",
    now_ms!(),
    " + 60000 END, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ", ",
    now_ms!(),
    ") ON CONFLICT (consumer, tenant, message_id) DO NOTHING"
);

/// The claim whose settle created claim `?1`.
pub(super) const CLAIM_PARENT: &str = concat!(
    "SELECT ",
    claim_cols!(),
    " FROM claims WHERE id = (SELECT parent_id FROM claims WHERE id = ?1)"
);

/// The claims claim `?1`'s settles created, oldest first.
pub(super) const CLAIM_CHILDREN: &str = concat!(
    "SELECT ",
    claim_cols!(),
    " FROM claims WHERE parent_id = ?1 ORDER BY id"
);
