//! PostgreSQL driver: many `claimd run` processes share one database. The unique index
//! arbitrates claims, `FOR UPDATE SKIP LOCKED` splits stale claims between sweepers, and an
//! advisory lock lets one instance prune at a time. The store's behaviour is the one body of
//! [`SqlStore`]; this module supplies PostgreSQL's statements (`sql`), how values are bound
//! and read, the multi-row writes the group commit uses (`many`) and the retention lock.

#[macro_use]
mod sql;
mod applied;
mod archive;
mod failover;
mod index_rebuild;
mod many;
mod online_migrate;
pub(crate) use online_migrate::applied_versions;
mod replica;
mod replication;
mod storage_health;

pub use sql::{COUNT_OPEN, COUNT_WINDOW, TAKE_STALE};

use crate::domain::claim::{Claim, NewClaim};
use crate::store::db_effect::{DatabaseEffect, DbEffectError, DbTx};
use crate::store::dialect::{
    Arg, ClaimDb, Dialect, LoggedWrite, RetentionLock, Runner, SqlPool, SqlRow, Statements,
    event_args, follow_up_args,
};
use crate::store::outbox::OutcomeConsumers;
use crate::store::pooler::Pooler;
use crate::store::schema_window::{self, Window};
use crate::store::sql_store::SqlStore;
use crate::store::{ClaimOutcome, SettleItem, StoreError, StoreResult};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgPoolOptions, PgRow};
use sqlx::query::Query;
use sqlx::{PgPool, Postgres, Row};
use std::time::Duration;

/// The PostgreSQL claim store.
///
/// Unless made [`unbatched`](SqlStore::unbatched), concurrent
/// [`claim`](crate::store::IntakeStore::claim) and [`settle`](crate::store::EngineStore::settle)
/// calls are coalesced into multi-row statements; every answer still waits for the commit of
/// its row.
pub type PgStore = SqlStore<PgDialect>;

/// PostgreSQL as a [`Dialect`]: the pool, and the servers it may use.
#[derive(Debug, Clone)]
pub struct PgDialect {
    sql: SqlPool<Postgres>,
    primary: std::sync::Arc<failover::Primary>,
    /// Turns for database effects' transactions: one fewer than the pool's connections, so
    /// effects never hold them all and a hand-back, a settle or a claim always finds one.
    effect_turns: std::sync::Arc<tokio::sync::Semaphore>,
}

/// How long a database effect's transaction waits for a turn before it is reported as
/// waiting for a connection (as long as the pool's own wait).
const EFFECT_TURN_WAIT: Duration = Duration::from_secs(5);

/// [`PgDialect::effect_turns`] for a pool of `max_connections`.
fn effect_turns(max_connections: u32) -> std::sync::Arc<tokio::sync::Semaphore> {
    let turns = max_connections.saturating_sub(1).max(1) as usize;
    std::sync::Arc::new(tokio::sync::Semaphore::new(turns))
}

impl SqlStore<PgDialect> {
    /// Connects a pool to `url`, with concurrent claims and settles coalesced (see
    /// [`PgStore`]). Must be called inside a Tokio runtime (it starts the batching tasks).
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        Self::connect_with(url, max_connections, Pooler::None).await
    }

    /// [`connect`](Self::connect) through `pooler` ([`crate::store::pooler`]).
    pub async fn connect_with(
        url: &str,
        max_connections: u32,
        pooler: Pooler,
    ) -> StoreResult<Self> {
        // A host list and `target_session_attrs` are read here (the driver reads neither).
        let targets = crate::store::hosts::split_hosts(url)
            .map_err(|e| StoreError::UrlRefused(url.to_string(), e))?;
        let primary = std::sync::Arc::new(
            failover::Primary::new(&targets).map_err(|e| StoreError::from_sqlx("connect", e))?,
        );
        let options = PgPoolOptions::new()
            .max_connections(max_connections)
            // No idle reaper: sqlx's maintenance task can spin at 100% CPU and stall the runtime
            // (a num_idle underflow, launchbadge/sqlx #3645); connections live until they fail.
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(Duration::from_secs(5));
        let pool =
            failover::with_hooks(options, &primary).connect_lazy_with(primary.current_options());
        failover::watch(pool.clone(), &primary);
        Ok(SqlStore::batched(PgDialect::new(
            SqlPool { pool, pooler },
            primary,
            max_connections,
        )))
    }

    /// The pool, for tests and benchmarks that need raw SQL.
    pub fn pool(&self) -> &PgPool {
        &self.dialect.sql.pool
    }
}

