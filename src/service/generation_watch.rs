//! Rolling upgrades: an instance takes no claim of a consumer whose configuration it does not
//! have. Each instance registers its consumers' configuration generation and effect kind
//! ([`crate::domain::generation`]); a registration never lowers them. At start, and every
//! [`CHECK_EVERY`] after, an instance reads them back: when another instance registered a
//! newer generation (or another effect kind at the same one), this one says so and stops,
//! as on SIGTERM, so its orchestrator replaces it with the newer configuration.

use crate::domain::generation::{ConsumerGeneration, Standing, standing};
use crate::engine::claimer::Claimer;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch::{Receiver, Sender};
use tokio::task::JoinHandle;
use tracing::{error, warn};

/// How often a running instance reads the registered generations back.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// This instance's configuration of each of its consumers: (name, generation, effect kind).
pub fn own(claimer: &Claimer) -> Vec<(String, ConsumerGeneration)> {
    claimer
        .consumers()
        .map(|c| {
            (
                c.name().to_string(),
                ConsumerGeneration {
                    generation: i64::from(c.config.generation),
                    effect_kind: c.config.effect.kind().to_string(),
                },
            )
        })
        .collect()
}

/// The first consumer this instance is behind on, as a sentence; `None` when it is current
/// on every one. A registry that cannot be read is not a reason to stop (it is said).
pub async fn behind(claimer: &Claimer) -> Option<String> {
    for (name, here) in own(claimer) {
        match claimer.store().registered_consumer(&name).await {
            Ok(registered) => {
                let s = standing(&here, registered.as_ref());
                if s != Standing::Current {
                    return s.sentence(&name);
                }
            }
            Err(e) => {
                warn!(consumer = %name, error = %e, "cannot read the registered configuration generation")
            }
        }
    }
    None
}

/// Reads the registry every [`CHECK_EVERY`] until `stop`; the first time this instance is
/// behind, sends the sentence on `superseded` and ends.
pub fn watch(
    claimer: Arc<Claimer>,
    mut stop: Receiver<bool>,
    superseded: Sender<Option<String>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(CHECK_EVERY) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if let Some(why) = behind(&claimer).await {
                error!("stopping: {why}");
                let _ = superseded.send(Some(why));
                return;
            }
        }
    })
}
