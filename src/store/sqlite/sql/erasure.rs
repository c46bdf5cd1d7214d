//! The statements of erasure (`Statements::erase_claim`, `Statements::erase_due`), as on
//! PostgreSQL.

/// Erase one finished claim not erased yet, bumping its version (not `updated_utc`), returning
/// it (its history line follows in the same transaction): id. An erased payload is empty.
pub(super) const ERASE_CLAIM: &str = concat!(
    "UPDATE claims SET payload = X'', provider_response = NULL, last_error = NULL, \
       erased_utc = ",
    now_ms!(),
    ", version = version + 1 \
     WHERE id = ?1 AND state IN ('completed', 'failed') AND erased_utc IS NULL RETURNING ",
    claim_cols!()
);

/// The ids of a consumer's finished claims not erased yet whose last change is older than
/// the window, oldest first: consumer, window ms, limit.
pub(super) const ERASE_DUE: &str = concat!(
    "SELECT id FROM claims WHERE consumer = ?1 AND state IN ('completed', 'failed') \
       AND erased_utc IS NULL AND updated_utc < ",
    now_ms!(),
    " - ?2 ORDER BY updated_utc LIMIT ?3"
);

/// How many claims payload retention would erase (`n`): consumer, window ms.
pub(super) const ERASE_DUE_COUNT: &str = concat!(
    "SELECT COUNT(*) AS n FROM claims WHERE consumer = ?1 AND state IN ('completed', 'failed') \
       AND erased_utc IS NULL AND updated_utc < ",
    now_ms!(),
    " - ?2"
);
