//! What `claimd run` says about the store's replication (docs/postgresql.md, "Replication:
//! when an acknowledged claim can be lost"): at start it reads the PostgreSQL primary's
//! settings ([`crate::store::replication`]), logs in plain words when an acknowledged claim can
//! be lost (WARN) and refuses to start when `[store] require_synchronous_standby` is set and the
//! replication is not synchronous ([`check_at_start`]); while it runs it reads them again every
//! [`REFRESH_EVERY`] ([`watch`]), so that `/metrics`, `/readyz` and intake follow a change.
//! SQLite has no replication: nothing is read or said.

use crate::engine::claimer::Claimer;
use crate::store::StoreError;
use crate::store::replication::{DOCS, Replication, ReplicationMode, classify};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch::Receiver;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

/// How often a running worker reads the replication settings again.
pub const REFRESH_EVERY: Duration = Duration::from_secs(60);

/// How often it reads them while intake refuses messages for want of a synchronous standby
/// (so that intake takes them again soon after the standby is back).
pub const REFRESH_WHILE_REFUSING: Duration = Duration::from_secs(5);

/// Why `claimd run` does not start, `[store] require_synchronous_standby` being set.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The replication is not synchronous.
    #[error(
        "[store] require_synchronous_standby is set and {0}; claimd does not start: name a synchronous standby in synchronous_standby_names, with synchronous_commit = on, remote_write or remote_apply, or set require_synchronous_standby = false"
    )]
    NotSynchronous(String),
    /// The settings could not be read.
    #[error(
        "[store] require_synchronous_standby is set and the store's replication settings cannot be read: {0}"
    )]
    Unreadable(StoreError),
}

/// Reads the settings once and records them in the claimer's watch. `Ok(None)`: the store has
/// no replication (SQLite).
async fn read(claimer: &Claimer) -> Result<Option<Replication>, StoreError> {
    let Some(settings) = claimer.store().replication().await? else {
        return Ok(None);
    };
    let r = classify(&settings);
    claimer.replication().set(r.clone());
    Ok(Some(r))
}

/// Says what a reading means: INFO when no acknowledged claim can be lost, WARN otherwise.
fn say(r: &Replication) {
    if r.can_lose_acknowledged() {
        warn!(replication = r.mode.as_str(), "{}", r.describe());
    } else {
        info!(replication = r.mode.as_str(), "{}", r.describe());
    }
}

/// The start-up check (see the module).
pub async fn check_at_start(claimer: &Claimer) -> Result<(), Refusal> {
    let required = claimer.replication().required();
    match read(claimer).await {
        Ok(None) => Ok(()),
        Ok(Some(r)) if required && r.mode != ReplicationMode::Synchronous => {
            Err(Refusal::NotSynchronous(r.describe()))
        }
        Ok(Some(r)) => {
            say(&r);
            Ok(())
        }
        Err(e) if required => Err(Refusal::Unreadable(e)),
        Err(e) => {
            warn!(
                error = %e,
                "the store's replication settings cannot be read: whether acknowledged claims are on a standby is unknown (see {DOCS})"
            );
            Ok(())
        }
    }
}

/// Reads the settings every [`REFRESH_EVERY`] (every [`REFRESH_WHILE_REFUSING`] while intake
/// refuses) until `stop`, saying each change of mode. `None` for a store without replication.
pub fn watch(claimer: Arc<Claimer>, mut stop: Receiver<bool>) -> Option<JoinHandle<()>> {
    if claimer.store().dialect() != "postgres" {
        return None;
    }
    Some(tokio::spawn(async move {
        loop {
            let wait = if claimer.replication().refusal().is_some() {
                REFRESH_WHILE_REFUSING
            } else {
                REFRESH_EVERY
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            refresh(&claimer).await;
        }
    }))
}

/// One reading of a running worker: records it, and says it when the mode changed (ERROR
/// when intake now refuses messages).
pub async fn refresh(claimer: &Claimer) {
    let before = claimer.replication().get().map(|r| r.mode);
    match read(claimer).await {
        Ok(Some(r)) if before != Some(r.mode) => {
            if let Some(why) = claimer.replication().refusal() {
                error!(
                    replication = r.mode.as_str(),
                    "intake refuses new messages: {why}"
                );
            } else {
                say(&r);
            }
        }
        Ok(_) => {}
        Err(e) => warn!(error = %e, "the store's replication settings cannot be read"),
    }
}