/// The retention lock: a transaction-scoped advisory lock, held by a transaction left open
/// on a connection of its own for as long as the prune runs.
struct PgRetentionLock(sqlx::PgConnection);

#[async_trait]
impl RetentionLock for PgRetentionLock {
    /// Ends the transaction (so the next instance can take the lock at once), then the
    /// connection: if the rollback failed, the connection's end frees the lock all the same
    /// (a little later, once PostgreSQL, or the pooler, has seen it close).
    async fn release(self: Box<Self>) {
        let mut conn = self.0;
        let _ = sqlx::raw_sql(sql::PRUNE_UNLOCK).execute(&mut conn).await;
        let _ = sqlx::Connection::close(conn).await;
    }
}

fn err(query: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::from_sqlx(query, e)
}

impl ClaimDb for Postgres {
    fn rows_affected(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }

    fn bind_time(
        q: Query<'_, Postgres, PgArguments>,
        t: Option<DateTime<Utc>>,
    ) -> Query<'_, Postgres, PgArguments> {
        q.bind(t)
    }

    fn read_time(row: &PgRow, col: &str) -> StoreResult<Option<DateTime<Utc>>> {
        row.try_get(col)
            .map_err(|e| StoreError::Corrupt(e.to_string()))
    }
}

#[async_trait]
impl Dialect for PgDialect {
    type Row = PgRow;
    type Runner = SqlPool<Postgres>;
    const NAME: &'static str = "postgres";
    const SQL: Statements = sql::STATEMENTS;
    const ACCOUNT_SQL: crate::store::audit::AccountStatements = sql::accounts::ACCOUNT_STATEMENTS;
    const SEAL_SQL: crate::store::sealing::SealStatements = sql::seal::SEAL_STATEMENTS;
    /// One task writes claims, settles and markers together: with more, each wrote its own
    /// smaller batches, in more transactions, for no more throughput on two cores (0.14
    /// transactions per message at 0 ms with one, 0.23 with two, 0.31 with four, one instance
    /// of the throughput bench).
    const BATCH_WORKERS: usize = 1;
    /// A millisecond for more calls before a small batch under load: fewer, larger commits,
    /// most of all with several instances on one database.
    const BATCH_LINGER: std::time::Duration = std::time::Duration::from_millis(1);
    /// Claims and settles share a commit (`many::insert_settle_batch`).
    const JOINT_WRITES: bool = true;

    /// Runs the migrator only when something is left to do, so that a runtime role without
    /// `CREATE` on the schema passes the check at start (`applied`).
    async fn migrate(&self) -> StoreResult<()> {
        let mut migrator = crate::store::embedded_migrations::postgres();
        if let Some(rows) = applied::read(&self.sql).await {
            let embedded: Vec<i64> = migrator.iter().map(|m| m.version).collect();
            let done: Vec<(i64, String)> = rows
                .iter()
                .filter(|r| r.success)
                .map(|r| (r.version, r.description.clone()))
                .collect();
            if let Window::TooNew {
                version,
                description,
            } = schema_window::window(&embedded, &done)
            {
                return Err(StoreError::SchemaTooNew {
                    version,
                    description,
                });
            }
            if applied::up_to_date(&rows, &migrator) {
                return Ok(());
            }
        }
        // sqlx's migrator locks with a session advisory lock and prepares named statements:
        // through a pooler in transaction mode neither holds (docs/postgresql.md, "Poolers").
        if self.sql.pooler.per_transaction() {
            return Err(StoreError::PendingBehindPooler);
        }
        // Newer expand-only migrations of a newer build are left as they are.
        migrator.set_ignore_missing(true);
        online_migrate::run(&self.sql.pool, &migrator).await?;
        Ok(())
    }

