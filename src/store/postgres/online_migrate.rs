//! Applies pending migrations while the fleet keeps taking messages (docs/operations.md,
//! "Upgrading"). One migration at a time, on a connection of its own:
//! 1. the migration's idempotent column additions and index builds run first, outside any
//!    transaction, the indexes `CONCURRENTLY` ([`crate::store::online_steps`]), so the
//!    migration's own copies find them there and its transaction only changes the catalog;
//! 2. every statement waits at most [`LOCK_WAIT`] for a lock and is retried after a pause:
//!    a statement queued behind a long transaction would otherwise hold every insert of
//!    intake behind it in PostgreSQL's lock queue.
//!
//! Instances that start together take turns through [`UPGRADE_LOCK`], tried without waiting
//! (`pg_try_advisory_lock`): a session blocked in `pg_advisory_lock` keeps a snapshot open, and
//! `CREATE INDEX CONCURRENTLY` waits for every older snapshot, so two blocking instances
//! would wait on each other for ever.

use crate::store::online_steps::{OnlineStep, online_steps};
use crate::store::{StoreError, StoreResult};
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{Connection, PgConnection, PgPool, Row};
use std::collections::HashSet;
use std::time::Duration;

/// The advisory lock the upgrading instance holds (a constant of claimd's own, apart from
/// sqlx's migration lock).
const UPGRADE_LOCK: i64 = 0x636c_6169_6d64_0001;

/// The longest a migration statement waits for a table lock before it gives up and retries.
pub const LOCK_WAIT: Duration = Duration::from_millis(500);

/// How many times a statement that could not get its lock is tried.
const LOCK_TRIES: u32 = 240;

/// PostgreSQL's `lock_not_available` (a `lock_timeout` ran out).
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// Applies what `migrator` has that the database has not, one migration at a time.
pub(super) async fn run(pool: &PgPool, migrator: &Migrator) -> StoreResult<()> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| StoreError::from_sqlx("migrate", e))?
        .detach();
    let done = upgrade(&mut conn, migrator).await;
    let _ = conn.close().await;
    done
}

async fn upgrade(conn: &mut PgConnection, migrator: &Migrator) -> StoreResult<()> {
    while !sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
        .bind(UPGRADE_LOCK)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| StoreError::from_sqlx("upgrade lock", e))?
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    set_lock_wait(conn, LOCK_WAIT).await?;
    let applied = applied_versions(conn).await?;
    for m in migrator.iter() {
        if applied.contains(&m.version) || m.migration_type.is_down_migration() {
            continue;
        }
        for step in online_steps(m.sql.as_str()) {
            run_step(conn, m.version, &step).await?;
        }
        let mut tries = 0;
        loop {
            match migrator
                .run_direct(Some(m.version), &mut *conn, false)
                .await
            {
                Ok(()) => break,
                Err(e) if lock_timed_out(&e) && tries < LOCK_TRIES => {
                    tries += 1;
                    tracing::info!(
                        version = m.version,
                        tries,
                        "migration waits for a table lock; retrying"
                    );
                    tokio::time::sleep(LOCK_WAIT).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(UPGRADE_LOCK)
        .execute(&mut *conn)
        .await;
    Ok(())
}

/// The versions of the migrations applied successfully; none when `_sqlx_migrations` is not
/// there yet. On one connection (`claimd migrate --plan` reads it too).
pub(crate) async fn applied_versions(conn: &mut PgConnection) -> StoreResult<HashSet<i64>> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| StoreError::from_sqlx("applied migrations", e))?;
    if !exists {
        return Ok(HashSet::new());
    }
    let rows = sqlx::query("SELECT version FROM _sqlx_migrations WHERE success")
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| StoreError::from_sqlx("applied migrations", e))?;
    Ok(rows.iter().filter_map(|r| r.try_get(0).ok()).collect())
}

/// Sets how long the session's statements wait for a lock (`0`: as long as it takes).
async fn set_lock_wait(conn: &mut PgConnection, wait: Duration) -> StoreResult<()> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET lock_timeout = {}",
        wait.as_millis()
    )))
    .execute(&mut *conn)
    .await
    .map_err(|e| StoreError::from_sqlx("lock_timeout", e))?;
    Ok(())
}

fn lock_timed_out(e: &MigrateError) -> bool {
    let db = match e {
        MigrateError::Execute(sqlx::Error::Database(db))
        | MigrateError::ExecuteMigration(sqlx::Error::Database(db), _) => db,
        _ => return false,
    };
    db.code().as_deref() == Some(LOCK_NOT_AVAILABLE)
}

/// Runs one step when its table exists (a table the migration creates has no rows: its
/// migration builds what it needs). A step that fails is left to its migration, which then
/// does the same work inside its transaction (slower for intake, never wrong); an index a
/// failed concurrent build left invalid is dropped first, or the migration's
/// `IF NOT EXISTS` would keep it.
async fn run_step(conn: &mut PgConnection, version: i64, step: &OnlineStep) -> StoreResult<()> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(step.table())
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| StoreError::from_sqlx("migration step", e))?;
    if !exists {
        return Ok(());
    }
    // A concurrent build waits for older transactions to end, without holding back any
    // write meanwhile: it may wait as long as they take.
    let building = matches!(step, OnlineStep::BuildIndex { .. });
    if building {
        set_lock_wait(conn, Duration::ZERO).await?;
    }
    let done = run_step_now(conn, version, step).await;
    if building {
        set_lock_wait(conn, LOCK_WAIT).await?;
    }
    done
}

async fn run_step_now(conn: &mut PgConnection, version: i64, step: &OnlineStep) -> StoreResult<()> {
    if let OnlineStep::BuildIndex { name, .. } = step {
        drop_if_invalid(conn, name).await?;
    }
    let mut tries = 0;
    loop {
        let started = std::time::Instant::now();
        match sqlx::raw_sql(sqlx::AssertSqlSafe(step.sql().to_string()))
            .execute(&mut *conn)
            .await
        {
            Ok(_) => {
                tracing::info!(
                    version,
                    step = step.sql(),
                    ms = started.elapsed().as_millis() as u64,
                    "ran ahead of its migration, outside a transaction"
                );
                return Ok(());
            }
            Err(sqlx::Error::Database(db))
                if db.code().as_deref() == Some(LOCK_NOT_AVAILABLE) && tries < LOCK_TRIES =>
            {
                tries += 1;
                tokio::time::sleep(LOCK_WAIT).await;
            }
            Err(e) => {
                tracing::warn!(version, step = step.sql(), error = %e,
                    "could not run ahead of its migration; the migration will do it");
                if let OnlineStep::BuildIndex { name, .. } = step {
                    drop_if_invalid(conn, name).await?;
                }
                return Ok(());
            }
        }
    }
}

async fn drop_if_invalid(conn: &mut PgConnection, name: &str) -> StoreResult<()> {
    let invalid: Option<String> = sqlx::query_scalar(
        "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) \
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relname = $1 AND n.nspname = current_schema() AND NOT i.indisvalid",
    )
    .bind(name)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| StoreError::from_sqlx("invalid index", e))?;
    if let Some(qualified) = invalid {
        tracing::warn!(index = %qualified, "dropping an index a cut concurrent build left invalid");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP INDEX CONCURRENTLY IF EXISTS {qualified}"
        )))
        .execute(&mut *conn)
        .await
        .map_err(|e| StoreError::from_sqlx("drop invalid index", e))?;
    }
    Ok(())
}
