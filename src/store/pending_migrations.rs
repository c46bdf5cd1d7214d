//! The migrations a store has not applied yet and what each will lock, read without changing
//! anything (`claimd migrate --plan`): the applied versions from `_sqlx_migrations`, the
//! embedded migrations of this build, and on PostgreSQL the planner's row estimate of each
//! table a migration locks ([`super::migration_plan`] reads the SQL).

use super::migration_plan::{self, LockLevel, StatementLock};
use super::online_steps;
use super::{StoreError, StoreResult};
use serde::Serialize;
use sqlx::migrate::Migrator;
use std::collections::HashSet;

/// The lock a migration holds on one table until it commits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeldLock {
    /// The table.
    pub table: String,
    /// The strongest lock taken on it.
    pub lock: LockLevel,
    /// Whether inserts and updates of the table (intake, settles) wait while it is held.
    pub blocks_writes: bool,
    /// Whether it is held while something scales with the rows (a build, a scan, a rewrite).
    pub while_rows_are_read: bool,
    /// The table's rows by the planner's last estimate (PostgreSQL; `0` when it is not there
    /// yet; `None`: not known, never analysed).
    pub rows: Option<i64>,
}

/// One migration this build would apply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingMigration {
    /// Its version (the file's number).
    pub version: i64,
    /// Its description (the file's name).
    pub description: String,
    /// Whether it runs outside a transaction (each lock ends with its statement).
    pub outside_a_transaction: bool,
    /// Each statement and its lock.
    pub statements: Vec<StatementLock>,
    /// The locks held until it commits, per table.
    pub held: Vec<HeldLock>,
}

/// The pending migrations of the store at `url`, oldest first.
pub async fn pending(url: &str) -> StoreResult<Vec<PendingMigration>> {
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return postgres(url).await;
    }
    #[cfg(feature = "sqlite")]
    if url.starts_with("sqlite:") {
        return sqlite(url).await;
    }
    Err(StoreError::BadUrl(url.into()))
}

/// The embedded migrations not in `applied`, each read for its locks.
fn left(migrator: &Migrator, applied: &HashSet<i64>, postgres: bool) -> Vec<PendingMigration> {
    migrator
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .map(|m| {
            let sql = m.sql.as_str();
            // What claimd runs ahead of the migration, outside its transaction (none for a
            // migration that has no transaction).
            let ahead = |s: &str| {
                if m.no_tx {
                    None
                } else {
                    online_steps::concurrent_form(s)
                }
            };
            PendingMigration {
                version: m.version,
                description: m.description.to_string(),
                outside_a_transaction: m.no_tx,
                statements: if postgres {
                    migration_plan::analyze_after(sql, ahead)
                } else {
                    Vec::new()
                },
                held: if postgres {
                    migration_plan::held_after(sql, ahead)
                        .into_iter()
                        .map(|(table, lock, long)| HeldLock {
                            table,
                            blocks_writes: lock.blocks_writes(),
                            lock,
                            while_rows_are_read: long,
                            rows: None,
                        })
                        .collect()
                } else {
                    Vec::new()
                },
            }
        })
        .collect()
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str) -> StoreResult<Vec<PendingMigration>> {
    use sqlx::Connection;
    use std::str::FromStr;
    let hosts =
        super::hosts::split_hosts(url).map_err(|why| StoreError::UrlRefused(url.into(), why))?;
    let mut last = None;
    let mut conn = None;
    for one in &hosts.urls {
        let options = sqlx::postgres::PgConnectOptions::from_str(one)
            .map_err(|e| StoreError::UrlRefused(url.into(), e.to_string()))?;
        match sqlx::PgConnection::connect_with(&options).await {
            Ok(c) => {
                conn = Some(c);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(mut conn) = conn else {
        return Err(StoreError::Unavailable(
            last.unwrap_or(sqlx::Error::PoolClosed),
        ));
    };
    let applied = super::postgres::applied_versions(&mut conn).await?;
    let mut plan = left(&super::embedded_migrations::postgres(), &applied, true);
    for m in &mut plan {
        for h in &mut m.held {
            // Not there yet: created by an earlier pending migration, so empty.
            let name = h.table.strip_prefix("index ").unwrap_or(&h.table);
            h.rows = match sqlx::query_scalar::<_, Option<i64>>(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass($1)",
            )
            .bind(name)
            .fetch_optional(&mut conn)
            .await
            {
                Ok(None) => Some(0),
                Ok(Some(n)) => n.filter(|n| *n >= 0),
                Err(_) => None,
            };
        }
    }
    let _ = conn.close().await;
    Ok(plan)
}

impl HeldLock {
    /// Whether intake stops while the migration reads rows of a table that has some (or may).
    pub fn stops_intake(&self) -> bool {
        self.blocks_writes && self.while_rows_are_read && self.rows != Some(0)
    }
}

#[cfg(feature = "sqlite")]
async fn sqlite(url: &str) -> StoreResult<Vec<PendingMigration>> {
    use sqlx::{Connection, Row};
    use std::str::FromStr;
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .map_err(|e| StoreError::UrlRefused(url.into(), e.to_string()))?
        .read_only(true)
        .create_if_missing(false);
    // No file yet: nothing is applied.
    let applied: HashSet<i64> = match sqlx::SqliteConnection::connect_with(&options).await {
        Ok(mut conn) => {
            let rows = sqlx::query("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&mut conn)
                .await
                .unwrap_or_default();
            let _ = conn.close().await;
            rows.iter()
                .filter_map(|r| r.try_get::<i64, _>(0).ok())
                .collect()
        }
        Err(_) => HashSet::new(),
    };
    Ok(left(&super::embedded_migrations::sqlite(), &applied, false))
}
