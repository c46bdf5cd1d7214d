//! The one body of both SQL drivers: [`SqlStore`] implements [`ClaimStore`] once, over a
//! [`Dialect`] that supplies what really differs between PostgreSQL and SQLite — the SQL text
//! of each named statement, how times are stored (`timestamptz` in one and integer
//! milliseconds in the other), and the extras only one of them has
//! (PostgreSQL's advisory lock and multi-row statements, SQLite's percentiles). Concurrent
//! claims and settles are committed together through the `batch` module.
//!
//! Every rule lives here or in the claim model: fencing (`attempt` and `state = 'started'`, and
//! the `version` a reader saw) is in the arguments every settle binds, and which states an
//! operator may move a claim from is asked of [`ClaimState::can_move_to`](crate::domain::claim::ClaimState::can_move_to) and bound into the statement's `WHERE`.
//!
//! This file holds the struct, the group commit's one-row path and what every role shares;
//! each role's trait is implemented in a file of its own: `intake`, `engine`, `operator`,
//! `outbox`, `ledger`, `reports`, `accounts` (as in [`roles`](crate::store::roles)).

mod accounts;
mod engine;
mod erasure;
mod intake;
mod ledger;
mod lines;
mod operator;
mod outbox;
mod reports;
mod retention;
mod schedules;
mod seal;

use crate::domain::claim::NewClaim;
use crate::store::batch::{Batcher, OneByOne};
use crate::store::dialect::{Arg, Dialect, Runner, SqlRow};
use crate::store::outbox::OutcomeConsumers;
use crate::store::{ClaimOutcome, ClaimStore, NewEvent, Settlement, StoreError, StoreResult};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::sync::{Arc, OnceLock};

/// A claim store over one SQL dialect.
///
/// Unless made [`unbatched`](SqlStore::unbatched), concurrent
/// [`claim`](crate::store::IntakeStore::claim) and
/// [`settle`](crate::store::EngineStore::settle) calls are committed
/// together (see the `batch` module); every answer still waits for the commit of its row.
#[derive(Debug, Clone)]
pub struct SqlStore<D> {
    pub(crate) dialect: D,
    /// Where concurrent writes wait to be committed together; `None`: one by one.
    batch: Option<Arc<Batcher>>,
    /// The consumers whose settles write outcome events (set once, at start).
    outcomes: Arc<OnceLock<OutcomeConsumers>>,
}

impl<D: Dialect> OneByOne<D> for SqlStore<D> {
    fn dialect(&self) -> &D {
        &self.dialect
    }

    fn outcomes(&self) -> &OutcomeConsumers {
        SqlStore::outcomes(self)
    }

    fn claim_one(&self, new: &NewClaim) -> impl Future<Output = StoreResult<ClaimOutcome>> + Send {
        SqlStore::claim_one(self, new)
    }

    fn settle_one(
        &self,
        id: i64,
        attempt: i32,
        s: &Settlement,
        event: &NewEvent<'_>,
    ) -> impl Future<Output = StoreResult<bool>> + Send {
        SqlStore::settle_one(self, id, attempt, s, event)
    }

    fn mark_called_one(
        &self,
        id: i64,
        attempt: i32,
    ) -> impl Future<Output = StoreResult<bool>> + Send {
        SqlStore::mark_called_one(self, id, attempt)
    }
}

impl<D: Dialect> SqlStore<D> {
    /// The store over `dialect`, with concurrent claims and settles committed together. Must
    /// be called inside a Tokio runtime (it starts the batching tasks).
    pub(crate) fn batched(dialect: D) -> Self {
        let plain = SqlStore {
            dialect,
            batch: None,
            outcomes: Arc::default(),
        };
        SqlStore {
            batch: Some(Batcher::start(plain.clone())),
            ..plain
        }
    }

    /// The same store with every call written on its own (one commit per claim or settle).
    pub fn unbatched(self) -> Self {
        SqlStore {
            batch: None,
            ..self
        }
    }
}

impl<D: Dialect> SqlStore<D> {
    /// The consumers whose settles write outcome events (none until set).
    pub(crate) fn outcomes(&self) -> &OutcomeConsumers {
        static NONE: OnceLock<OutcomeConsumers> = OnceLock::new();
        self.outcomes
            .get()
            .unwrap_or_else(|| NONE.get_or_init(OutcomeConsumers::default))
    }

    async fn fetch(
        &self,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<Vec<D::Row>> {
        self.dialect.runner().fetch(name, sql, args).await
    }

    async fn execute(
        &self,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<u64> {
        self.dialect.runner().execute(name, sql, args).await
    }
}

#[async_trait]
impl<D: Dialect> ClaimStore for SqlStore<D> {
    fn dialect(&self) -> &'static str {
        D::NAME
    }

    async fn migrate(&self) -> StoreResult<()> {
        self.dialect.migrate().await
    }

    fn trouble(&self) -> Option<String> {
        self.dialect.trouble()
    }

    async fn ping(&self) -> StoreResult<()> {
        match self.execute("ping", D::SQL.ping, &[]).await {
            Ok(_) => Ok(()),
            // The driver only says the pool timed out; the failover monitor knows why.
            Err(e) if e.is_unavailable() => {
                Err(self.dialect.trouble().map_or(e, StoreError::NoPrimary))
            }
            Err(e) => Err(e),
        }
    }

    async fn now(&self) -> StoreResult<DateTime<Utc>> {
        let rows = self.fetch("now", D::SQL.now, &[]).await?;
        rows.first()
            .ok_or_else(|| StoreError::Corrupt("the clock query returned no row".into()))?
            .time("now")
    }

    async fn probe_write(&self, instance: &str) -> StoreResult<()> {
        self.execute("probe_write", D::SQL.probe_write, &[Arg::Text(instance)])
            .await
            .map(|_| ())
    }

    async fn replication(
        &self,
    ) -> StoreResult<Option<crate::store::replication::ReplicationSettings>> {
        self.dialect.replication().await
    }

    async fn storage_health(
        &self,
    ) -> StoreResult<Option<crate::store::storage_health::StorageHealth>> {
        self.dialect.storage_health().await
    }

    async fn rebuild_indexes(
        &self,
        choice: &crate::store::index_rebuild::RebuildChoice,
        dry_run: bool,
    ) -> StoreResult<Option<crate::store::index_rebuild::Reindexed>> {
        self.dialect.rebuild_indexes(choice, dry_run).await
    }
}
