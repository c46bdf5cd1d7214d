//! [`EngineStore`] over a dialect: fenced settles (alone, in a batch, from a state a reader
//! saw), the markers and counts of a call, takeovers of stale and pending claims, retention.

use super::SqlStore;
use crate::domain::claim::{Claim, ClaimState};
use crate::store::args::{key_args, ms, restore_args, settle_args, settle_from_args};
use crate::store::dialect::{Arg, Dialect, LoggedWrite, SqlRow, event_args};
use crate::store::enqueue::Registration;
use crate::store::outbox::emits;
use crate::store::rows::{taken_from_row, taken_with_priority};
use crate::store::{
    EngineStore, NewEvent, PruneResult, RetentionWindows, SettleItem, Settlement, StoreError,
    StoreResult, TakenClaim, WaitingOrder,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::time::Duration;
use tracing::instrument;

impl<D: Dialect> SqlStore<D> {
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

    /// A take that leases claims to `owner` without a takeover (pending polls, enqueued
    /// claims): consumer, limit, owner, lease ms.
    async fn take_leased(
        &self,
        name: &'static str,
        sql: &'static str,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
    ) -> StoreResult<Vec<TakenClaim>> {
        let args = [
            Arg::Text(consumer),
            Arg::I64(i64::from(limit)),
            Arg::Text(owner),
            Arg::I64(ms(lease)),
        ];
        let rows = self.fetch(name, sql, &args).await?;
        rows.iter().map(|r| taken_from_row(r, 0)).collect()
    }

    /// One fenced settle with its history line (I2).
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
            .update_logged(self.settle_write(
                "settle",
                &args,
                event,
                emits(ClaimState::Started, s.state),
                &s.follow_ups,
            ))
            .await?;
        Ok(changed.is_some())
    }

    /// A settle's write: the statement with the outbox's part when it writes an outcome event
    /// (the move `emits` one and some consumer gets events), else the plain one, whose fence
    /// and history line are the same.
    fn settle_write<'a>(
        &'a self,
        name: &'static str,
        args: &'a [Arg<'a>],
        event: &'a NewEvent<'a>,
        emits: bool,
        follow_ups: &'a [crate::store::FollowUpClaim],
    ) -> LoggedWrite<'a> {
        let outcomes = self.outcomes().writes(emits);
        LoggedWrite {
            name,
            sql: if outcomes.is_some() {
                D::SQL.settle
            } else {
                D::SQL.settle_plain
            },
            args,
            event,
            outcomes,
            follow_ups,
        }
    }
}

#[async_trait]
impl<D: Dialect> EngineStore for SqlStore<D> {
    async fn settle_applied(
        &self,
        effect: &dyn crate::store::db_effect::DatabaseEffect,
        claim: &crate::domain::claim::Claim,
        s: &Settlement,
        event: &NewEvent<'_>,
        timeout: Duration,
    ) -> Result<bool, crate::store::db_effect::DbEffectError> {
        let args = settle_args(claim.id, claim.attempt, s);
        let write = self.settle_write(
            "settle_applied",
            &args,
            event,
            emits(ClaimState::Started, s.state),
            &s.follow_ups,
        );
        self.dialect
            .update_logged_after(effect, claim, write, timeout)
            .await
    }

    #[instrument(skip_all, fields(claim_id = id, attempt))]
    async fn settle(
        &self,
        id: i64,
        attempt: i32,
        s: &Settlement,
        event: &NewEvent<'_>,
    ) -> StoreResult<bool> {
        // A settle with follow-ups writes them in its own transaction, never batched.
        if s.follow_ups.is_empty()
            && let Some(b) = &self.batch
            && let Some(answer) = b.settle(id, attempt, s, event).await
        {
            return answer;
        }
        self.settle_one(id, attempt, s, event).await
    }

