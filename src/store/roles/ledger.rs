//! What `claimd reconcile --ledger` reads and keeps: a consumer's claims in key order, and
//! each consumer's last run.

use crate::store::{LedgerClaim, LedgerRunRecord, StoreResult};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

/// The ledger reconciliation's part of the store, used by `ledger` (and its summaries read
/// back by `report`, the operator page and `/metrics`).
#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// Claims of `consumer` received in `[from, to)`, in key order (byte order, then id)
    /// after the keyset position `after` (`("", 0)` for the first page), at most `limit`.
    async fn ledger_claims(
        &self,
        consumer: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        after: (&str, i64),
        limit: u32,
    ) -> StoreResult<Vec<LedgerClaim>>;

    /// Keeps `consumer`'s last ledger run's summary (JSON), replacing the one before.
    async fn save_ledger_run(&self, consumer: &str, summary: &str) -> StoreResult<()>;

    /// Every consumer's last ledger run.
    async fn ledger_runs(&self) -> StoreResult<Vec<LedgerRunRecord>>;
}
