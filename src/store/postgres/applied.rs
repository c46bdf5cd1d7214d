//! Whether the database already has every migration this build embeds, found by reading
//! `_sqlx_migrations` only. sqlx's migrator begins with `CREATE TABLE IF NOT EXISTS
//! _sqlx_migrations`, which PostgreSQL refuses without `CREATE` on the schema even when the
//! table exists; so `claimd run`, which checks the migrations at every start, would need a
//! runtime role that may create objects where claimd's functions look up names (I12). When
//! everything is applied nothing runs; anything else (a pending, failed, unknown or changed
//! migration, a table it cannot read) goes to the migrator, which applies or reports it.

use sqlx::PgPool;
use sqlx::migrate::Migrator;
use std::collections::HashMap;

/// The migrations table, when it exists: version, checksum, whether it succeeded.
const APPLIED: &str = "SELECT version, checksum, success FROM _sqlx_migrations";

/// Whether `_sqlx_migrations` is there to read.
const HAS_TABLE: &str = "SELECT to_regclass('_sqlx_migrations') IS NOT NULL";

/// `true` when every migration of `migrator` is applied with its checksum, and nothing else.
pub(super) async fn up_to_date(pool: &PgPool, migrator: &Migrator) -> bool {
    let Ok(true) = sqlx::query_scalar::<_, bool>(HAS_TABLE)
        .fetch_one(pool)
        .await
    else {
        return false;
    };
    let Ok(rows) = sqlx::query_as::<_, (i64, Vec<u8>, bool)>(APPLIED)
        .fetch_all(pool)
        .await
    else {
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
