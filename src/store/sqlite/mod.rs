//! SQLite driver: the embedded, single-node default. One process, WAL mode, writes serialised
//! by SQLite itself, `synchronous = FULL` so an acknowledged claim survives a power cut.
//! Times are INTEGER milliseconds from SQLite's clock. The store's behaviour is the one body
//! of [`SqlStore`]; this module supplies SQLite's statements (`sql`), how values are bound
//! and read, a transaction for a write and its history line, the transactions of its group
//! commit (`many`), an in-process retention lock, and nearest-rank percentiles (SQLite has
//! no percentile function).

#[macro_use]
mod line_sql;
mod many;
mod sql;

use crate::domain::claim::{Claim, NewClaim};
use crate::store::db_effect::{DatabaseEffect, DbEffectError, DbTx};
use crate::store::dialect::{
    Arg, ClaimDb, Dialect, LoggedWrite, RetentionLock, Runner, SqlPool, SqlRow, Statements,
};
use crate::store::outbox::OutcomeConsumers;
use crate::store::sql_store::SqlStore;
use crate::store::{ClaimOutcome, SettleItem, StoreError, StoreResult};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::query::Query;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqlitePool};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};

/// The SQLite claim store.
///
/// Unless made [`unbatched`](SqlStore::unbatched), concurrent
/// [`claim`](crate::store::IntakeStore::claim) and [`settle`](crate::store::EngineStore::settle)
/// calls are committed together, one transaction per batch; every answer still waits for the
/// commit of its row.
pub type SqliteStore = SqlStore<SqliteDialect>;

/// SQLite as a [`Dialect`]: the pool, the writer lock and the in-process retention lock.
#[derive(Debug, Clone)]
pub struct SqliteDialect {
    sql: SqlPool<Sqlite>,
    /// The batches of this process queue here for SQLite's one write lock, instead of in its
    /// busy handler (which sleeps up to 100 ms between tries). The one-row writes (operator
    /// moves, fallbacks, `batch_writes = false`) do not take it: held by settles alone it
    /// starved them behind claims that were not queued on it.
    writer: Arc<Mutex<()>>,
    /// One pruner at a time within the (single) process.
    prune_lock: Arc<Mutex<()>>,
    /// Turns to search claims (see [`search_turns`]), and how many there are.
    searches: Arc<Semaphore>,
    search_limit: usize,
}

/// How long a search waits for a turn before it is answered "busy".
pub const SEARCH_WAIT: Duration = Duration::from_secs(5);

/// Searches that may run at once on a pool of `max_connections`: a quarter of the pool, one
/// or two. A short prefix reads and sorts every claim it matches, and SQLite's readers share
/// this process's CPU and pool with intake: unbounded, 32 one-character searches at 100,000
/// claims held every connection and made intake wait seconds.
pub fn search_turns(max_connections: u32) -> usize {
    (max_connections as usize / 4).clamp(1, 2)
}

impl SqlStore<SqliteDialect> {
    /// Opens (creating if needed) the database named by `url`, with concurrent claims and
    /// settles committed together (see [`SqliteStore`]). Must be called inside a Tokio runtime
    /// (it starts the batching tasks).
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::from_sqlx("connect", e))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            // No idle reaper: sqlx's maintenance task can spin at 100% CPU and stall the runtime
            // (a num_idle underflow, launchbadge/sqlx #3645); connections live until they fail.
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(|e| StoreError::from_sqlx("connect", e))?;
        Ok(SqlStore::batched(SqliteDialect {
            sql: SqlPool {
                pool,
                pooler: crate::store::pooler::Pooler::None,
            },
            writer: Arc::new(Mutex::new(())),
            prune_lock: Arc::new(Mutex::new(())),
            searches: Arc::new(Semaphore::new(search_turns(max_connections))),
            search_limit: search_turns(max_connections),
        }))
    }

    /// The pool, for tests and benchmarks that need raw SQL.
    pub fn pool(&self) -> &SqlitePool {
        &self.dialect.sql.pool
    }
}

/// The retention lock: one pruner at a time in the (single) process.
struct SqliteRetentionLock(tokio::sync::OwnedMutexGuard<()>);

#[async_trait]
impl RetentionLock for SqliteRetentionLock {
    async fn release(self: Box<Self>) {
        drop(self.0);
    }
}

fn err(query: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::from_sqlx(query, e)
}

impl ClaimDb for Sqlite {
    fn rows_affected(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    fn bind_time(
        q: Query<'_, Sqlite, SqliteArguments>,
        t: Option<DateTime<Utc>>,
    ) -> Query<'_, Sqlite, SqliteArguments> {
        q.bind(t.map(|t| t.timestamp_millis()))
    }

    fn read_time(row: &SqliteRow, col: &str) -> StoreResult<Option<DateTime<Utc>>> {
        let ms: Option<i64> = row
            .try_get(col)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        ms.map(|ms| {
            DateTime::from_timestamp_millis(ms)
                .ok_or_else(|| StoreError::Corrupt(format!("time {ms} ms is out of range")))
        })
        .transpose()
    }
}

#[async_trait]
impl Dialect for SqliteDialect {
    type Row = SqliteRow;
    type Runner = SqlPool<Sqlite>;
    const NAME: &'static str = "sqlite";
    const SQL: Statements = sql::STATEMENTS;
    const ACCOUNT_SQL: crate::store::audit::AccountStatements = sql::accounts::ACCOUNT_STATEMENTS;
    const SEAL_SQL: crate::store::sealing::SealStatements = sql::seal::SEAL_STATEMENTS;
    /// One writer: a second task would only wait for the first one's lock, while the calls
    /// arriving meanwhile make the next batch larger.
    const BATCH_WORKERS: usize = 1;
    const BATCH_SINGLES: bool = true;

