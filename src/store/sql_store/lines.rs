//! [`LineStore`] over a dialect.

use super::SqlStore;
use crate::domain::claim::Claim;
use crate::store::dialect::{Arg, Dialect, SqlRow};
use crate::store::rows::claim_from_row;
use crate::store::{LineHead, LineStore, StoreResult};
use async_trait::async_trait;
use std::collections::BTreeMap;

impl<D: Dialect> SqlStore<D> {
    /// The line statements' arguments: the claim's consumer, tenant, order key and id.
    async fn line_rows(
        &self,
        name: &'static str,
        sql: &'static str,
        claim: &Claim,
        key: &str,
    ) -> StoreResult<Vec<D::Row>> {
        let args = [
            Arg::Text(&claim.consumer),
            Arg::Text(&claim.tenant),
            Arg::Text(key),
            Arg::I64(claim.id),
        ];
        self.fetch(name, sql, &args).await
    }
}

#[async_trait]
impl<D: Dialect> LineStore for SqlStore<D> {
    async fn line_head(&self, claim: &Claim) -> StoreResult<Option<LineHead>> {
        let Some(key) = &claim.order_key else {
            return Ok(None);
        };
        let rows = self
            .line_rows("line_head", D::SQL.line_head, claim, key)
            .await?;
        rows.first()
            .map(|r| {
                Ok(LineHead {
                    message_id: r.text("message_id")?,
                    state: r.text("state")?,
                    attempt: r.i32("attempt")?,
                })
            })
            .transpose()
    }

    async fn behind_in_line(&self, claim: &Claim) -> StoreResult<i64> {
        let Some(key) = &claim.order_key else {
            return Ok(0);
        };
        let rows = self
            .line_rows("behind_in_line", D::SQL.behind_in_line, claim, key)
            .await?;
        rows.first().map(|r| r.i64("n")).unwrap_or(Ok(0))
    }

    async fn release_due_to_line(&self, consumer: &str, limit: u32) -> StoreResult<Vec<Claim>> {
        let args = [Arg::Text(consumer), Arg::I64(i64::from(limit))];
        let rows = self
            .fetch("release_due_to_line", D::SQL.release_due_to_line, &args)
            .await?;
        rows.iter().map(claim_from_row).collect()
    }

    async fn in_line(&self) -> StoreResult<BTreeMap<String, i64>> {
        let rows = self.fetch("in_line", D::SQL.in_line, &[]).await?;
        rows.iter()
            .map(|r| Ok((r.text("consumer")?, r.i64("n")?)))
            .collect()
    }
}
