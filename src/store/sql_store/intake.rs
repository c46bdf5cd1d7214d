//! [`IntakeStore`] over a dialect: a claim committed alone (or with others, through the
//! group commit), a repeat counted by the unique key, dead letters and provider events.

use super::SqlStore;
use crate::domain::claim::{Claim, NewClaim};
use crate::store::args::{created, insert_args, key_args, repeat_args, repeat_outcome};
use crate::store::dialect::{Arg, Dialect, SqlRow};
use crate::store::rows::claim_from_row;
use crate::store::{ClaimOutcome, IntakeStore, ProviderEventRecord, StoreError, StoreResult};
use async_trait::async_trait;
use tracing::instrument;

impl<D: Dialect> SqlStore<D> {
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
}

#[async_trait]
impl<D: Dialect> IntakeStore for SqlStore<D> {
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

    async fn record_dead_letter(
        &self,
        consumer: &str,
        reason: &str,
        message_id: Option<&str>,
    ) -> StoreResult<()> {
        let printable = message_id.map(crate::store::printable_id);
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
}
