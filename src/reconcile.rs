//! `claimd reconcile`: audits claims against the provider's status endpoint and lists where
//! the two disagree, worst first, each with the command that settles it.

use crate::claim::{Claim, ClaimState};
use crate::claimer::Claimer;
use crate::effect::Lookup;
use crate::operator_command::{ClaimRef, Note, OperatorCommands};
use crate::store::{ClaimFilter, StoreResult};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::sync::Arc;
use tokio::task::JoinSet;

/// Most claims one audit reads.
pub const AUDIT_LIMIT: u32 = 100_000;

/// How local state and provider disagree, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MismatchKind {
    /// `completed` here, unknown to the provider: money may not have moved.
    CompletedUnknownToProvider,
    /// `failed` here, but the provider has the effect.
    FailedButApplied,
    /// `started` or `needs_attention` here, but the provider has the effect.
    OpenButApplied,
}

/// Pure: the mismatch, if any, between a local state and whether the provider has the effect.
pub fn compare(state: ClaimState, provider_has_it: bool) -> Option<MismatchKind> {
    match (state, provider_has_it) {
        (ClaimState::Completed, false) => Some(MismatchKind::CompletedUnknownToProvider),
        (ClaimState::Failed, true) => Some(MismatchKind::FailedButApplied),
        (ClaimState::Started | ClaimState::NeedsAttention, true) => {
            Some(MismatchKind::OpenButApplied)
        }
        _ => None,
    }
}

/// One disagreement.
#[derive(Debug, Clone, Serialize)]
pub struct Mismatch {
    /// Kind, which orders the list.
    pub kind: MismatchKind,
    /// Consumer.
    pub consumer: String,
    /// Tenant.
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// Local state.
    pub state: String,
    /// What to run.
    pub suggestion: String,
}

/// The audit's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Audit {
    /// Claims compared with the provider.
    pub checked: u64,
    /// Claims whose provider answer was neither found nor not-found.
    pub undecided: u64,
    /// Consumers without a status endpoint (not auditable).
    pub skipped_consumers: Vec<String>,
    /// The read hit [`AUDIT_LIMIT`]; narrow the window.
    pub truncated: bool,
    /// Disagreements, worst first.
    pub mismatches: Vec<Mismatch>,
    /// Provider events (webhooks) about objects claimd has no claim for, newest first: an
    /// effect made outside claimd, or a claim retention deleted.
    pub unmatched_events: Vec<crate::store::UnmatchedEvent>,
}

impl Audit {
    /// Whether claims were read and none could be decided (every lookup unknown: the
    /// provider down or its answers unreadable). `claimd reconcile` exits 1 then: an audit that
    /// checked nothing is not a clean audit.
    pub fn nothing_decided(&self) -> bool {
        self.checked == 0 && self.undecided > 0
    }
}

/// What to run about a mismatch: the command, from [`OperatorCommands`] (ids and tenants come
/// from clients, so the command quotes them).
fn suggestion(commands: &OperatorCommands, kind: MismatchKind, c: &Claim) -> String {
    let claim = ClaimRef {
        consumer: &c.consumer,
        tenant: &c.tenant,
        message_id: &c.message_id,
    };
    let resolve = || {
        commands.resolve(
            claim,
            ClaimState::Completed,
            Note::Text("provider has the effect (reconcile)"),
        )
    };
    match (kind, c.state) {
        (MismatchKind::CompletedUnknownToProvider, _) => format!(
            "investigate with the provider; if the effect never happened: {}, then repair by hand",
            commands.show(claim)
        ),
        (MismatchKind::FailedButApplied, _) | (_, ClaimState::NeedsAttention) => resolve(),
        _ => format!(
            "{} (the sweeper reconciles stuck claims when on_unknown = \"reconcile\")",
            commands.sweep()
        ),
    }
}

/// Audits claims received since `since` (of `only`, or every consumer); each mismatch comes
/// with a command written by `commands`.
pub async fn audit(
    claimer: &Arc<Claimer>,
    commands: &OperatorCommands,
    only: Option<&str>,
    since: Option<DateTime<Utc>>,
) -> StoreResult<Audit> {
    let mut result = Audit::default();
    let mut jobs = JoinSet::new();
    let limit = Arc::new(tokio::sync::Semaphore::new(16));
    for consumer in claimer.consumers() {
        if only.is_some_and(|o| o != consumer.name()) {
            continue;
        }
        if !consumer.effect.can_reconcile() {
            result.skipped_consumers.push(consumer.name().to_string());
            continue;
        }
        let claims = claimer
            .store()
            .list(&ClaimFilter {
                consumer: Some(consumer.name().to_string()),
                since,
                limit: AUDIT_LIMIT,
                ..Default::default()
            })
            .await?;
        result.truncated |= claims.len() as u32 >= AUDIT_LIMIT;
        for claim in claims {
            let consumer = consumer.clone();
            let limit = limit.clone();
            jobs.spawn(async move {
                let _permit = limit.acquire_owned().await;
                let lookup = consumer.effect.lookup(&claim).await;
                (claim, lookup)
            });
        }
    }
    while let Some(joined) = jobs.join_next().await {
        let Ok((claim, lookup)) = joined else {
            continue;
        };
        let has_it = match lookup {
            Some(Lookup::Found { .. }) => true,
            Some(Lookup::NotFound { .. }) => false,
            _ => {
                result.undecided += 1;
                continue;
            }
        };
        result.checked += 1;
        if let Some(kind) = compare(claim.state, has_it) {
            result.mismatches.push(Mismatch {
                kind,
                suggestion: suggestion(commands, kind, &claim),
                consumer: claim.consumer,
                tenant: claim.tenant,
                message_id: claim.message_id,
                state: claim.state.as_str().to_string(),
            });
        }
    }
    result.unmatched_events = claimer
        .store()
        .unmatched_provider_events(since, AUDIT_LIMIT)
        .await?
        .into_iter()
        .filter(|e| only.is_none_or(|o| o == e.consumer))
        .collect();
    result.mismatches.sort_by(|a, b| {
        (a.kind, &a.consumer, &a.message_id).cmp(&(b.kind, &b.consumer, &b.message_id))
    });
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_flags_each_disagreement() {
        assert_eq!(
            compare(ClaimState::Completed, false),
            Some(MismatchKind::CompletedUnknownToProvider)
        );
        assert_eq!(compare(ClaimState::Completed, true), None);
        assert_eq!(
            compare(ClaimState::Failed, true),
            Some(MismatchKind::FailedButApplied)
        );
        assert_eq!(compare(ClaimState::Failed, false), None);
        assert_eq!(
            compare(ClaimState::Started, true),
            Some(MismatchKind::OpenButApplied)
        );
        assert_eq!(compare(ClaimState::Started, false), None);
        assert_eq!(
            compare(ClaimState::NeedsAttention, true),
            Some(MismatchKind::OpenButApplied)
        );
        assert!(MismatchKind::CompletedUnknownToProvider < MismatchKind::OpenButApplied);
    }

    #[test]
    fn an_audit_that_decided_nothing_is_a_failure_to_check() {
        let audit = |checked, undecided| Audit {
            checked,
            undecided,
            ..Default::default()
        };
        assert!(audit(0, 10_031).nothing_decided());
        assert!(!audit(1, 10_030).nothing_decided(), "some were checked");
        assert!(
            !audit(0, 0).nothing_decided(),
            "nothing to check is not a failure"
        );
    }
}
