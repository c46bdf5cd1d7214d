//! [`LedgerStore`] over a dialect: claims in key order for `reconcile --ledger`, and each
//! consumer's last run.

use super::SqlStore;
use crate::domain::claim::ClaimState;
use crate::store::dialect::{Arg, Dialect, SqlRow};
use crate::store::{LedgerClaim, LedgerRunRecord, LedgerStore, StoreError, StoreResult};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::str::FromStr;

#[async_trait]
impl<D: Dialect> LedgerStore for SqlStore<D> {
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
                let id = r.i64("id")?;
                let what = || format!("claim {id}");
                Ok(LedgerClaim {
                    id,
                    tenant: r.text("tenant")?,
                    message_id: r.text("message_id")?,
                    idem_key: r.text("idem_key")?,
                    state: ClaimState::from_str(&r.text("state")?)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                    received_utc: r.time("received_utc")?,
                    payload: crate::store::sealing::open_bytes(r.bytes_or_empty("payload"), &what),
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
}
