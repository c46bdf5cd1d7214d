//! Settling a database effect's attempt: its write and the settle in one transaction
//! ([`EngineStore::settle_applied`](crate::store::EngineStore::settle_applied)). Deadlocks,
//! serialization failures, a busy SQLite and a store that cannot be reached run the whole
//! transaction again, fresh, with backoff, while the lease allows; any other database error
//! rolls back and fails the claim "never applied" (a separate fenced settle). A crash or a
//! lease spent before the commit leaves the claim `started` with nothing applied, which the
//! sweeper performs again.

use super::{AttemptEnd, Settler};
use crate::domain::claim::{Claim, ClaimState};
use crate::engine::consumer::Slot;
use crate::store::Settlement;
use crate::store::db_effect::{DatabaseEffect, DbEffectError, DbRetry, retry_of, store_retry_of};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

impl Settler {
    /// Runs `effect` for `claim` and settles it `completed` in the same transaction, until
    /// `deadline` (the lease's room for work). See the module's description.
    pub async fn apply_and_settle(
        &self,
        slot: &mut Slot,
        claim: &Claim,
        effect: &dyn DatabaseEffect,
        deadline: Instant,
    ) -> AttemptEnd {
        let done = Settlement {
            state: Some(ClaimState::Completed),
            provider_response: Some("applied in the settle's transaction".into()),
            ..Settlement::default()
        };
        let event = crate::store::NewEvent {
            actor: &self.instance,
            action: "apply",
            outcome: "applied",
            provider_status: None,
            detail: None,
        };
        let mut delay = Duration::from_millis(20);
        let mut tries = 0u32;
        loop {
            tries += 1;
            let why = match self
                .store
                .settle_applied(effect, claim, &done, &event)
                .await
            {
                Ok(true) => {
                    self.signals.settled(claim.id);
                    self.metrics
                        .settled(&claim.consumer, ClaimState::Completed.as_str());
                    debug!(tries, "applied and settled in one transaction");
                    return AttemptEnd::Settled(ClaimState::Completed);
                }
                Ok(false) => {
                    info!("claim moved before the database effect committed; nothing applied");
                    return AttemptEnd::Lost;
                }
                Err(DbEffectError::Effect(e)) if retry_of(&e) == DbRetry::Never => {
                    let error = format!("the database refused the effect's write: {e}");
                    let refused = Settlement {
                        state: Some(ClaimState::Failed),
                        error: Some(error),
                        ..Settlement::default()
                    };
                    return self
                        .settle(slot, claim, Some(deadline), refused, "apply", "refused")
                        .await;
                }
                Err(DbEffectError::Store(e)) if store_retry_of(&e) == DbRetry::Never => {
                    warn!(error = %e, "database effect's transaction failed; the sweeper will run it again");
                    return AttemptEnd::LeftStarted(e.to_string());
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() + delay >= deadline {
                warn!(tries, error = %why, "database effect still retried when its lease ran out; left for the sweeper, nothing applied");
                return AttemptEnd::LeftStarted(why);
            }
            debug!(tries, error = %why, "database effect's transaction rolled back; running it again");
            // Jitter: two transactions that deadlocked each other do not meet again in step.
            let jitter = Duration::from_millis(u64::from(tries * 7 + claim.id as u32 % 13));
            tokio::time::sleep(delay + jitter).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }
}