    async fn migrate(&self) -> StoreResult<()> {
        let mut migrator = crate::store::embedded_migrations::sqlite();
        // A newer build's contract migration: refuse, naming it; its expand-only ones are
        // left as they are (docs/operations.md, "Upgrading").
        let applied: Vec<(i64, String)> =
            sqlx::query_as("SELECT version, description FROM _sqlx_migrations WHERE success")
                .fetch_all(&self.sql.pool)
                .await
                .unwrap_or_default();
        let embedded: Vec<i64> = migrator.iter().map(|m| m.version).collect();
        if let crate::store::schema_window::Window::TooNew {
            version,
            description,
        } = crate::store::schema_window::window(&embedded, &applied)
        {
            return Err(StoreError::SchemaTooNew {
                version,
                description,
            });
        }
        migrator.set_ignore_missing(true);
        migrator.run(&self.sql.pool).await?;
        Ok(())
    }

    /// SQLite runs the update and the history line in one transaction.
    fn runner(&self) -> &SqlPool<Sqlite> {
        &self.sql
    }

    async fn update_logged(&self, w: LoggedWrite<'_>) -> StoreResult<Option<SqliteRow>> {
        let mut tx = self.sql.pool.begin().await.map_err(err("begin"))?;
        let row = many::logged(&mut tx, w).await?;
        if row.is_some() {
            tx.commit().await.map_err(err("commit"))?;
        }
        Ok(row)
    }

    async fn update_logged_after(
        &self,
        effect: &dyn DatabaseEffect,
        claim: &Claim,
        w: LoggedWrite<'_>,
        timeout: Duration,
    ) -> Result<bool, DbEffectError> {
        // A write transaction from the start: a deferred one would be refused its upgrade
        // to a writer when another connection wrote meanwhile.
        let mut conn = self.sql.pool.acquire().await.map_err(err("acquire"))?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE")
            .await
            .map_err(err("begin"))?;
        let run = async {
            if let Err(e) = effect.apply(DbTx::Sqlite(&mut tx), claim).await {
                return Err(DbEffectError::Effect(e));
            }
            Ok::<_, DbEffectError>(many::logged(&mut tx, w).await?.is_some())
        };
        // Dropping the transaction rolls it back.
        let settled = tokio::time::timeout(timeout, run)
            .await
            .map_err(|_| DbEffectError::TimedOut(timeout))??;
        if !settled {
            tx.rollback().await.map_err(err("rollback"))?;
            return Ok(false);
        }
        tx.commit().await.map_err(err("commit"))?;
        Ok(true)
    }

    async fn insert_many(
        &self,
        new: &[&NewClaim],
    ) -> Option<StoreResult<Vec<Option<ClaimOutcome>>>> {
        Some(self.claim_together(new).await)
    }

    async fn settle_many(
        &self,
        items: &[SettleItem<'_>],
        outcomes: &OutcomeConsumers,
    ) -> Option<StoreResult<Vec<bool>>> {
        Some(self.settle_together(items, outcomes).await)
    }

    async fn mark_called_many(&self, marks: &[(i64, i32)]) -> Option<StoreResult<Vec<bool>>> {
        Some(self.mark_called_together(marks).await)
    }

    async fn retention_lock(&self) -> StoreResult<Option<Box<dyn RetentionLock>>> {
        Ok(self
            .prune_lock
            .clone()
            .try_lock_owned()
            .ok()
            .map(|guard| Box::new(SqliteRetentionLock(guard)) as Box<dyn RetentionLock>))
    }

    async fn search_turn(&self) -> StoreResult<Option<OwnedSemaphorePermit>> {
        let turn = tokio::time::timeout(SEARCH_WAIT, self.searches.clone().acquire_owned()).await;
        match turn {
            Ok(Ok(permit)) => Ok(Some(permit)),
            // The semaphore is never closed; a timeout is the only way here.
            _ => Err(StoreError::Busy(format!(
                "{} claim searches (as many as this SQLite store runs at once) were still running after {}s",
                self.search_limit,
                SEARCH_WAIT.as_secs()
            ))),
        }
    }

    async fn completion_percentiles(
        &self,
        consumer: &str,
        since: DateTime<Utc>,
        completed: i64,
    ) -> StoreResult<(Option<f64>, Option<f64>)> {
        // Nearest rank: the k-th smallest receive-to-complete time.
        let at = |q: f64| ((completed as f64 * q).ceil() as i64 - 1).max(0);
        let mut out = [None, None];
        for (slot, rank) in out.iter_mut().zip([at(0.5), at(0.95)]) {
            let rows = self
                .sql
                .fetch(
                    "complete_time_at",
                    sql::COMPLETE_TIME_AT,
                    &[Arg::Text(consumer), Arg::Time(since), Arg::I64(rank)],
                )
                .await?;
            *slot = rows
                .first()
                .map(|r| r.opt_i64("ms"))
                .transpose()?
                .flatten()
                .map(|ms| ms as f64 / 1000.0);
        }
        Ok((out[0], out[1]))
    }
}

#[cfg(test)]
mod tests {
    use super::search_turns;

    #[test]
    fn searches_take_a_quarter_of_the_pool_one_or_two() {
        assert_eq!([1, 4, 7, 8, 16, 100].map(search_turns), [1, 1, 1, 2, 2, 2]);
    }
}
