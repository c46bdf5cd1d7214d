//! Cancelling a scheduled send before its time (docs/flow-control.md), for `POST
//! /v1/claims/{consumer}/{message_id}/cancel` and `claimd claims cancel`. A scheduled claim is
//! `started` at attempt 0 until the sweeper takes it at its time (attempt 1), so the cancel is
//! the fenced settle of attempt 0: it and the sweeper's take cannot both succeed.

use crate::domain::claim::{Claim, ClaimState};
use crate::store::{NewEvent, Settlement, Store, StoreError};

/// Why a cancel did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    /// No such claim.
    #[error("no claim {consumer}/{message_id} (tenant {tenant:?})")]
    NotFound {
        /// Consumer.
        consumer: String,
        /// Tenant.
        tenant: String,
        /// Message id.
        message_id: String,
    },
    /// The claim was never scheduled, or its time came and it was taken.
    #[error("{0}")]
    TooLate(String),
    /// The store failed; nothing changed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a claim that is not (or no longer) scheduled cannot be cancelled.
fn too_late(claim: &Claim) -> CancelError {
    CancelError::TooLate(if claim.not_before.is_none() {
        format!(
            "{}/{} is not a scheduled send (it is {}); only a claim sent with Not-Before can be cancelled, until its time",
            claim.consumer, claim.message_id, claim.state
        )
    } else {
        format!(
            "{}/{} started at {} (attempt {}, now {}): too late to cancel",
            claim.consumer,
            claim.message_id,
            claim.started_utc.to_rfc3339(),
            claim.attempt.max(1),
            claim.state
        )
    })
}

/// Cancels the scheduled claim: `failed`, with the reason and who cancelled it in its
/// history (and its outcome event, for a consumer that sends them). Returns the claim after.
pub async fn cancel(
    store: &Store,
    consumer: &str,
    tenant: &str,
    message_id: &str,
    actor: &str,
    reason: &str,
) -> Result<Claim, CancelError> {
    let not_found = || CancelError::NotFound {
        consumer: consumer.into(),
        tenant: tenant.into(),
        message_id: message_id.into(),
    };
    let claim = store
        .get(consumer, tenant, message_id)
        .await?
        .ok_or_else(not_found)?;
    if !claim.is_scheduled() {
        return Err(too_late(&claim));
    }
    let detail = format!("cancelled before its scheduled time by {actor}: {reason}");
    let settled = Settlement {
        state: Some(ClaimState::Failed),
        error: Some(detail.clone()),
        ..Default::default()
    };
    let event = NewEvent {
        actor,
        action: "cancel",
        outcome: "cancelled",
        provider_status: None,
        detail: Some(&detail),
    };
    let changed = store.settle(claim.id, 0, &settled, &event).await?;
    let after = store
        .get(consumer, tenant, message_id)
        .await?
        .ok_or_else(not_found)?;
    if changed {
        Ok(after)
    } else {
        Err(too_late(&after))
    }
}
