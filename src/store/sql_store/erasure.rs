//! Erasure over a dialect: one finished claim's payload, provider answer and error blanked
//! with its history line ([`OperatorStore::erase`](crate::store::OperatorStore::erase)), and
//! the claims a consumer's payload retention makes due
//! ([`EngineStore::erase_due`](crate::store::EngineStore::erase_due)).

use super::SqlStore;
use crate::domain::claim::Claim;
use crate::store::args::ms;
use crate::store::dialect::{Arg, Dialect, LoggedWrite, SqlRow};
use crate::store::rows::claim_from_row;
use crate::store::{NewEvent, StoreResult};
use std::time::Duration;

impl<D: Dialect> SqlStore<D> {
    /// Erases claim `id` when it is finished and not erased yet, writing `event` as its
    /// history line in the same transaction; `None`: nothing changed (no such claim, open,
    /// or erased already).
    pub(crate) async fn erase_one(
        &self,
        id: i64,
        event: &NewEvent<'_>,
    ) -> StoreResult<Option<Claim>> {
        let args = [Arg::I64(id)];
        let write = LoggedWrite {
            name: "erase_claim",
            sql: D::SQL.erase_claim,
            args: &args,
            event,
            outcomes: None,
            follow_ups: &[],
        };
        match self.dialect.update_logged(write).await? {
            Some(row) => Ok(Some(claim_from_row(&row)?)),
            None => Ok(None),
        }
    }

    /// Erases `consumer`'s finished claims last changed more than `keep` ago, `batch` at a
    /// time (each claim in its own transaction with its history line), until none is left;
    /// returns how many it erased.
    pub(crate) async fn erase_due_claims(
        &self,
        consumer: &str,
        keep: Duration,
        batch: u32,
    ) -> StoreResult<u64> {
        let detail = format!("payload retention ({}s)", keep.as_secs());
        let event = NewEvent {
            actor: "retention",
            action: "erase",
            outcome: "erased",
            provider_status: None,
            detail: Some(&detail),
        };
        let limit = i64::from(batch.max(1));
        let batch_args = [
            Arg::Text(consumer),
            Arg::I64(ms(keep)),
            Arg::I64(limit),
            Arg::Text(&detail),
        ];
        // One statement per batch where the dialect has one (PostgreSQL).
        if let Some(first) = self.dialect.erase_due_batch(&batch_args).await {
            let (mut erased, mut n) = (0, first?);
            loop {
                erased += n;
                if n < limit as u64 {
                    return Ok(erased);
                }
                n = match self.dialect.erase_due_batch(&batch_args).await {
                    Some(next) => next?,
                    None => 0,
                };
            }
        }
        let mut erased = 0;
        loop {
            let rows = self
                .fetch(
                    "erase_due",
                    D::SQL.erase_due,
                    &[
                        Arg::Text(consumer),
                        Arg::I64(ms(keep)),
                        Arg::I64(i64::from(batch.max(1))),
                    ],
                )
                .await?;
            for row in &rows {
                if self.erase_one(row.i64("id")?, &event).await?.is_some() {
                    erased += 1;
                }
            }
            if rows.len() < batch.max(1) as usize {
                return Ok(erased);
            }
        }
    }
}
