//! What the report, `/metrics`, `/readyz` and `claimd reconcile` read: counts per consumer,
//! open work, the sweeper's last pass, each instance's view of a provider, the outbox's
//! backlog and the provider events no claim matched.

use crate::store::outbox::OutboxBacklog;
use crate::store::{ConsumerCounts, DestinationRecord, StoreResult, UnmatchedEvent};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

/// The reports' part of the store: reads only, used by `report`, `metrics`, the health and
/// readiness handlers (`http::ops`), the outcome relay's metrics and `reconcile`.
#[async_trait]
pub trait ReportStore: Send + Sync {
    /// Per-consumer counts, over claims received (and messages dead-lettered) since `since`
    /// (all when `None`).
    async fn counts(&self, since: Option<DateTime<Utc>>) -> StoreResult<Vec<ConsumerCounts>>;

    /// Open work per consumer over the whole table (`started`, stuck, `needs_attention`,
    /// oldest started age); the other fields stay zero. Cheap: partial indexes.
    async fn open_counts(&self) -> StoreResult<Vec<ConsumerCounts>>;

    /// When the last sweeper pass (any instance) ended.
    async fn last_sweep(&self) -> StoreResult<Option<DateTime<Utc>>>;

    /// Every instance's latest view of each consumer's provider.
    async fn destinations(&self) -> StoreResult<Vec<DestinationRecord>>;

    /// Unsent outcome events per consumer, with the oldest one's age.
    async fn outbox_backlog(&self) -> StoreResult<Vec<OutboxBacklog>>;

    /// Provider events about objects claimd has no claim for, received since `since` (all
    /// when `None`), newest first, at most `limit`.
    async fn unmatched_provider_events(
        &self,
        since: Option<DateTime<Utc>>,
        limit: u32,
    ) -> StoreResult<Vec<UnmatchedEvent>>;
}
