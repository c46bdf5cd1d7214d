//! Whether the database already has every migration this build embeds, found by reading
//! `_sqlx_migrations` only. sqlx's migrator begins with `CREATE TABLE IF NOT EXISTS
//! _sqlx_migrations`, which PostgreSQL refuses without `CREATE` on the schema even when the
//! table exists; so `claimd run`, which checks the migrations at every start, would need a
//! runtime role that may create objects where claimd's functions look up names (I12). When
//! everything this build embeds is applied nothing runs (newer migrations of a newer build are
//! weighed by [`crate::store::schema_window`]); anything else (a pending, failed or changed
//! migration, a table it cannot read) goes to the migrator, which applies or reports it.

use crate::store::dialect::SqlPool;
use sqlx::migrate::Migrator;
use sqlx::{Postgres, Row};
use std::collections::HashMap;

/// The migrations table, when it exists: version, checksum, whether it succeeded, description.
const APPLIED: &str = "SELECT version, checksum, success, description FROM _sqlx_migrations";

/// Whether `_sqlx_migrations` is there to read.
const HAS_TABLE: &str = "SELECT to_regclass('_sqlx_migrations') IS NOT NULL";

/// One row of `_sqlx_migrations`.
pub(super) struct AppliedRow {
    /// The migration's version.
    pub version: i64,
    /// Its checksum when it was applied.
    pub checksum: Vec<u8>,
    /// Whether it finished.
    pub success: bool,
    /// Its description (from its file name).
    pub description: String,
}

/// The applied migrations; `None` when the table is not there or cannot be read.
pub(super) async fn read(pool: &SqlPool<Postgres>) -> Option<Vec<AppliedRow>> {
    let has_table = pool.optional(sqlx::query(HAS_TABLE)).await;
    let Ok(Some(true)) = has_table.map(|r| r.and_then(|r| r.try_get::<bool, _>(0).ok())) else {
        return None;
    };
    let read = |r: &sqlx::postgres::PgRow| {
        Ok::<_, sqlx::Error>(AppliedRow {
            version: r.try_get(0)?,
            checksum: r.try_get(1)?,
            success: r.try_get(2)?,
            description: r.try_get(3)?,
        })
    };
    pool.all(sqlx::query(APPLIED))
        .await
        .and_then(|rows| rows.iter().map(read).collect())
        .ok()
}

/// `true` when every migration of `migrator` is applied with its checksum and none failed.
/// Newer migrations this build does not embed are allowed here; whether it may run beside
/// them is [`crate::store::schema_window`]'s question.
pub(super) fn up_to_date(rows: &[AppliedRow], migrator: &Migrator) -> bool {
    if rows.iter().any(|r| !r.success) {
        return false;
    }
    let applied: HashMap<i64, &[u8]> = rows
        .iter()
        .map(|r| (r.version, r.checksum.as_slice()))
        .collect();
    migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .all(|m| {
            applied
                .get(&m.version)
                .is_some_and(|c| c[..] == m.checksum[..])
        })
}
