//! The one body of both SQL drivers: [`SqlStore`] implements [`ClaimStore`] once, over a
//! [`Dialect`](super::dialect::Dialect) that supplies what really differs between PostgreSQL
//! and SQLite — the SQL text of each named statement, how times are stored (`timestamptz` in
//! one and integer milliseconds in the other), and the extras only one of them has
//! (PostgreSQL's advisory lock and multi-row statements, SQLite's percentiles). Concurrent
//! claims and settles are committed together through the `batch` module.
//!
//! Every rule lives here or in the claim model: fencing (`attempt` and `state = 'started'`, and
//! the `version` a reader saw) is in the arguments every settle binds, and which states an operator may move a claim from is
//! asked of [`ClaimState::can_move_to`] and bound into the statement's `WHERE`.

use super::args::{
    created, insert_args, key_args, ms, operator_from_states, repeat_args, repeat_outcome,
    settle_args, settle_from_args,
};
use super::batch::{Batcher, OneByOne};
use super::dialect::{Arg, Dialect, LoggedWrite, Runner, SqlRow, event_args};
use super::outbox::{OutboxBacklog, OutcomeConsumers, OutcomeEvent, emits, first_per_claim};
use super::rows::{claim_from_row, taken_from_row};
use super::{
    ClaimEvent, ClaimFilter, ClaimOutcome, ClaimStore, ConsumerCounts, CountsByConsumer,
    DestinationRecord, LedgerClaim, LedgerRunRecord, NewEvent, ProviderEventRecord, PruneResult,
    Seen, SettleItem, Settlement, StoreError, StoreResult, TakenClaim, UnmatchedEvent,
};
use crate::domain::claim::{Claim, ClaimState, NewClaim};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tracing::instrument;

