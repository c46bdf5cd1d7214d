//! [`ReportStore`] over a dialect: counts, open work, the sweeper's heartbeat, the
//! destinations' views, the outbox backlog and unmatched provider events.

use super::SqlStore;
use crate::domain::claim::ClaimState;
use crate::store::dialect::{Arg, Dialect, SqlRow};
use crate::store::outbox::OutboxBacklog;
use crate::store::{
    ConsumerCounts, CountsByConsumer, DestinationRecord, ReportStore, StoreResult, UnmatchedEvent,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[async_trait]
impl<D: Dialect> ReportStore for SqlStore<D> {
    async fn counts(&self, since: Option<DateTime<Utc>>) -> StoreResult<Vec<ConsumerCounts>> {
        let since = since.unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
        let mut by = CountsByConsumer::default();
        let rows = self
            .dialect
            .fetch_count("count_window", D::SQL.count_window, &[Arg::Time(since)])
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
        let rows = self
            .dialect
            .fetch_count("count_open", D::SQL.count_open, &[])
            .await?;
        for r in &rows {
            let state = r.text("state")?;
            let n = r.i64("n")?;
            let c = by.get(r.text("consumer")?);
            if state == ClaimState::Started.as_str() {
                c.started = n;
                c.stuck = r.opt_i64("stuck")?.unwrap_or(0);
                c.waiting = r.opt_i64("waiting")?.unwrap_or(0);
                c.in_line = r.opt_i64("in_line")?.unwrap_or(0);
                c.scheduled = r.opt_i64("scheduled")?.unwrap_or(0);
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

    async fn last_sweep(&self) -> StoreResult<Option<DateTime<Utc>>> {
        let rows = self.fetch("last_sweep", D::SQL.last_sweep, &[]).await?;
        rows.first().map(|r| r.time("at_utc")).transpose()
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

    async fn outbox_backlog(&self) -> StoreResult<Vec<OutboxBacklog>> {
        let rows = self
            .fetch("count_outcomes", D::SQL.count_outcomes, &[])
            .await?;
        rows.iter()
            .map(|r| {
                Ok(OutboxBacklog {
                    consumer: r.text("consumer")?,
                    destination: r.text("destination")?,
                    unsent: r.i64("n")?,
                    oldest_unsent_age_s: r.opt_i64("oldest_ms")?.map(|ms| ms as f64 / 1000.0),
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
}
