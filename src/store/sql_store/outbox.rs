//! [`OutboxStore`] over a dialect: the outcome consumers, a consumer's relay held by one
//! instance, its due events taken, marked sent or given back.

use super::SqlStore;
use crate::store::args::ms;
use crate::store::dialect::{Arg, Dialect, SqlRow};
use crate::store::outbox::{OutcomeConsumers, OutcomeEvent, first_per_claim};
use crate::store::sealing;
use crate::store::{OutboxStore, StoreResult};
use async_trait::async_trait;
use std::time::Duration;

#[async_trait]
impl<D: Dialect> OutboxStore for SqlStore<D> {
    fn set_outcome_destinations(&self, destinations: Vec<(String, String)>) {
        let _ = self.outcomes.set(OutcomeConsumers::new(destinations));
    }

    fn outcome_consumers(&self) -> Vec<String> {
        self.outcomes().names().to_vec()
    }

    fn outcome_destinations(&self) -> Vec<(String, String)> {
        self.outcomes().destinations().to_vec()
    }

    async fn hold_outcome_relay(
        &self,
        consumer: &str,
        destination: &str,
        owner: &str,
        lease: Duration,
    ) -> StoreResult<bool> {
        let held = self
            .fetch(
                "hold_outcome_relay",
                D::SQL.hold_outcome_relay,
                &[
                    Arg::Text(consumer),
                    Arg::Text(owner),
                    Arg::I64(ms(lease)),
                    Arg::Text(destination),
                ],
            )
            .await?;
        Ok(!held.is_empty())
    }

    async fn due_outcomes(
        &self,
        consumer: &str,
        destination: &str,
        limit: u32,
    ) -> StoreResult<Vec<OutcomeEvent>> {
        let rows = self
            .fetch(
                "due_outcomes",
                D::SQL.due_outcomes,
                &[
                    Arg::Text(consumer),
                    Arg::I64(i64::from(limit)),
                    Arg::Text(destination),
                ],
            )
            .await?;
        let mut events = rows.iter().map(event_of).collect::<StoreResult<Vec<_>>>()?;
        events.sort_by_key(|e| e.seq);
        Ok(first_per_claim(events))
    }

    async fn release_outcome_relay(
        &self,
        consumer: &str,
        destination: &str,
        owner: &str,
    ) -> StoreResult<()> {
        self.execute(
            "release_outcome_relay",
            D::SQL.release_outcome_relay,
            &[
                Arg::Text(consumer),
                Arg::Text(owner),
                Arg::Text(destination),
            ],
        )
        .await
        .map(|_| ())
    }

    async fn adopt_outcomes(&self, consumer: &str, destination: &str) -> StoreResult<u64> {
        self.execute(
            "adopt_outcomes",
            D::SQL.adopt_outcomes,
            &[Arg::Text(consumer), Arg::Text(destination)],
        )
        .await
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

    async fn oldest_unsent_outcome(
        &self,
        consumer: &str,
        destination: &str,
    ) -> StoreResult<Option<OutcomeEvent>> {
        let rows = self
            .fetch(
                "oldest_unsent_outcome",
                D::SQL.oldest_unsent_outcome,
                &[Arg::Text(consumer), Arg::Text(destination)],
            )
            .await?;
        rows.first().map(event_of).transpose()
    }

    async fn trace_parents(&self, claim_ids: &[i64]) -> StoreResult<Vec<(i64, String)>> {
        if claim_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = serde_json::to_string(claim_ids).unwrap_or_else(|_| "[]".into());
        let rows = self
            .fetch("trace_parents", D::SQL.trace_parents, &[Arg::Text(&ids)])
            .await?;
        rows.iter()
            .map(|r| Ok((r.i64("id")?, r.text("trace_parent")?)))
            .collect()
    }

    async fn wake_outcomes(&self, consumer: &str, destination: &str) -> StoreResult<u64> {
        self.execute(
            "wake_outcomes",
            D::SQL.wake_outcomes,
            &[Arg::Text(consumer), Arg::Text(destination)],
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
            &[
                Arg::Text(&ids),
                Arg::I64(ms(after)),
                Arg::SealedText(Some(error)),
            ],
        )
        .await
        .map(|_| ())
    }
}

/// An event row as the relay reads it (`outcome_cols!()`).
fn event_of<R: SqlRow>(r: &R) -> StoreResult<OutcomeEvent> {
    let seq = r.i64("id")?;
    let what = || format!("outcome event {seq}");
    Ok(OutcomeEvent {
        seq,
        destination: r.text("destination")?,
        claim_version: r.opt_i64("claim_version")?,
        claim_id: r.i64("claim_id")?,
        consumer: r.text("consumer")?,
        tenant: r.text("tenant")?,
        message_id: r.text("message_id")?,
        key: r.text("idem_key")?,
        state: r.text("state")?,
        attempt: r.i32("attempt")?,
        provider_status: r.opt_i32("provider_status")?,
        provider_id: r.opt_text("provider_id")?,
        provider_response: sealing::open_text(r.opt_text("provider_response")?, &what),
        reason: sealing::open_text(r.opt_text("reason")?, &what),
        actor: r.text("actor")?,
        action: r.text("action")?,
        at_utc: r.time("at_utc")?,
        tries: r.i32("tries")?,
        // Read by `due_outcomes` only; other statements leave it out.
        parent: match (
            r.opt_text("parent_consumer").ok().flatten(),
            r.opt_text("parent_message_id").ok().flatten(),
        ) {
            (Some(consumer), Some(message_id)) => Some(crate::store::outbox::OutcomeParent {
                consumer,
                message_id,
            }),
            _ => None,
        },
    })
}
