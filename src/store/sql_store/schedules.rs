//! [`ScheduleStore`] over a dialect.

use super::SqlStore;
use crate::store::dialect::{Arg, Dialect, SqlRow};
use crate::store::roles::ScheduleSlot;
use crate::store::{ScheduleStore, StoreError, StoreResult};
use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[async_trait]
impl<D: Dialect> ScheduleStore for SqlStore<D> {
    async fn start_schedule(&self, name: &str, start: DateTime<Utc>) -> StoreResult<DateTime<Utc>> {
        let args = [Arg::Text(name), Arg::Time(start)];
        self.execute("schedule_start", D::SQL.schedule_start, &args)
            .await?;
        self.schedule_slots()
            .await?
            .into_iter()
            .find(|s| s.name == name)
            .map(|s| s.last_slot_utc)
            .ok_or_else(|| StoreError::Corrupt(format!("schedule {name:?} has no row")))
    }

    async fn advance_schedule(&self, name: &str, slot: DateTime<Utc>) -> StoreResult<()> {
        let args = [Arg::Text(name), Arg::Time(slot)];
        self.execute("schedule_advance", D::SQL.schedule_advance, &args)
            .await?;
        Ok(())
    }

    async fn schedule_slots(&self) -> StoreResult<Vec<ScheduleSlot>> {
        let rows = self
            .fetch("schedule_slots", D::SQL.schedule_slots, &[])
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ScheduleSlot {
                    name: r.text("name")?,
                    last_slot_utc: r.time("last_slot_utc")?,
                    updated_utc: r.time("updated_utc")?,
                })
            })
            .collect()
    }
}
