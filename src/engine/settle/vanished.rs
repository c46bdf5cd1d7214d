//! A claim that vanished from the store while this instance held it. With asynchronous
//! replication, a failover to a standby can lose claims the old primary had committed, and
//! claimd had acknowledged and was performing: the fenced settle then finds no row. Before a
//! settle that changed nothing is taken for a claim that moved, the settler asks the store
//! whether a row of the claim's key exists ([`EngineStore::locate_claim`]). When one does
//! (taken over, settled by an event, a poll or an operator, or created again by a re-sent
//! message), nothing changes. When none does, the claim vanished: an ERROR with its ids,
//! `claimd_claims_vanished_total`, and the claim is written back with what this instance holds
//! (its key, payload, attempt and the outcome it got) and a `restore` history line
//! ([`EngineStore::restore_claim`]), so the provider's effect is not orphaned; a row of its key
//! created meanwhile is never overwritten.
//!
//! [`EngineStore::locate_claim`]: crate::store::EngineStore::locate_claim
//! [`EngineStore::restore_claim`]: crate::store::EngineStore::restore_claim

use super::Settler;
use crate::domain::claim::{Claim, ClaimState};
use crate::store::{NewEvent, Settlement};
use std::time::Duration;
use tracing::{error, warn};

/// What a fenced write that changed nothing found in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whereabouts {
    /// A row of the claim's key exists, under this id: the claim moved. Also when the store
    /// could not be asked (nothing is decided on an error), and when the claim's row was lost
    /// and a re-sent message created it again under a new id (counted as vanished, left as it
    /// is).
    Moved(i64),
    /// The claim vanished and was written back under this id.
    Restored(i64),
    /// The claim vanished and was not written back: a row of its key appeared meanwhile,
    /// this instance does not hold its payload, or the store refused the write (logged).
    Lost,
}

/// Tries of a write-back before it is given up (the store may still be failing over).
const RESTORE_TRIES: u32 = 5;

impl Settler {
    /// After a fenced write of `claim` changed nothing: where the claim is; when it vanished,
    /// the alarm (an ERROR, the metric) and the write-back in `state` with what `s` says. See
    /// the module's description.
    pub async fn locate_or_restore(
        &self,
        claim: &Claim,
        s: &Settlement,
        state: ClaimState,
    ) -> Whereabouts {
        match self
            .store
            .locate_claim(&claim.consumer, &claim.tenant, &claim.message_id)
            .await
        {
            Ok(Some((id, _))) if id == claim.id => return Whereabouts::Moved(id),
            Ok(Some((id, state))) => {
                // Its row was lost and a re-sent message created the claim again: it is
                // performed with the same key, and is left as it is.
                self.metrics.vanished.vanished(&claim.consumer);
                error!(
                    claim_id = claim.id,
                    consumer = %claim.consumer,
                    tenant = %claim.tenant,
                    message_id = %claim.message_id,
                    idem_key = %claim.idem_key,
                    attempt = claim.attempt,
                    created_again_id = id,
                    created_again_state = %state,
                    "claim vanished from the store while this instance held it (the store lost acknowledged data: a failover?); a re-sent message created it again, which is left as it is"
                );
                return Whereabouts::Moved(id);
            }
            Ok(None) => {}
            Err(e) => {
                warn!(error = %e, "could not check whether the claim is still in the store");
                return Whereabouts::Moved(claim.id);
            }
        }
        self.metrics.vanished.vanished(&claim.consumer);
        error!(
            claim_id = claim.id,
            consumer = %claim.consumer,
            tenant = %claim.tenant,
            message_id = %claim.message_id,
            idem_key = %claim.idem_key,
            attempt = claim.attempt,
            outcome = %state,
            "claim vanished from the store while this instance held it (the store lost acknowledged data: a failover?); writing it back"
        );
        if !crate::store::sealing::fingerprint_matches(&claim.fingerprint, &claim.payload) {
            error!(
                claim_id = claim.id,
                message_id = %claim.message_id,
                "the vanished claim's payload is not held here; it is not written back: find it with `claimd reconcile --ledger`"
            );
            return Whereabouts::Lost;
        }
        let detail = restore_detail(claim.id, claim.attempt, s, state, &self.instance);
        let event = NewEvent {
            actor: &self.instance,
            action: "restore",
            outcome: state.as_str(),
            provider_status: s.provider_status,
            detail: Some(&detail),
        };
        let mut delay = Duration::from_millis(200);
        for tries in 1..=RESTORE_TRIES {
            match self.store.restore_claim(claim, s, state, &event).await {
                Ok(Some(id)) => {
                    error!(
                        claim_id = id,
                        vanished_id = claim.id,
                        message_id = %claim.message_id,
                        state = %state,
                        "vanished claim written back"
                    );
                    self.signals.settled(claim.id);
                    if state != ClaimState::Started {
                        self.metrics.settled(&claim.consumer, state.as_str());
                    }
                    return Whereabouts::Restored(id);
                }
                Ok(None) => {
                    warn!(
                        vanished_id = claim.id,
                        message_id = %claim.message_id,
                        "the vanished claim was not written back: a claim of its key was created again meanwhile (a re-sent message); that claim is left as it is"
                    );
                    return Whereabouts::Lost;
                }
                Err(e) if tries < RESTORE_TRIES => {
                    warn!(error = %e, tries, "could not write the vanished claim back; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => {
                    error!(
                        error = %e,
                        vanished_id = claim.id,
                        message_id = %claim.message_id,
                        idem_key = %claim.idem_key,
                        "could not write the vanished claim back; find it with `claimd reconcile --ledger`"
                    );
                }
            }
        }
        Whereabouts::Lost
    }
}

/// The detail of a write-back's history line: which claim vanished, who held it, and the
/// outcome it is written back with.
fn restore_detail(
    id: i64,
    attempt: i32,
    s: &Settlement,
    state: ClaimState,
    instance: &str,
) -> String {
    let mut what = match state {
        ClaimState::Started => "left started for the sweeper".to_string(),
        state => state.as_str().to_string(),
    };
    if let Some(status) = s.provider_status {
        what.push_str(&format!(" ({status})"));
    }
    if let Some(text) = s.error.as_deref() {
        what.push_str(": ");
        what.push_str(&crate::store::truncate(text, 1024));
    }
    format!(
        "restored after it vanished from the store: claim {id} (attempt {attempt}), held by {instance}, which got: {what}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restore_line_says_what_vanished_and_what_it_is_written_back_with() {
        let s = super::super::completed(200, "{}".into(), false);
        let d = restore_detail(42, 2, &s, ClaimState::Completed, "host-1");
        assert_eq!(
            d,
            "restored after it vanished from the store: claim 42 (attempt 2), held by host-1, which got: completed (200)"
        );
        let left = Settlement {
            error: Some("provider answered 503".into()),
            ..Default::default()
        };
        let d = restore_detail(42, 2, &left, ClaimState::Started, "host-1");
        assert!(
            d.ends_with("which got: left started for the sweeper: provider answered 503"),
            "{d}"
        );
    }
}
