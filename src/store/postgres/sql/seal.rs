//! PostgreSQL's statements of `claimd keys` and of sealing enqueued claims
//! ([`SealStatements`]): pages of the sealed columns read as stored, and fenced writes back.

use crate::store::sealing::SealStatements;

/// The statements (see [`SealStatements`]).
pub(crate) const SEAL_STATEMENTS: SealStatements = SealStatements {
    // Claims and archived claims (0027) alike: a claim is in one of the two, and the write
    // returns a row (the count the caller reads) only where it changed one.
    claims_page: "SELECT * FROM ( \
        (SELECT id, version, payload, provider_response, last_error FROM claims \
          WHERE id > $1 ORDER BY id LIMIT $2) \
        UNION ALL (SELECT id, version, payload, provider_response, last_error \
          FROM claims_archive WHERE id > $1 ORDER BY id LIMIT $2)) u ORDER BY id LIMIT $2",
    claim_one: "SELECT id, version, payload, provider_response, last_error FROM claims \
        WHERE id = $1",
    reseal_claim: "WITH c AS (UPDATE claims \
          SET payload = $2, provider_response = $3, last_error = $4 \
          WHERE id = $1 AND version = $5 AND payload = $6 \
            AND provider_response IS NOT DISTINCT FROM $7 \
            AND last_error IS NOT DISTINCT FROM $8 RETURNING 1), \
        a AS (UPDATE claims_archive \
          SET payload = $2, provider_response = $3, last_error = $4 \
          WHERE id = $1 AND version = $5 AND payload = $6 \
            AND provider_response IS NOT DISTINCT FROM $7 \
            AND last_error IS NOT DISTINCT FROM $8 RETURNING 1) \
        SELECT 1 FROM c UNION ALL SELECT 1 FROM a",
    outcome_events_page: "SELECT id, provider_response, reason, last_error FROM outcome_events \
        WHERE id > $1 ORDER BY id LIMIT $2",
    reseal_outcome_event: "UPDATE outcome_events \
        SET provider_response = $2, reason = $3, last_error = $4 \
        WHERE id = $1 AND provider_response IS NOT DISTINCT FROM $5 \
          AND reason IS NOT DISTINCT FROM $6 AND last_error IS NOT DISTINCT FROM $7",
    claim_events_page: "SELECT id, detail FROM claim_events WHERE id > $1 ORDER BY id LIMIT $2",
    reseal_claim_event: "UPDATE claim_events SET detail = $2 \
        WHERE id = $1 AND detail IS NOT DISTINCT FROM $3",
};
