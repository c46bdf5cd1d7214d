//! What periodic effects (`[[schedules]]`, docs/schedules.md) keep in the store: each
//! schedule's last slot submitted (or passed by `catch_up`), shared by every instance and kept
//! across restarts. Never derived from claims: retention deletes those.

use crate::store::StoreResult;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// A schedule's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduleSlot {
    /// The schedule's name.
    pub name: String,
    /// Its last slot submitted or passed.
    pub last_slot_utc: DateTime<Utc>,
    /// When the row last changed.
    pub updated_utc: DateTime<Utc>,
}

/// The schedules' part of the store.
#[async_trait]
pub trait ScheduleStore: Send + Sync {
    /// Starts schedule `name` at `start` (its slots are those after it) unless it was started
    /// before, by this instance or another; returns its last slot either way.
    async fn start_schedule(&self, name: &str, start: DateTime<Utc>) -> StoreResult<DateTime<Utc>>;

    /// Moves the last slot of `name` forward to `slot`; an older `slot` changes nothing.
    async fn advance_schedule(&self, name: &str, slot: DateTime<Utc>) -> StoreResult<()>;

    /// Every schedule's row, by name.
    async fn schedule_slots(&self) -> StoreResult<Vec<ScheduleSlot>>;
}
