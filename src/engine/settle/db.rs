//! Settling a database effect's attempt: its write and the settle in one transaction
//! ([`EngineStore::settle_applied`](crate::store::EngineStore::settle_applied)), cut after
//! `effect.timeout`. Deadlocks, serialization failures, a busy SQLite, a lost connection, a
//! server shutting down or read-only, a transaction past its timeout and a store that cannot
//! be reached run the whole transaction again, fresh, with backoff, while the lease allows
//! (I13: nothing is decided on a lost connection); then the claim is handed to the sweeper
//! with the reason, nothing applied. Any other database error, or a payload the statement
//! cannot take, rolls back and fails the claim "never applied" (a separate fenced settle). A
//! crash before the commit leaves the claim `started` with nothing applied, which the sweeper
//! performs again.

use super::{AttemptEnd, Settler};
use crate::domain::claim::{Claim, ClaimState, Handoff};
use crate::engine::consumer::Slot;
use crate::engine::policy::wait_backoff;
use crate::store::db_effect::{
    DatabaseEffect, DbEffectError, DbRetry, lost_connection, retry_of, store_retry_of,
};
use crate::store::{NewEvent, Settlement, driver_words};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

impl Settler {
    /// Runs `effect` for `claim` and settles it `completed` in the same transaction, each
    /// run cut after `timeout` (`effect.timeout`), until `deadline` (the lease's room for
    /// work). See the module's description.
    pub async fn apply_and_settle(
        &self,
        slot: &mut Slot,
        claim: &Claim,
        effect: &dyn DatabaseEffect,
        deadline: Instant,
        timeout: Duration,
    ) -> AttemptEnd {
        let mut done = Settlement {
            state: Some(ClaimState::Completed),
            provider_response: Some("applied in the settle's transaction".into()),
            ..Settlement::default()
        };
        done.follow_ups = self.follow_ups.children(claim, &done);
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
            let (why, no_connection) = match self
                .store
                .settle_applied(effect, claim, &done, &event, timeout)
                .await
            {
                Ok(true) => {
                    self.follow_ups.ring(&done);
                    self.signals.settled(claim.id);
                    self.metrics
                        .settled(&claim.consumer, ClaimState::Completed.as_str());
                    debug!(tries, "applied and settled in one transaction");
                    return AttemptEnd::Settled(ClaimState::Completed);
                }
                Ok(false) => {
                    return self
                        .not_applied_moved(
                            claim,
                            "claim moved before the database effect committed; nothing applied",
                        )
                        .await;
                }
                Err(DbEffectError::Effect(e)) if retry_of(&e) == DbRetry::Never => {
                    let error = match &e {
                        // The claim itself cannot be applied (a payload field missing).
                        sqlx::Error::InvalidArgument(why) => format!(
                            "the effect's statement cannot run for this claim: {why}; nothing was applied"
                        ),
                        e => format!(
                            "the database refused the effect's write: {}",
                            driver_words(e)
                        ),
                    };
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
                Err(e) => (e.to_string(), lost_connection(&e)),
            };
            if Instant::now() + delay >= deadline {
                warn!(tries, error = %why, "database effect still retried when its lease ran out; left for the sweeper, nothing applied");
                return self.rolled_back(slot, claim, &why, no_connection).await;
            }
            debug!(tries, error = %why, "database effect's transaction rolled back; running it again");
            // Jitter: two transactions that deadlocked each other do not meet again in step.
            let jitter = Duration::from_millis(u64::from(tries * 7 + claim.id as u32 % 13));
            tokio::time::sleep(delay + jitter).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// A database effect's settle that found its claim moved, nothing applied: left alone
    /// when the claim is in the store (logging `moved`); written back `started` for the
    /// sweeper (nothing applied) when it vanished ([`Settler::locate_or_restore`]).
    async fn not_applied_moved(&self, claim: &Claim, moved: &str) -> AttemptEnd {
        let s = Settlement {
            error: Some("the database effect was not applied: its claim vanished".into()),
            handoff: Some(Handoff::NotApplied),
            ..Settlement::default()
        };
        match self.locate_or_restore(claim, &s, ClaimState::Started).await {
            super::Whereabouts::Restored(_) => AttemptEnd::LeftStarted(s.error.unwrap_or_default()),
            _ => {
                info!("{moved}");
                AttemptEnd::Lost
            }
        }
    }

    /// Hands a claim whose transactions all rolled back to the sweeper at once, with the
    /// last reason in its history. Nothing was applied, so the sweeper runs it again; the
    /// attempt counts towards `max_attempts`, unless the last run failed for want of a
    /// working connection (none free in the pool, the server gone or read-only): that
    /// decided nothing (I13) and is a wait, taken again after a backoff.
    async fn rolled_back(
        &self,
        slot: &mut Slot,
        claim: &Claim,
        why: &str,
        no_connection: bool,
    ) -> AttemptEnd {
        let (how, lease_for, outcome) = if no_connection {
            let backoff = wait_backoff(claim.waits, Duration::from_secs(30));
            (Some(Handoff::NotApplied), backoff, "waiting")
        } else {
            (None, Duration::ZERO, "rolled_back")
        };
        let s = Settlement {
            error: Some(super::storable(why).into_owned()),
            handoff: how,
            lease_for: Some(lease_for),
            ..Settlement::default()
        };
        slot.release_for_settle();
        let event = NewEvent {
            actor: &self.instance,
            action: "apply",
            outcome,
            provider_status: None,
            detail: s.error.as_deref(),
        };
        match self.store.settle(claim.id, claim.attempt, &s, &event).await {
            Ok(true) => AttemptEnd::LeftStarted(why.to_string()),
            Ok(false) => {
                self.not_applied_moved(
                    claim,
                    "claim moved before the database effect's hand-off; left it alone",
                )
                .await
            }
            Err(e) => {
                warn!(error = %e, "could not hand the database effect back; its lease will expire");
                AttemptEnd::LeftStarted(why.to_string())
            }
        }
    }
}
