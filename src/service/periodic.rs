//! The task of `claimd run` that submits the slots of `[[schedules]]` (docs/schedules.md):
//! it wakes at each schedule's next slot (at least every [`WAKE_AT_LEAST_EVERY`]), and at
//! each wake [`Periodic::tick`] claims what is pending. Started only when schedules are
//! configured; ends at stop.

use crate::config::ScheduleConfig;
use crate::engine::claimer::Claimer;
use crate::engine::periodic::Periodic;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch::Receiver;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// The longest sleep between ticks: a failed tick is tried again after it, and a slot comes
/// at most this late when the store's clock runs ahead of this instance's.
pub const WAKE_AT_LEAST_EVERY: Duration = Duration::from_secs(1);

/// Starts the task, or nothing without schedules.
pub fn start(
    claimer: Arc<Claimer>,
    schedules: &[ScheduleConfig],
    mut stop: Receiver<bool>,
) -> Option<JoinHandle<()>> {
    if schedules.is_empty() {
        return None;
    }
    let schedules = schedules.to_vec();
    Some(tokio::spawn(async move {
        let mut periodic = loop {
            match Periodic::start(claimer.clone(), &schedules).await {
                Ok(p) => break p,
                Err(e) => warn!(error = %e, "schedules: cannot start yet; trying again"),
            }
            tokio::select! {
                _ = tokio::time::sleep(WAKE_AT_LEAST_EVERY) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        };
        info!(schedules = schedules.len(), "schedules watched");
        // One line per schedule and kind of failure while it lasts, not one per second.
        let mut failing: std::collections::BTreeSet<String> = Default::default();
        loop {
            if *stop.borrow() {
                return;
            }
            let errors = periodic.tick().await;
            let now_failing: std::collections::BTreeSet<String> =
                errors.iter().map(|e| e.to_string()).collect();
            for e in now_failing.difference(&failing) {
                warn!("schedules: {e}; trying again");
            }
            failing = now_failing;
            let wait = if failing.is_empty() {
                periodic
                    .next_due()
                    .and_then(|at| (at - chrono::Utc::now()).to_std().ok())
                    .unwrap_or_default()
                    .min(WAKE_AT_LEAST_EVERY)
            } else {
                WAKE_AT_LEAST_EVERY
            };
            tokio::select! {
                // A little past the slot: the store's clock decides, and it may lag ours.
                _ = tokio::time::sleep(wait + Duration::from_millis(20)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }))
}