    async fn settle_many(&self, items: &[SettleItem<'_>]) -> StoreResult<Vec<bool>> {
        if (items.len() > 1 || D::BATCH_SINGLES)
            && items.iter().all(|i| i.settlement.follow_ups.is_empty())
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
            .update_logged(self.settle_write(
                "settle_from",
                &args,
                event,
                emits(from, s.state),
                &s.follow_ups,
            ))
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

    async fn locate_claim(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<(i64, ClaimState)>> {
        let args = key_args(consumer, tenant, message_id);
        let rows = self
            .fetch("locate_claim", D::SQL.locate_claim, &args)
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state: ClaimState = row
            .text("state")?
            .parse()
            .map_err(|e: crate::domain::claim::UnknownState| StoreError::Corrupt(e.to_string()))?;
        Ok(Some((row.i64("id")?, state)))
    }

    async fn restore_claim(
        &self,
        claim: &Claim,
        s: &Settlement,
        state: ClaimState,
        event: &NewEvent<'_>,
    ) -> StoreResult<Option<i64>> {
        let args = restore_args(claim, s, state, event.actor);
        let outcomes = self
            .outcomes()
            .bound(emits(ClaimState::Started, Some(state)));
        let write = LoggedWrite {
            name: "restore_claim",
            sql: D::SQL.restore_claim,
            args: &args,
            event,
            outcomes: Some(outcomes),
            follow_ups: &s.follow_ups,
        };
        match self.dialect.update_logged(write).await? {
            Some(row) => Ok(Some(row.i64("id")?)),
            None => Ok(None),
        }
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

    #[instrument(skip(self))]
    async fn take_stale(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        expired_before: DateTime<Utc>,
        hold: bool,
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
                    Arg::Bool(hold),
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
        let sql = D::SQL.take_pending;
        self.take_leased("take_pending", sql, consumer, limit, owner, lease)
            .await
    }

    async fn take_enqueued(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        clear_marker_within: Option<Duration>,
        aged: u32,
    ) -> StoreResult<Vec<TakenClaim>> {
        let args = [
            Arg::Text(consumer),
            Arg::I64(i64::from(limit)),
            Arg::Text(owner),
            Arg::I64(ms(lease)),
            Arg::I64(clear_marker_within.map_or(-1, ms)),
            Arg::I64(i64::from(aged.min(limit))),
        ];
        let rows = self
            .fetch("take_enqueued", D::SQL.take_enqueued, &args)
            .await?;
        let taken = rows
            .iter()
            .map(taken_with_priority)
            .collect::<StoreResult<Vec<_>>>()?;
        // The producer's transaction has no key: its row was written in clear. Sealed now,
        // when claimd takes it (docs/producers.md, "Encryption at rest").
        if crate::store::sealing::keyring().is_some() {
            for t in &taken {
                if let Err(e) = crate::store::SealStore::seal_claim(self, t.claim.id).await {
                    tracing::warn!(claim_id = t.claim.id, error = %e, "enqueued claim not sealed yet; `claimd keys rotate` seals it");
                }
            }
        }
        Ok(taken)
    }

    #[instrument(skip(self))]
    async fn take_waiting(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        order: &WaitingOrder,
        clear_marker_within: Option<Duration>,
    ) -> StoreResult<Vec<TakenClaim>> {
        let weights = order.weights_json();
        let mut args = vec![
            Arg::Text(consumer),
            Arg::I64(i64::from(limit)),
            Arg::Text(owner),
            Arg::I64(ms(lease)),
            Arg::Bool(order.lines.unwrap_or(true)),
            Arg::Bool(order.lines.is_some()),
        ];
        // `clear_marker_within`: $7 of take_ordered (then the aged share, $8), $8 of take_fair.
        let (name, sql) = if order.fair.is_some() {
            args.push(Arg::Text(&weights));
            ("take_fair", D::SQL.take_fair)
        } else {
            ("take_ordered", D::SQL.take_ordered)
        };
        args.push(Arg::I64(clear_marker_within.map_or(-1, ms)));
        if order.fair.is_none() {
            args.push(Arg::I64(i64::from(order.aged.min(limit))));
        }
        let rows = if order.lines.is_some() {
            self.dialect.fetch_alone(consumer, name, sql, &args).await?
        } else {
            self.fetch(name, sql, &args).await?
        };
        rows.iter()
            .map(|r| {
                let mut taken = taken_with_priority(r)?;
                taken.went_ahead_of = r.opt_text("went_ahead_of")?;
                Ok(taken)
            })
            .collect()
    }

    #[instrument(skip(self))]
    async fn take_stale_fair(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        expired_before: DateTime<Utc>,
        order: &WaitingOrder,
    ) -> StoreResult<Vec<TakenClaim>> {
        let weights = order.weights_json();
        let rows = self
            .fetch(
                "take_stale_fair",
                D::SQL.take_stale_fair,
                &[
                    Arg::Text(consumer),
                    Arg::I64(i64::from(limit)),
                    Arg::Text(owner),
                    Arg::I64(ms(lease)),
                    Arg::Time(expired_before),
                    Arg::Text(&weights),
                    Arg::Bool(order.lines.unwrap_or(true)),
                ],
            )
            .await?;
        rows.iter().map(|r| taken_from_row(r, 0)).collect()
    }

    async fn register_consumer(&self, c: &Registration) -> StoreResult<()> {
        self.execute(
            "register_consumer",
            D::SQL.register_consumer,
            &[
                Arg::Text(&c.name),
                Arg::Text(&c.key_template),
                Arg::I32(i32::try_from(c.max_key_length).unwrap_or(i32::MAX)),
                Arg::Bool(c.keys_tenant),
                Arg::I64(i64::try_from(c.max_payload_bytes).unwrap_or(i64::MAX)),
                Arg::Bool(c.ordered),
                Arg::Text(&c.url_segments),
                Arg::I64(c.generation),
                Arg::Text(&c.effect_kind),
            ],
        )
        .await
        .map(|_| ())
    }

    async fn registered_consumer(
        &self,
        consumer: &str,
    ) -> StoreResult<Option<crate::domain::generation::ConsumerGeneration>> {
        let rows = self
            .fetch(
                "registered_consumer",
                D::SQL.registered_consumer,
                &[Arg::Text(consumer)],
            )
            .await?;
        rows.first()
            .map(|r| {
                Ok(crate::domain::generation::ConsumerGeneration {
                    generation: r.i64("generation")?,
                    effect_kind: r.text("effect_kind")?,
                })
            })
            .transpose()
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

    async fn erase_due(&self, consumer: &str, keep: Duration, batch: u32) -> StoreResult<u64> {
        self.erase_due_claims(consumer, keep, batch).await
    }

    async fn erase_due_count(&self, consumer: &str, keep: Duration) -> StoreResult<u64> {
        let args = [Arg::Text(consumer), Arg::I64(ms(keep))];
        let rows = self
            .fetch("erase_due_count", D::SQL.erase_due_count, &args)
            .await?;
        let n = rows.first().map(|r| r.i64("n")).transpose()?;
        Ok(n.unwrap_or(0).max(0) as u64)
    }

    async fn prune(
        &self,
        windows: &RetentionWindows,
        batch: u32,
        dry_run: bool,
    ) -> StoreResult<PruneResult> {
        self.prune_windows(windows, batch, dry_run).await
    }
}
