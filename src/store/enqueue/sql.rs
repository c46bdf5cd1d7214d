//! The statements a producer's transaction runs ([`super::enqueue`]), per dialect. On
//! PostgreSQL the claim is written by the SQL function `claimd.enqueue_bytes` the migrations
//! install (one implementation for every language); on SQLite by these statements.

/// PostgreSQL: a consumer's registry entry: name.
#[cfg(feature = "postgres")]
pub(super) const PG_REGISTRY: &str = "SELECT key_template, max_key_length, \
    max_payload_bytes::bigint AS max_payload_bytes, ordered FROM claimd_consumers WHERE name = $1";

/// PostgreSQL: the claim, through the installed function: consumer, message id, payload,
/// tenant, content type, priority.
#[cfg(feature = "postgres")]
pub(super) const PG_ENQUEUE: &str =
    "SELECT id, created FROM claimd.enqueue_bytes($1, $2, $3, $4, $5, $6)";

/// SQLite: a consumer's registry entry: name.
#[cfg(feature = "sqlite")]
pub(super) const SQLITE_REGISTRY: &str = "SELECT key_template, max_key_length, \
    max_payload_bytes, ordered, url_segments FROM claimd_consumers WHERE name = ?1";

/// SQLite: the claim, not yet taken by any worker (no lease owner; a lease end 60 s away, when
/// the sweeper takes it if no worker did), carrying the "not called yet" marker: consumer,
/// tenant, message id, key, fingerprint, payload, content type, priority.
#[cfg(feature = "sqlite")]
pub(super) const SQLITE_INSERT: &str = "INSERT INTO claims (consumer, tenant, message_id, \
    idem_key, fingerprint, payload, content_type, lease_owner, handoff, handoff_attempt, \
    lease_until, received_utc, started_utc, updated_utc, priority) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, 'not_called', 1, \
    CAST(unixepoch('subsec') * 1000 AS INTEGER) + 60000, \
    CAST(unixepoch('subsec') * 1000 AS INTEGER), CAST(unixepoch('subsec') * 1000 AS INTEGER), \
    CAST(unixepoch('subsec') * 1000 AS INTEGER), ?8) \
    ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING id";

/// SQLite: the claim already there: consumer, tenant, message id.
#[cfg(feature = "sqlite")]
pub(super) const SQLITE_EXISTING: &str = "SELECT id, fingerprint, idem_key FROM claims \
    WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3";

/// SQLite: one more duplicate delivery of a claim: id.
#[cfg(feature = "sqlite")]
pub(super) const SQLITE_COUNT_DUPLICATE: &str =
    "UPDATE claims SET duplicate_count = duplicate_count + 1 WHERE id = ?1";
