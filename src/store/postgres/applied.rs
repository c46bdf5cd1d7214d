//! Whether the database already has every migration this build embeds, found by reading
//! `_sqlx_migrations` only. sqlx's migrator begins with `CREATE TABLE IF NOT EXISTS
//! _sqlx_migrations`, which PostgreSQL refuses without `CREATE` on the schema even when the
//! table exists; so `claimd run`, which checks the migrations at every start, would need a
//! runtime role that may create objects where claimd's functions look up names (I12). When
//! everything is applied nothing runs; anything else (a pending, failed, unknown or changed
//! migration, a table it cannot read) goes to the migrator, which applies or reports it.

use crate::store::dialect::SqlPool;
use sqlx::migrate::Migrator;
use sqlx::{Postgres, Row};
use std::collections::HashMap;

/// The migrations table, when it exists: version, checksum, whether it succeeded.
const APPLIED: &str = "SELECT version, checksum, success FROM _sqlx_migrations";

/// Whether `_sqlx_migrations` is there to read.
const HAS_TABLE: &str = "SELECT to_regclass('_sqlx_migrations') IS NOT NULL";

/// `true` when every migration of `migrator` is applied with its checksum, and nothing else.
pub(super) async fn up_to_date(pool: &SqlPool<Postgres>, migrator: &Migrator) -> bool {
    let has_table = pool.optional(sqlx::query(HAS_TABLE)).await;
    let Ok(Some(true)) = has_table.map(|r| r.and_then(|r| r.try_get::<bool, _>(0).ok())) else {
        return false;
    };
    let read = |r: &sqlx::postgres::PgRow| {
        Ok::<_, sqlx::Error>((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))
    };
    let Ok(rows) = pool.all(sqlx::query(APPLIED)).await.and_then(|rows| {
        rows.iter()
            .map(read)
            .collect::<Result<Vec<(i64, Vec<u8>, bool)>, _>>()
    }) else {
        return false;
    };
    if rows.iter().any(|(_, _, success)| !success) {
        return false;
    }
    let applied: HashMap<i64, Vec<u8>> = rows.into_iter().map(|(v, c, _)| (v, c)).collect();
    let embedded: Vec<_> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .collect();
    applied.len() == embedded.len()
        && embedded.iter().all(|m| {
            applied
                .get(&m.version)
                .is_some_and(|c| c[..] == m.checksum[..])
        })
}
