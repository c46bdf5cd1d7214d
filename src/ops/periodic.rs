//! The configured `[[schedules]]` as operators see them (`claimd schedules`, the operator
//! page): each with its last slot (from the store) and its next slot.

use crate::config::{Config, parse_schedule_cron};
use crate::domain::periodic;
use crate::store::{ClaimStore, StoreResult};
use chrono::{DateTime, Utc};
use serde::Serialize;

/// One schedule, with its slots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduleView {
    /// Name.
    pub name: String,
    /// Cron expression (UTC).
    pub cron: String,
    /// The consumer its messages go to.
    pub consumer: String,
    /// Their tenant (empty: none).
    pub tenant: String,
    /// `all`, `latest` or `none`.
    pub catch_up: String,
    /// The last slot submitted (or passed by catch_up); `None`: no instance has run it yet.
    pub last_slot_utc: Option<DateTime<Utc>>,
    /// The next slot to come after `now`.
    pub next_slot_utc: Option<DateTime<Utc>>,
    /// A slot after the last one fell due more than [`BEHIND_AFTER_S`] seconds ago and is not
    /// claimed yet: no instance runs the schedule, or its submits fail (the log says why).
    pub behind: bool,
}

/// How late a slot may be before its schedule shows as behind.
pub const BEHIND_AFTER_S: i64 = 60;

/// The configured schedules in configuration order, with their slots as of `now`.
pub async fn list(
    store: &dyn ClaimStore,
    config: &Config,
    now: DateTime<Utc>,
) -> StoreResult<Vec<ScheduleView>> {
    if config.schedules.is_empty() {
        return Ok(Vec::new());
    }
    let rows = store.schedule_slots().await?;
    Ok(config
        .schedules
        .iter()
        .map(|s| {
            let cron = parse_schedule_cron(&s.cron).ok();
            let last_slot_utc = rows
                .iter()
                .find(|r| r.name == s.name)
                .map(|r| r.last_slot_utc);
            let behind = match (&cron, last_slot_utc) {
                (Some(c), Some(last)) => periodic::next_slot(c, last)
                    .is_some_and(|n| n < now - chrono::Duration::seconds(BEHIND_AFTER_S)),
                _ => false,
            };
            ScheduleView {
                name: s.name.clone(),
                cron: s.cron.clone(),
                consumer: s.consumer.clone(),
                tenant: s.tenant.clone(),
                catch_up: s.catch_up.as_str().to_string(),
                last_slot_utc,
                next_slot_utc: cron.and_then(|c| periodic::next_slot(&c, now)),
                behind,
            }
        })
        .collect())
}