    async fn replication(
        &self,
    ) -> StoreResult<Option<crate::store::replication::ReplicationSettings>> {
        replication::read(&self.sql).await.map(Some)
    }

    async fn storage_health(
        &self,
    ) -> StoreResult<Option<crate::store::storage_health::StorageHealth>> {
        storage_health::read(&self.sql).await.map(Some)
    }

    async fn rebuild_indexes(
        &self,
        choice: &crate::store::index_rebuild::RebuildChoice,
        dry_run: bool,
    ) -> StoreResult<Option<crate::store::index_rebuild::Reindexed>> {
        index_rebuild::run(&self.sql, choice, dry_run)
            .await
            .map(Some)
    }

    /// PostgreSQL's statements write their history line themselves (a data-modifying CTE):
    /// the event's values are bound after the update's.
    fn runner(&self) -> &SqlPool<Postgres> {
        &self.sql
    }

    fn trouble(&self) -> Option<String> {
        self.primary.trouble()
    }

    async fn update_logged(&self, w: LoggedWrite<'_>) -> StoreResult<Option<PgRow>> {
        if w.follow_ups.is_empty() {
            return logged_args(&w, |all| {
                self.sql.optional(SqlPool::<Postgres>::query(w.sql, all))
            })
            .await
            .map_err(err(w.name));
        }
        // With follow-ups: the change and the claims it creates in one transaction.
        let mut tx = self.sql.pool.begin().await.map_err(err("begin"))?;
        let row = logged_args(&w, |all| {
            self.sql
                .in_tx(SqlPool::<Postgres>::query(w.sql, all))
                .fetch_optional(&mut *tx)
        })
        .await
        .map_err(err(w.name))?;
        let Some(row) = row else {
            tx.rollback().await.map_err(err("rollback"))?;
            return Ok(None);
        };
        self.insert_follow_ups(&mut tx, &row, &w).await?;
        tx.commit().await.map_err(err("commit"))?;
        Ok(Some(row))
    }