/// A claim store over one SQL dialect.
///
/// Unless made [`unbatched`](SqlStore::unbatched), concurrent
/// [`claim`](ClaimStore::claim) and [`settle`](ClaimStore::settle) calls are committed
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

    fn outcomes(&self) -> &super::outbox::OutcomeConsumers {
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

    /// One claim, one statement (plus the repeat count for a duplicate).
    pub(crate) async fn claim_one(&self, new: &NewClaim) -> StoreResult<ClaimOutcome> {
        let sql = &D::SQL;
        // Each statement autocommits: the claim is committed alone (I1). A row pruned between
        // the two statements makes the repeat-count miss; the loop then claims it afresh.
        for _ in 0..3 {
            let inserted = self
                .fetch("insert_claim", sql.insert_claim, &insert_args(new))
                .await?;
            if let Some(row) = inserted.first() {
                return Ok(created(new, claim_from_row(row)?));
            }
            let existing = self
                .fetch("count_repeat", sql.count_repeat, &repeat_args(new))
                .await?;
            if let Some(row) = existing.first() {
                return Ok(repeat_outcome(new, claim_from_row(row)?));
            }
        }
        Err(StoreError::Corrupt(format!(
            "claim {}/{} neither inserted nor found after 3 tries",
            new.consumer, new.message_id
        )))
    }

    /// One fenced settle with its history line (I2).
    /// `mark_called` alone: the one-row fenced update in its own transaction.
    pub(crate) async fn mark_called_one(&self, id: i64, attempt: i32) -> StoreResult<bool> {
        let n = self
            .execute(
                "mark_called",
                D::SQL.mark_called,
                &[Arg::I64(id), Arg::I32(attempt)],
            )
            .await?;
        Ok(n == 1)
    }

    pub(crate) async fn settle_one(
        &self,
        id: i64,
        attempt: i32,
        s: &Settlement,
        event: &NewEvent<'_>,
    ) -> StoreResult<bool> {
        let args = settle_args(id, attempt, s);
        let changed = self
            .dialect
            .update_logged(LoggedWrite {
                name: "settle",
                sql: D::SQL.settle,
                args: &args,
                event,
                outcomes: self.outcomes().bound(emits(ClaimState::Started, s.state)),
            })
            .await?;
        Ok(changed.is_some())
    }

    async fn state_of(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<ClaimState>> {
        let rows = self
            .fetch(
                "state_of",
                D::SQL.state_of,
                &key_args(consumer, tenant, message_id),
            )
            .await?;
        rows.first()
            .map(|r| {
                let s = r.text("state")?;
                ClaimState::from_str(&s).map_err(|e| StoreError::Corrupt(e.to_string()))
            })
            .transpose()
    }

    /// An operator move (`resolve` or `redrive`): one conditional update whose `WHERE` allows
    /// only the states the model allows, with its history line. `None`: no such claim;
    /// `Err(state)`: the claim is in a state the move is not allowed from.
    async fn operator_move(
        &self,
        name: &'static str,
        sql: &'static str,
        key: [&str; 3],
        to: ClaimState,
        expected: Option<Seen>,
        event: &NewEvent<'_>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        let [consumer, tenant, message_id] = key;
        let Some([from_a, from_b]) = operator_from_states(to, expected.map(|e| e.state)) else {
            return Ok(self.state_of(consumer, tenant, message_id).await?.map(Err));
        };
        let mut args = key_args(consumer, tenant, message_id).to_vec();
        if to != ClaimState::Started {
            args.push(Arg::Text(to.as_str()));
        }
        args.extend([
            Arg::Text(from_a),
            Arg::Text(from_b),
            Arg::OptI32(expected.and_then(|e| e.attempt)),
            Arg::OptI64(expected.and_then(|e| e.version)),
        ]);
        // An operator's resolve or redrive is always an outcome event.
        let write = LoggedWrite {
            name,
            sql,
            args: &args,
            event,
            outcomes: self.outcomes().bound(true),
        };
        match self.dialect.update_logged(write).await? {
            Some(row) => Ok(Some(Ok(claim_from_row(&row)?))),
            None => Ok(self.state_of(consumer, tenant, message_id).await?.map(Err)),
        }
    }

    async fn scalar_count(
        &self,
        name: &'static str,
        sql: &'static str,
        keep: Duration,
    ) -> StoreResult<u64> {
        let rows = self.fetch(name, sql, &[Arg::I64(ms(keep))]).await?;
        Ok(rows
            .first()
            .map(|r| r.i64("n"))
            .transpose()?
            .unwrap_or(0)
            .max(0) as u64)
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

    async fn ping(&self) -> StoreResult<()> {
        self.execute("ping", D::SQL.ping, &[]).await.map(|_| ())
    }

    async fn now(&self) -> StoreResult<DateTime<Utc>> {
        let rows = self.fetch("now", D::SQL.now, &[]).await?;
        rows.first()
            .ok_or_else(|| StoreError::Corrupt("the clock query returned no row".into()))?
            .time("now")
    }

    #[instrument(skip_all, fields(consumer = %new.consumer, tenant = %new.tenant, message_id = %new.message_id))]
    async fn claim(&self, new: &NewClaim) -> StoreResult<ClaimOutcome> {
        if let Some(b) = &self.batch
            && let Some(answer) = b.claim(new).await
        {
            return answer;
        }
        self.claim_one(new).await
    }

    async fn claim_many(&self, new: &[NewClaim]) -> StoreResult<Vec<ClaimOutcome>> {
        let refs: Vec<&NewClaim> = new.iter().collect();
        let many = if new.len() > 1 || D::BATCH_SINGLES {
            self.dialect.insert_many(&refs).await
        } else {
            None
        };
        let decided = match many {
            Some(decided) => decided?,
            None => vec![None; new.len()],
        };
        let mut out = Vec::with_capacity(new.len());
        for (n, o) in new.iter().zip(decided) {
            out.push(match o {
                Some(o) => o,
                None => self.claim_one(n).await?,
            });
        }
        Ok(out)
    }

    async fn get(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<Claim>> {
        let rows = self
            .fetch(
                "get_claim",
                D::SQL.get_claim,
                &key_args(consumer, tenant, message_id),
            )
            .await?;
        rows.first().map(claim_from_row).transpose()
    }

    async fn find_by_provider_id(
        &self,
        consumer: &str,
        provider_id: &str,
    ) -> StoreResult<Option<Claim>> {
        let rows = self
            .fetch(
                "find_by_provider_id",
                D::SQL.find_by_provider_id,
                &[Arg::Text(consumer), Arg::Text(provider_id)],
            )
            .await?;
        rows.first().map(claim_from_row).transpose()
    }

    async fn provider_event_seen(&self, consumer: &str, event_id: &str) -> StoreResult<bool> {
        let rows = self
            .fetch(
                "provider_event_seen",
                D::SQL.provider_event_seen,
                &[Arg::Text(consumer), Arg::Text(event_id)],
            )
            .await?;
        Ok(rows.first().map(|r| r.i64("n")).transpose()?.unwrap_or(0) > 0)
    }

    async fn record_provider_event(&self, e: &ProviderEventRecord<'_>) -> StoreResult<()> {
        self.execute(
            "insert_provider_event",
            D::SQL.insert_provider_event,
            &[
                Arg::Text(e.consumer),
                Arg::Text(e.event_id),
                Arg::Text(e.event_type),
                Arg::OptText(e.object_id),
                Arg::OptI64(e.claim_id),
                Arg::Text(e.result),
            ],
        )
        .await
        .map(|_| ())
    }

    async fn ledger_claims(
        &self,
        consumer: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        after: (&str, i64),
        limit: u32,
    ) -> StoreResult<Vec<LedgerClaim>> {
        let rows = self
            .fetch(
                "list_ledger_claims",
                D::SQL.list_ledger_claims,
                &[
                    Arg::Text(consumer),
                    Arg::Time(from),
                    Arg::Time(to),
                    Arg::Text(after.0),
                    Arg::I64(after.1),
                    Arg::I64(i64::from(limit)),
                ],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(LedgerClaim {
                    id: r.i64("id")?,
                    tenant: r.text("tenant")?,
                    message_id: r.text("message_id")?,
                    idem_key: r.text("idem_key")?,
                    state: ClaimState::from_str(&r.text("state")?)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                    received_utc: r.time("received_utc")?,
                    payload: r.bytes_or_empty("payload"),
                    provider_id: r.opt_text("provider_id")?,
                })
            })
            .collect()
    }

    async fn save_ledger_run(&self, consumer: &str, summary: &str) -> StoreResult<()> {
        self.execute(
            "save_ledger_run",
            D::SQL.save_ledger_run,
            &[Arg::Text(consumer), Arg::Text(summary)],
        )
        .await
        .map(|_| ())
    }

    async fn ledger_runs(&self) -> StoreResult<Vec<LedgerRunRecord>> {
        let rows = self
            .fetch("list_ledger_runs", D::SQL.list_ledger_runs, &[])
            .await?;
        rows.iter()
            .map(|r| {
                Ok(LedgerRunRecord {
                    consumer: r.text("consumer")?,
                    at_utc: r.time("at_utc")?,
                    summary: serde_json::from_str(&r.text("summary")?)
                        .unwrap_or(serde_json::Value::Null),
                })
            })
            .collect()
    }

    async fn unmatched_provider_events(
        &self,
        since: Option<DateTime<Utc>>,
        limit: u32,
    ) -> StoreResult<Vec<UnmatchedEvent>> {
        let rows = self
            .fetch(
                "list_unmatched_events",
                D::SQL.list_unmatched_events,
                &[
                    Arg::Time(since.unwrap_or(DateTime::UNIX_EPOCH)),
                    Arg::I64(i64::from(limit)),
                ],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(UnmatchedEvent {
                    consumer: r.text("consumer")?,
                    event_id: r.text("event_id")?,
                    event_type: r.text("event_type")?,
                    object_id: r.opt_text("object_id")?,
                    received_utc: r.time("received_utc")?,
                })
            })
            .collect()
    }

    #[instrument(skip_all, fields(claim_id = id, attempt))]
    async fn settle(
        &self,
        id: i64,
        attempt: i32,
        s: &Settlement,
        event: &NewEvent<'_>,
    ) -> StoreResult<bool> {
        if let Some(b) = &self.batch
            && let Some(answer) = b.settle(id, attempt, s, event).await
        {
            return answer;
        }
        self.settle_one(id, attempt, s, event).await
    }

    async fn settle_many(&self, items: &[SettleItem<'_>]) -> StoreResult<Vec<bool>> {
        if (items.len() > 1 || D::BATCH_SINGLES)
            && let Some(done) = self.dialect.settle_many(items, self.outcomes()).await
        {
            return done;
        }
        let mut out = Vec::with_capacity(items.len());
        for i in items {
            out.push(
                self.settle_one(i.id, i.attempt, &i.settlement, &i.event)
                    .await?,
            );
        }
        Ok(out)
    }

    async fn settle_from(
        &self,
        id: i64,
        attempt: i32,
        version: i64,
        from: ClaimState,
        s: &Settlement,
        event: &NewEvent<'_>,
    ) -> StoreResult<bool> {
        let args = settle_from_args(id, attempt, Some(version), from, s);
        let changed = self
            .dialect
            .update_logged(LoggedWrite {
                name: "settle_from",
                sql: D::SQL.settle,
                args: &args,
                event,
                outcomes: self.outcomes().bound(emits(from, s.state)),
            })
            .await?;
        Ok(changed.is_some())
    }

    async fn record_event(&self, id: i64, attempt: i32, e: &NewEvent<'_>) -> StoreResult<()> {
        self.execute(
            "insert_event",
            D::SQL.insert_event,
            &event_args(id, attempt, e),
        )
        .await
        .map(|_| ())
    }

    async fn record_fenced_out(&self, id: i64, attempt: i32, e: &NewEvent<'_>) -> StoreResult<()> {
        self.execute(
            "insert_fenced_out_event",
            D::SQL.insert_fenced_out_event,
            &event_args(id, attempt, e),
        )
        .await
        .map(|_| ())
    }

    async fn mark_called(&self, id: i64, attempt: i32) -> StoreResult<bool> {
        if let Some(b) = &self.batch
            && let Some(answer) = b.mark_called(id, attempt).await
        {
            return answer;
        }
        self.mark_called_one(id, attempt).await
    }

    async fn note_resent(&self, id: i64, attempt: i32) -> StoreResult<bool> {
        let n = self
            .execute(
                "note_resent",
                D::SQL.note_resent,
                &[Arg::I64(id), Arg::I32(attempt)],
            )
            .await?;
        Ok(n == 1)
    }

    async fn unnote_resent(&self, id: i64, attempt: i32) -> StoreResult<bool> {
        let n = self
            .execute(
                "unnote_resent",
                D::SQL.unnote_resent,
                &[Arg::I64(id), Arg::I32(attempt)],
            )
            .await?;
        Ok(n == 1)
    }

    async fn list(&self, f: &ClaimFilter) -> StoreResult<Vec<Claim>> {
        let search = f.search.as_deref().filter(|q| !q.is_empty());
        // The top of the prefix range: nothing that starts with the text sorts after it.
        let top = search.map(|q| format!("{q}\u{10FFFF}"));
        let mut args = vec![
            Arg::OptText(f.state.map(ClaimState::as_str)),
            Arg::OptText(f.consumer.as_deref()),
            Arg::Bool(f.stuck),
            Arg::OptTime(f.since),
            Arg::I64(i64::from(f.limit)),
            Arg::OptTime(f.until),
            Arg::OptText(f.tenant.as_deref()),
            Arg::OptTime(f.after.map(|c| c.received_utc)),
            Arg::OptI64(f.after.map(|c| c.id)),
        ];
        let rows = match (search, &top) {
            (Some(q), Some(top)) => {
                let _turn = self.dialect.search_turn().await?;
                args.extend([Arg::Text(q), Arg::Text(top)]);
                self.fetch("search_claims", D::SQL.search_claims, &args)
                    .await?
            }
            _ if f.stuck => {
                self.fetch("list_stuck_claims", D::SQL.list_stuck_claims, &args)
                    .await?
            }
            _ => self.fetch("list_claims", D::SQL.list_claims, &args).await?,
        };
        rows.iter().map(claim_from_row).collect()
    }

    async fn parked_by_reason(
        &self,
        consumer: &str,
        reason_prefix: &str,
        limit: u32,
    ) -> StoreResult<Vec<Claim>> {
        let rows = self
            .fetch(
                "list_parked_by_reason",
                D::SQL.list_parked_by_reason,
                &[
                    Arg::Text(consumer),
                    Arg::Text(reason_prefix),
                    Arg::I64(i64::from(limit)),
                ],
            )
            .await?;
        rows.iter().map(claim_from_row).collect()
    }

    async fn events(&self, id: i64) -> StoreResult<Vec<ClaimEvent>> {
        let rows = self
            .fetch("list_events", D::SQL.list_events, &[Arg::I64(id)])
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ClaimEvent {
                    attempt: r.i32("attempt")?,
                    at_utc: r.time("at_utc")?,
                    actor: r.text("actor")?,
                    action: r.text("action")?,
                    outcome: r.text("outcome")?,
                    provider_status: r.opt_i32("provider_status")?,
                    detail: r.opt_text("detail")?,
                })
            })
            .collect()
    }

    #[instrument(skip(self))]
    async fn take_stale(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        expired_before: DateTime<Utc>,
    ) -> StoreResult<Vec<TakenClaim>> {
        let rows = self
            .fetch(
                "take_stale",
                D::SQL.take_stale,
                &[
                    Arg::Text(consumer),
                    Arg::I64(i64::from(limit)),
                    Arg::Text(owner),
                    Arg::I64(ms(lease)),
                    Arg::Time(expired_before),
                ],
            )
            .await?;
        rows.iter().map(|r| taken_from_row(r, 0)).collect()
    }

    async fn take_pending(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
    ) -> StoreResult<Vec<TakenClaim>> {
        let rows = self
            .fetch(
                "take_pending",
                D::SQL.take_pending,
                &[
                    Arg::Text(consumer),
                    Arg::I64(i64::from(limit)),
                    Arg::Text(owner),
                    Arg::I64(ms(lease)),
                ],
            )
            .await?;
        rows.iter().map(|r| taken_from_row(r, 0)).collect()
    }

    async fn peek_stale(&self, consumer: &str, limit: u32) -> StoreResult<Vec<TakenClaim>> {
        let rows = self
            .fetch(
                "peek_stale",
                D::SQL.peek_stale,
                &[Arg::Text(consumer), Arg::I64(i64::from(limit))],
            )
            .await?;
        // Shown with the attempt number a takeover would give them.
        rows.iter().map(|r| taken_from_row(r, 1)).collect()
    }

    #[allow(clippy::too_many_arguments)]
    async fn resolve(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        to: ClaimState,
        actor: &str,
        note: &str,
        expected: Option<Seen>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        if !to.is_terminal() {
            return Ok(self.state_of(consumer, tenant, message_id).await?.map(Err));
        }
        let event = NewEvent {
            actor,
            action: "resolve",
            outcome: to.as_str(),
            provider_status: None,
            detail: Some(note),
        };
        self.operator_move(
            "resolve",
            D::SQL.resolve,
            [consumer, tenant, message_id],
            to,
            expected,
            &event,
        )
        .await
    }

    async fn redrive_noted(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        actor: &str,
        note: &str,
        expected: Option<Seen>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        // For the history line only: the move itself is decided by the update's WHERE.
        let was = self.state_of(consumer, tenant, message_id).await?.map(|s| {
            // The operator's note, when given, is kept in the same history line.
            if note.is_empty() {
                format!("was {s}")
            } else {
                format!("was {s}: {note}")
            }
        });
        let event = NewEvent {
            actor,
            action: "redrive",
            outcome: "started",
            provider_status: None,
            detail: was.as_deref(),
        };
        self.operator_move(
            "redrive",
            D::SQL.redrive,
            [consumer, tenant, message_id],
            ClaimState::Started,
            expected,
            &event,
        )
        .await
    }

    async fn record_dead_letter(
        &self,
        consumer: &str,
        reason: &str,
        message_id: Option<&str>,
    ) -> StoreResult<()> {
        let printable = message_id.map(super::printable_id);
        self.execute(
            "insert_dead_letter",
            D::SQL.insert_dead_letter,
            &[
                Arg::Text(consumer),
                Arg::Text(reason),
                Arg::OptText(printable.as_deref()),
            ],
        )
        .await
        .map(|_| ())
    }

    async fn counts(&self, since: Option<DateTime<Utc>>) -> StoreResult<Vec<ConsumerCounts>> {
        let since = since.unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
        let mut by = CountsByConsumer::default();
        let rows = self
            .fetch("count_window", D::SQL.count_window, &[Arg::Time(since)])
            .await?;
        for r in &rows {
            let consumer = r.text("consumer")?;
            let c = by.get(consumer);
            let claims = r.i64("claims")?;
            c.duplicates = r.i64("duplicates")?;
            c.payload_mismatches = r.i64("mismatches")?;
            c.received = claims + c.duplicates + c.payload_mismatches;
            c.completed = r.i64("completed")?;
            c.failed = r.i64("failed")?;
            c.resent = r.i64("resent")?;
            c.p50_complete_s = r.opt_f64("p50")?;
            c.p95_complete_s = r.opt_f64("p95")?;
            // `timed`: the completed claims the percentiles cover (operator resolves left out).
            let timed = r.i64("timed")?;
            if timed > 0 && c.p50_complete_s.is_none() {
                (c.p50_complete_s, c.p95_complete_s) = self
                    .dialect
                    .completion_percentiles(&c.consumer, since, timed)
                    .await?;
            }
        }
        let rows = self
            .fetch(
                "count_dead_letters",
                D::SQL.count_dead_letters,
                &[Arg::Time(since)],
            )
            .await?;
        for r in &rows {
            by.get(r.text("consumer")?).dead_lettered = r.i64("n")?;
        }
        by.add_open(self.open_counts().await?);
        Ok(by.into_vec())
    }

    async fn open_counts(&self) -> StoreResult<Vec<ConsumerCounts>> {
        let mut by = CountsByConsumer::default();
        let rows = self.fetch("count_open", D::SQL.count_open, &[]).await?;
        for r in &rows {
            let state = r.text("state")?;
            let n = r.i64("n")?;
            let c = by.get(r.text("consumer")?);
            if state == ClaimState::Started.as_str() {
                c.started = n;
                c.stuck = r.opt_i64("stuck")?.unwrap_or(0);
                c.waiting = r.opt_i64("waiting")?.unwrap_or(0);
                c.oldest_started_age_s = r.opt_i64("oldest_ms")?.map(|ms| ms as f64 / 1000.0);
            } else if state == ClaimState::Pending.as_str() {
                c.pending = n;
                c.oldest_pending_age_s = r.opt_i64("oldest_ms")?.map(|ms| ms as f64 / 1000.0);
            } else {
                c.needs_attention = n;
            }
        }
        Ok(by.into_vec())
    }

    async fn mark_sweep(&self, instance: &str) -> StoreResult<()> {
        self.execute("mark_sweep", D::SQL.mark_sweep, &[Arg::Text(instance)])
            .await
            .map(|_| ())
    }

    async fn mark_destination(
        &self,
        consumer: &str,
        instance: &str,
        detail: &str,
    ) -> StoreResult<()> {
        let name = format!("destination:{consumer}:{instance}");
        let sql = &D::SQL;
        self.execute(
            "mark_destination",
            sql.mark_destination,
            &[Arg::Text(&name), Arg::Text(instance), Arg::Text(detail)],
        )
        .await?;
        self.execute(
            "prune_destinations",
            sql.prune_destinations,
            &[Arg::I64(86_400_000)],
        )
        .await
        .map(|_| ())
    }

    async fn destinations(&self) -> StoreResult<Vec<DestinationRecord>> {
        let rows = self
            .fetch("list_destinations", D::SQL.list_destinations, &[])
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let name = r.text("name")?;
            let instance = r.text("instance")?;
            // `destination:<consumer>:<instance>`; consumer names hold no ':'.
            let consumer = name
                .strip_prefix("destination:")
                .and_then(|rest| rest.strip_suffix(&format!(":{instance}")))
                .unwrap_or_default()
                .to_string();
            let detail = r
                .opt_text("detail")?
                .and_then(|d| serde_json::from_str(&d).ok())
                .unwrap_or(serde_json::Value::Null);
            out.push(DestinationRecord {
                consumer,
                instance,
                at_utc: r.time("at_utc")?,
                detail,
            });
        }
        Ok(out)
    }

    async fn probe_write(&self, instance: &str) -> StoreResult<()> {
        self.execute("probe_write", D::SQL.probe_write, &[Arg::Text(instance)])
            .await
            .map(|_| ())
    }

    async fn last_sweep(&self) -> StoreResult<Option<DateTime<Utc>>> {
        let rows = self.fetch("last_sweep", D::SQL.last_sweep, &[]).await?;
        rows.first().map(|r| r.time("at_utc")).transpose()
    }

    fn set_outcome_consumers(&self, consumers: Vec<String>) {
        let _ = self.outcomes.set(OutcomeConsumers::new(consumers));
    }

    fn outcome_consumers(&self) -> Vec<String> {
        self.outcomes().names().to_vec()
    }

    async fn hold_outcome_relay(
        &self,
        consumer: &str,
        owner: &str,
        lease: Duration,
    ) -> StoreResult<bool> {
        let held = self
            .fetch(
                "hold_outcome_relay",
                D::SQL.hold_outcome_relay,
                &[Arg::Text(consumer), Arg::Text(owner), Arg::I64(ms(lease))],
            )
            .await?;
        Ok(!held.is_empty())
    }

    async fn due_outcomes(&self, consumer: &str, limit: u32) -> StoreResult<Vec<OutcomeEvent>> {
        let rows = self
            .fetch(
                "due_outcomes",
                D::SQL.due_outcomes,
                &[Arg::Text(consumer), Arg::I64(i64::from(limit))],
            )
            .await?;
        let mut events = rows
            .iter()
            .map(|r| {
                Ok(OutcomeEvent {
                    seq: r.i64("id")?,
                    claim_id: r.i64("claim_id")?,
                    consumer: r.text("consumer")?,
                    tenant: r.text("tenant")?,
                    message_id: r.text("message_id")?,
                    key: r.text("idem_key")?,
                    state: r.text("state")?,
                    attempt: r.i32("attempt")?,
                    provider_status: r.opt_i32("provider_status")?,
                    provider_id: r.opt_text("provider_id")?,
                    provider_response: r.opt_text("provider_response")?,
                    reason: r.opt_text("reason")?,
                    actor: r.text("actor")?,
                    action: r.text("action")?,
                    at_utc: r.time("at_utc")?,
                    tries: r.i32("tries")?,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        events.sort_by_key(|e| e.seq);
        Ok(first_per_claim(events))
    }

    async fn release_outcome_relay(&self, consumer: &str, owner: &str) -> StoreResult<()> {
        self.execute(
            "release_outcome_relay",
            D::SQL.release_outcome_relay,
            &[Arg::Text(consumer), Arg::Text(owner)],
        )
        .await
        .map(|_| ())
    }

    async fn mark_outcomes_sent(&self, seqs: &[i64]) -> StoreResult<u64> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let ids = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into());
        self.execute(
            "mark_outcomes_sent",
            D::SQL.mark_outcomes_sent,
            &[Arg::Text(&ids)],
        )
        .await
    }

    async fn retry_outcomes(&self, seqs: &[i64], after: Duration, error: &str) -> StoreResult<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        let ids = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into());
        self.execute(
            "retry_outcomes",
            D::SQL.retry_outcomes,
            &[Arg::Text(&ids), Arg::I64(ms(after)), Arg::Text(error)],
        )
        .await
        .map(|_| ())
    }

    async fn outbox_backlog(&self) -> StoreResult<Vec<OutboxBacklog>> {
        let rows = self
            .fetch("count_outcomes", D::SQL.count_outcomes, &[])
            .await?;
        rows.iter()
            .map(|r| {
                Ok(OutboxBacklog {
                    consumer: r.text("consumer")?,
                    unsent: r.i64("n")?,
                    oldest_unsent_age_s: r.opt_i64("oldest_ms")?.map(|ms| ms as f64 / 1000.0),
                })
            })
            .collect()
    }

    async fn prune(&self, keep: Duration, batch: u32, dry_run: bool) -> StoreResult<PruneResult> {
        let sql = &D::SQL;
        if dry_run {
            return Ok(PruneResult {
                deleted: self
                    .scalar_count("prune_count", sql.prune_count, keep)
                    .await?,
                dead_letters_deleted: self
                    .scalar_count(
                        "prune_dead_letters_count",
                        sql.prune_dead_letters_count,
                        keep,
                    )
                    .await?,
                ..Default::default()
            });
        }
        let Some(lock) = self.dialect.retention_lock().await? else {
            return Ok(PruneResult {
                skipped_locked: true,
                ..Default::default()
            });
        };
        let args = [Arg::I64(ms(keep)), Arg::I64(i64::from(batch))];
        let pruned = async {
            let mut result = PruneResult::default();
            // Each batch commits on its own so new claims are never blocked for long.
            loop {
                let n = self.execute("prune_batch", sql.prune_batch, &args).await?;
                result.batches += 1;
                result.deleted += n;
                if n < u64::from(batch) {
                    break;
                }
            }
            loop {
                let n = self
                    .execute("prune_dead_letters", sql.prune_dead_letters, &args)
                    .await?;
                result.dead_letters_deleted += n;
                if n < u64::from(batch) {
                    break;
                }
            }
            // Sent outcome events by the same window (unsent ones stay until they are sent).
            loop {
                let n = self
                    .execute("prune_outcomes", sql.prune_outcomes, &args)
                    .await?;
                if n < u64::from(batch) {
                    break;
                }
            }
            // Provider events by the same window: a re-delivery older than it is refused as
            // stale by its signature's timestamp long before.
            loop {
                let n = self
                    .execute("prune_provider_events", sql.prune_provider_events, &args)
                    .await?;
                if n < u64::from(batch) {
                    return Ok(result);
                }
            }
        }
        .await;
        lock.release().await;
        pruned
    }
}
