//! PostgreSQL driver: many `claimd run` processes share one database. The unique index
//! arbitrates claims, `FOR UPDATE SKIP LOCKED` splits stale claims between sweepers, and an
//! advisory lock lets one instance prune at a time. The store's behaviour is the one body of
//! [`SqlStore`]; this module supplies PostgreSQL's statements ([`sql`]), how values are bound
//! and read, the batched writes ([`batch`]) and the retention lock.

#[macro_use]
mod sql;
mod batch;

pub use sql::{COUNT_OPEN, COUNT_WINDOW, TAKE_STALE};

use crate::claim::{Claim, NewClaim};
use crate::store::dialect::{
    ClaimDb, Dialect, LoggedWrite, RetentionLock, SqlPool, Statements, event_args,
};
use crate::store::sql_store::SqlStore;
use crate::store::{ClaimOutcome, NewEvent, SettleItem, Settlement, StoreError, StoreResult};
use async_trait::async_trait;
use batch::{Batcher, PendingClaim, PendingSettle};
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::query::Query;
use sqlx::{PgPool, Postgres, Row};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, mpsc, oneshot};

/// The PostgreSQL claim store.
///
/// Unless made with [`PgStore::unbatched`], concurrent [`claim`](crate::store::ClaimStore::claim)
/// and [`settle`](crate::store::ClaimStore::settle) calls are coalesced into multi-row
/// statements (see the `batch` module); every answer still waits for the commit of its row.
pub type PgStore = SqlStore<PgDialect>;

/// PostgreSQL as a [`Dialect`]: the pool and, when writes are batched, where they wait.
#[derive(Clone)]
pub struct PgDialect {
    sql: SqlPool<Postgres>,
    batch: Option<Arc<Batcher>>,
}

impl std::fmt::Debug for PgDialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDialect")
            .field("pool", &self.sql.pool)
            .field("batched", &self.batch.is_some())
            .finish()
    }
}

impl SqlStore<PgDialect> {
    /// Connects a pool to `url`, with concurrent claims and settles coalesced (see
    /// [`PgStore`]). Must be called inside a Tokio runtime (it starts the batching tasks).
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::from_sqlx("connect", e))?
            .application_name("claimd");
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options);
        let plain = SqlStore {
            dialect: PgDialect {
                sql: SqlPool { pool },
                batch: None,
            },
        };
        let (claims, claims_rx) = mpsc::channel(batch::MAX_BATCH * batch::BATCH_WORKERS);
        let (settles, settles_rx) = mpsc::channel(batch::MAX_BATCH * batch::BATCH_WORKERS);
        let (claims_rx, settles_rx) = (
            Arc::new(Mutex::new(claims_rx)),
            Arc::new(Mutex::new(settles_rx)),
        );
        for _ in 0..batch::BATCH_WORKERS {
            tokio::spawn(batch::claim_worker(plain.clone(), claims_rx.clone()));
            tokio::spawn(batch::settle_worker(plain.clone(), settles_rx.clone()));
        }
        Ok(SqlStore {
            dialect: PgDialect {
                batch: Some(Arc::new(Batcher { claims, settles })),
                ..plain.dialect
            },
        })
    }

    /// The same store with every call sent on its own (one statement per claim or settle).
    pub fn unbatched(self) -> Self {
        SqlStore {
            dialect: PgDialect {
                batch: None,
                ..self.dialect
            },
        }
    }

    /// The pool, for tests and benchmarks that need raw SQL.
    pub fn pool(&self) -> &PgPool {
        &self.dialect.sql.pool
    }
}

/// The retention lock: a session advisory lock on a connection of its own.
struct PgRetentionLock(sqlx::PgConnection);

#[async_trait]
impl RetentionLock for PgRetentionLock {
    /// Ends the session: PostgreSQL frees its locks before the connection closes, so the next
    /// instance can take the lock at once, whether or not an unlock would have worked.
    async fn release(self: Box<Self>) {
        let _ = sqlx::Connection::close(self.0).await;
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

    async fn migrate(&self) -> StoreResult<()> {
        sqlx::migrate!("migrations/postgres")
            .run(&self.sql.pool)
            .await?;
        Ok(())
    }

    /// PostgreSQL's statements write their history line themselves (a data-modifying CTE):
    /// the event's values are bound after the update's.
    fn runner(&self) -> &SqlPool<Postgres> {
        &self.sql
    }

    async fn update_logged(&self, w: LoggedWrite<'_>) -> StoreResult<Option<PgRow>> {
        let mut all = w.args.to_vec();
        // The event's columns after the claim's id and attempt, which the statement takes
        // from the row it changed.
        all.extend_from_slice(&event_args(0, 0, w.event)[2..]);
        SqlPool::<Postgres>::query(w.sql, &all)
            .fetch_optional(&self.sql.pool)
            .await
            .map_err(err(w.name))
    }

    /// A session advisory lock, on a connection taken out of the pool: it can never go back
    /// to the pool still holding the lock (an unlock that failed, a task dropped mid-prune),
    /// because dropping a detached connection closes it, and PostgreSQL frees a session's
    /// locks when the session ends.
    async fn retention_lock(&self) -> StoreResult<Option<Box<dyn RetentionLock>>> {
        let mut conn = self
            .sql
            .pool
            .acquire()
            .await
            .map_err(err("acquire"))?
            .detach();
        let locked: bool = sqlx::query_scalar(sql::TRY_PRUNE_LOCK)
            .bind(sql::PRUNE_LOCK_KEY)
            .fetch_one(&mut conn)
            .await
            .map_err(err("try_prune_lock"))?;
        Ok(locked.then(|| Box::new(PgRetentionLock(conn)) as Box<dyn RetentionLock>))
    }

    async fn claim_batched(&self, new: &NewClaim) -> Option<StoreResult<ClaimOutcome>> {
        let b = self.batch.as_ref()?;
        let (done, answer) = oneshot::channel();
        let p = PendingClaim {
            new: new.clone(),
            done,
        };
        if b.claims.send(p).await.is_ok()
            && let Ok(r) = answer.await
        {
            return Some(r);
        }
        None
    }

    async fn settle_batched(
        &self,
        id: i64,
        attempt: i32,
        s: &Settlement,
        event: &NewEvent<'_>,
    ) -> Option<StoreResult<bool>> {
        let b = self.batch.as_ref()?;
        let (done, answer) = oneshot::channel();
        let p = PendingSettle::new(id, attempt, s, event, done);
        if b.settles.send(p).await.is_ok()
            && let Ok(r) = answer.await
        {
            return Some(r);
        }
        None
    }

    async fn insert_many(&self, new: &[&NewClaim]) -> Option<StoreResult<Vec<Option<Claim>>>> {
        Some(batch::insert_batch(&self.sql.pool, new).await)
    }

    async fn settle_many(&self, items: &[SettleItem<'_>]) -> Option<StoreResult<Vec<bool>>> {
        Some(batch::settle_batch(&self.sql.pool, items).await)
    }
}