    async fn update_logged_after(
        &self,
        effect: &dyn DatabaseEffect,
        claim: &Claim,
        w: LoggedWrite<'_>,
        timeout: Duration,
    ) -> Result<bool, DbEffectError> {
        // A turn first: a transaction that waits for one has not begun, and the waiting
        // ends as the pool's own would, as a wait for a connection (I13: not an attempt).
        let _turn = tokio::time::timeout(EFFECT_TURN_WAIT, self.effect_turns.acquire())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| {
                DbEffectError::Store(StoreError::Unavailable(sqlx::Error::PoolTimedOut))
            })?;
        // The server cuts each statement past the timeout itself (57014) and frees its locks
        // at once. The whole run is cut here too, at twice the timeout: later than the server
        // would cut a single statement, because a run dropped mid-statement leaves the server
        // running it, locks held, until its own cut.
        let begin = format!(
            "{}{}",
            sql::BEGIN_WITH_TIMEOUT_MS,
            // statement_timeout is a 32-bit number of milliseconds.
            timeout.as_millis().clamp(1, i32::MAX as u128)
        );
        let mut tx = self
            .sql
            .pool
            .begin_with(sqlx::AssertSqlSafe(begin))
            .await
            .map_err(err("begin"))?;
        let run = async {
            if let Err(e) = effect.apply(DbTx::Postgres(&mut tx), claim).await {
                // Dropping the transaction rolls it back.
                return Err(match e {
                    sqlx::Error::Database(db) if db.code().as_deref() == Some("57014") => {
                        DbEffectError::TimedOut(timeout)
                    }
                    e => DbEffectError::Effect(e),
                });
            }
            let row = logged_args(&w, |all| {
                self.sql
                    .in_tx(SqlPool::<Postgres>::query(w.sql, all))
                    .fetch_optional(&mut *tx)
            })
            .await
            .map_err(err(w.name))?;
            if let Some(row) = &row {
                self.insert_follow_ups(&mut tx, row, &w).await?;
            }
            Ok::<_, DbEffectError>(row.is_some())
        };
        let settled = match tokio::time::timeout(timeout.saturating_mul(2), run).await {
            Ok(Ok(settled)) => settled,
            failed => {
                // The turn is kept until the connection is back in the pool: a dropped
                // transaction would roll back after the turn was given up. The server has cut
                // a statement still running within `timeout`.
                let _ = tokio::time::timeout(timeout, tx.rollback()).await;
                return match failed {
                    Ok(result) => result,
                    Err(_) => Err(DbEffectError::TimedOut(timeout)),
                };
            }
        };
        if !settled {
            tx.rollback().await.map_err(err("rollback"))?;
            return Ok(false);
        }
        tx.commit().await.map_err(err("commit"))?;
        Ok(true)
    }

    async fn erase_due_batch(&self, args: &[Arg<'_>]) -> Option<StoreResult<u64>> {
        let rows = self
            .sql
            .fetch("erase_due_batch", sql::ERASE_DUE_BATCH, args)
            .await;
        Some(rows.and_then(|rows| {
            let n = rows.first().map(|r| r.i64("n")).transpose()?;
            Ok(n.unwrap_or(0).max(0) as u64)
        }))
    }

    async fn fetch_count(
        &self,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<Vec<PgRow>> {
        // A count over a million open claims passes jit_above_cost: compiling its plan took
        // longer than running it, on every report, page and scrape. SET LOCAL: through a
        // pooler the setting ends with the transaction.
        let tx = self
            .sql
            .pool
            .begin_with(sql::BEGIN_WITHOUT_JIT)
            .await
            .map_err(err("begin"))?;
        self.fetch_and_commit(tx, name, sql, args).await
    }

    async fn fetch_alone(
        &self,
        consumer: &str,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<Vec<PgRow>> {
        let mut tx = self.sql.pool.begin().await.map_err(err("begin"))?;
        self.sql
            .in_tx(sqlx::query(sql::LINE_LOCK).bind(format!("claimd:line:{consumer}")))
            .execute(&mut *tx)
            .await
            .map_err(err("line_lock"))?;
        self.fetch_and_commit(tx, name, sql, args).await
    }

    /// A transaction-scoped advisory lock in a transaction held open for the whole prune,
    /// on a connection taken out of the pool. Not a session lock: through a pooler in
    /// transaction mode a session lock stays on whichever server connection took it, and its
    /// unlock may reach another one. A transaction keeps one server connection to the end,
    /// and whatever ends it (the release, a task dropped mid-prune, which closes the detached
    /// connection) frees the lock. It holds no snapshot between statements (read committed),
    /// so it does not hold back vacuum. The key is the one the session lock of earlier
    /// versions used: both kinds conflict, so mixed versions still prune one at a time.
    async fn retention_lock(&self) -> StoreResult<Option<Box<dyn RetentionLock>>> {
        let mut conn = self
            .sql
            .pool
            .acquire()
            .await
            .map_err(err("acquire"))?
            .detach();
        sqlx::raw_sql(sql::PRUNE_BEGIN)
            .execute(&mut conn)
            .await
            .map_err(err("begin"))?;
        let locked: bool = sqlx::query_scalar(sql::TRY_PRUNE_LOCK)
            .bind(sql::PRUNE_LOCK_KEY)
            .persistent(false)
            .fetch_one(&mut conn)
            .await
            .map_err(err("try_prune_lock"))?;
        if !locked {
            let _ = sqlx::Connection::close(conn).await;
            return Ok(None);
        }
        Ok(Some(Box::new(PgRetentionLock(conn))))
    }

    async fn archive_batch(
        &self,
        windows: &crate::store::RetentionWindows,
        batch: u32,
        dry_run: bool,
    ) -> Option<StoreResult<crate::store::ArchiveBatch>> {
        let after = windows.archive_after?;
        Some(archive::batch(&self.sql, windows, after, batch, dry_run).await)
    }

    async fn drop_archive_months(&self) -> Option<StoreResult<u64>> {
        Some(archive::drop_months(&self.sql).await)
    }

    async fn insert_many(
        &self,
        new: &[&NewClaim],
    ) -> Option<StoreResult<Vec<Option<ClaimOutcome>>>> {
        Some(many::insert_batch(&self.sql, new).await)
    }

    async fn settle_many(
        &self,
        items: &[SettleItem<'_>],
        outcomes: &OutcomeConsumers,
    ) -> Option<StoreResult<Vec<bool>>> {
        Some(many::settle_batch(&self.sql, items, outcomes).await)
    }

    async fn insert_settle_many(
        &self,
        new: &[&NewClaim],
        items: &[SettleItem<'_>],
        outcomes: &OutcomeConsumers,
    ) -> Option<StoreResult<crate::store::dialect::ClaimsAndSettles>> {
        Some(many::insert_settle_batch(&self.sql, new, items, outcomes).await)
    }

    async fn mark_called_many(&self, marks: &[(i64, i32)]) -> Option<StoreResult<Vec<bool>>> {
        Some(many::mark_called_batch(&self.sql, marks).await)
    }
}

/// Binds a logged write's arguments as PostgreSQL's statement takes them and runs `run`:
/// the event's columns after the claim's id and attempt (which the statement takes from the
/// row it changed), then the consumers that get outcome events, when it writes them.
impl PgDialect {
    /// The dialect over `sql`, a pool of `max_connections` to `primary`.
    fn new(
        sql: SqlPool<Postgres>,
        primary: std::sync::Arc<failover::Primary>,
        max_connections: u32,
    ) -> Self {
        PgDialect {
            sql,
            primary,
            effect_turns: effect_turns(max_connections),
        }
    }

    /// Runs `sql` (named `name`) in `tx`, then commits it.
    async fn fetch_and_commit(
        &self,
        mut tx: sqlx::Transaction<'static, Postgres>,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<Vec<PgRow>> {
        let rows = self
            .sql
            .in_tx(SqlPool::<Postgres>::query(sql, args))
            .fetch_all(&mut *tx)
            .await
            .map_err(err(name))?;
        tx.commit().await.map_err(err("commit"))?;
        Ok(rows)
    }

    /// Writes the follow-up claims of the change `row` (its `id`) in the change's transaction.
    async fn insert_follow_ups(
        &self,
        tx: &mut sqlx::PgConnection,
        row: &PgRow,
        w: &LoggedWrite<'_>,
    ) -> StoreResult<()> {
        let parent = row.i64("id")?;
        for child in w.follow_ups {
            self.sql
                .in_tx(SqlPool::<Postgres>::query(
                    sql::STATEMENTS.insert_follow_up,
                    &follow_up_args(child, parent),
                ))
                .execute(&mut *tx)
                .await
                .map_err(err("insert_follow_up"))?;
        }
        Ok(())
    }
}

async fn logged_args<'a, F, Fut>(w: &LoggedWrite<'a>, run: F) -> Result<Option<PgRow>, sqlx::Error>
where
    F: FnOnce(&[Arg<'a>]) -> Fut,
    Fut: Future<Output = Result<Option<PgRow>, sqlx::Error>>,
{
    let mut all = w.args.to_vec();
    all.extend_from_slice(&event_args(0, 0, w.event)[2..]);
    if let Some(outcomes) = w.outcomes {
        all.push(Arg::Text(outcomes));
    }
    run(&all).await
}

#[cfg(test)]
mod tests {
    use super::effect_turns;

    #[test]
    fn effects_leave_one_connection_of_the_pool_to_claimd() {
        assert_eq!(effect_turns(16).available_permits(), 15);
        assert_eq!(effect_turns(3).available_permits(), 2);
        // A pool of one still runs effects, one at a time.
        assert_eq!(effect_turns(1).available_permits(), 1);
        assert_eq!(effect_turns(0).available_permits(), 1);
    }
}
