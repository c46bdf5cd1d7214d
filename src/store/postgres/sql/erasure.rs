//! The statements of erasure (`Statements::erase_claim`, `Statements::erase_due`, and
//! [`ERASE_DUE_BATCH`]): a finished claim's payload, provider answer and error blanked, the row
//! and its fingerprint kept.

/// A history line appended to an archived claim's `history` (0027), as `claim_events` would
/// hold it: a JSON array of one object.
macro_rules! archived_line {
    ($actor:literal, $action:literal, $outcome:literal, $status:literal, $detail:literal) => {
        concat!(
            "pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object( \
               'id', pg_catalog.nextval(pg_catalog.pg_get_serial_sequence('claim_events', 'id')), \
               'claim_id', id, 'attempt', attempt, 'at_utc', now(), 'actor', ",
            $actor,
            ", 'action', ",
            $action,
            ", 'outcome', ",
            $outcome,
            ", 'provider_status', ",
            $status,
            ", 'detail', ",
            $detail,
            "))"
        )
    };
}

/// Erase one finished claim not erased yet, bumping its version (not `updated_utc`: the
/// retention clock keeps running from its last change), with its history line (`$2` to `$6`),
/// returning it: id. An erased payload is empty. An archived claim is erased in the archive,
/// its history line appended to the history it keeps.
pub(super) const ERASE_CLAIM: &str = concat!(
    "WITH r AS ( \
       UPDATE claims SET payload = ''::bytea, provider_response = NULL, last_error = NULL, \
         erased_utc = now(), version = version + 1 \
       WHERE id = $1 AND state IN ('completed', 'failed') AND erased_utc IS NULL \
       RETURNING ",
    claim_cols!(),
    "), e AS ( \
       INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, \
                                 detail) \
       SELECT id, attempt, $2, $3, $4, $5, $6 FROM r), \
     ra AS ( \
       UPDATE claims_archive SET payload = ''::bytea, provider_response = NULL, \
         last_error = NULL, erased_utc = now(), version = version + 1, history = history || ",
    archived_line!("$2::text", "$3::text", "$4::text", "$5::int", "$6::text"),
    " WHERE id = $1 AND state IN ('completed', 'failed') AND erased_utc IS NULL \
       RETURNING ",
    claim_cols!(),
    ") SELECT * FROM r UNION ALL SELECT * FROM ra"
);

/// The ids of a consumer's finished claims not erased yet whose last change is older than
/// the window, oldest first: consumer, window ms, limit.
pub(super) const ERASE_DUE: &str = "\
    SELECT id FROM claims WHERE consumer = $1 AND state IN ('completed', 'failed') \
      AND erased_utc IS NULL AND updated_utc < now() - $2 * interval '1 millisecond' \
    ORDER BY updated_utc LIMIT $3";

/// How many claims payload retention would erase (`n`): consumer, window ms.
pub(super) const ERASE_DUE_COUNT: &str = "\
    SELECT (SELECT COUNT(*) FROM claims WHERE consumer = $1 \
      AND state IN ('completed', 'failed') AND erased_utc IS NULL \
      AND updated_utc < now() - $2 * interval '1 millisecond') \
    + (SELECT COUNT(*) FROM claims_archive WHERE consumer = $1 AND erased_utc IS NULL \
      AND updated_utc < now() - $2 * interval '1 millisecond') AS n";

/// One batch of payload retention in one statement: a consumer's finished claims not erased
/// yet whose last change is older than the window, oldest first, chosen once (materialised,
/// locked, skipping rows someone holds), erased with a history line each by `retention`,
/// returning how many (`n`): consumer, window ms, limit, the history line's detail. The
/// predicate stands on the update too, as retention's deletion does: a claim redriven
/// meanwhile is left alone.
pub(crate) const ERASE_DUE_BATCH: &str = concat!(
    "\
    WITH batch AS MATERIALIZED ( \
      SELECT id AS batch_id FROM claims \
      WHERE consumer = $1 AND state IN ('completed', 'failed') AND erased_utc IS NULL \
        AND updated_utc < now() - $2 * interval '1 millisecond' \
      ORDER BY updated_utc LIMIT $3 FOR UPDATE SKIP LOCKED), \
    r AS ( \
      UPDATE claims SET payload = ''::bytea, provider_response = NULL, last_error = NULL, \
        erased_utc = now(), version = version + 1 \
      FROM batch WHERE id = batch_id AND state IN ('completed', 'failed') \
        AND erased_utc IS NULL \
      RETURNING id, attempt), \
    e AS ( \
      INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, \
                                detail) \
      SELECT id, attempt, 'retention', 'erase', 'erased', NULL, $4 FROM r), \
    archived AS MATERIALIZED ( \
      SELECT id AS archived_id FROM claims_archive \
      WHERE consumer = $1 AND erased_utc IS NULL \
        AND updated_utc < now() - $2 * interval '1 millisecond' \
      ORDER BY updated_utc LIMIT $3), \
    ra AS ( \
      UPDATE claims_archive SET payload = ''::bytea, provider_response = NULL, \
        last_error = NULL, erased_utc = now(), version = version + 1, history = history || ",
    archived_line!(
        "'retention'",
        "'erase'",
        "'erased'",
        "NULL::int",
        "$4::text"
    ),
    " FROM archived WHERE id = archived_id AND erased_utc IS NULL RETURNING id) \
    SELECT (SELECT COUNT(*) FROM r) + (SELECT COUNT(*) FROM ra) AS n"
);
