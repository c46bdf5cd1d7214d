//! `claimd reconcile`: audits claims against the provider's status endpoint and lists where
//! the two disagree, worst first, each with the command that settles it.
//!
//! A found object is read as the call reads it: through the consumer's `[effect.outcome]`
//! table when it has one ([`by_value`]), so a declined or canceled payment is the provider
//! refusing the effect, not having it. Without such a table, found is applied. Claims whose
//! lookup names payload fields are read with their payload. Every claim whose answer decides
//! nothing is listed with why.

use crate::config::{EffectConfig, ValueOutcomes};
use crate::domain::claim::{Claim, ClaimState};
use crate::engine::claimer::Claimer;
use crate::ops::operator_command::{ClaimRef, Note, OperatorCommands};
use crate::provider::effect::Lookup;
use crate::provider::effect::by_value::{self, Verdict};
use crate::provider::effect::http_template::{BodyTemplate, Template};
use crate::store::{ClaimFilter, StoreResult};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::sync::Arc;
use tokio::task::JoinSet;

/// Most claims one audit reads.
pub const AUDIT_LIMIT: u32 = 100_000;

/// Most undecided claims listed (each is counted in `undecided` all the same).
pub const MAX_UNDECIDED_LISTED: usize = 10_000;

/// How local state and provider disagree, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MismatchKind {
    /// `completed` here, unknown to the provider: money may not have moved.
    CompletedUnknownToProvider,
    /// `completed` here, but the provider refused the effect (a declined or canceled
    /// payment): it did not happen.
    CompletedButRefused,
    /// `failed` here, but the provider has the effect.
    FailedButApplied,
    /// `completed` or `failed` here, but the provider has not finished the effect (pending,
    /// or waiting for the customer): it may still end the other way.
    ClosedButNotFinal,
    /// `started` or `needs_attention` here, but the provider has the effect.
    OpenButApplied,
    /// `started` or `needs_attention` here, but the provider refused the effect.
    OpenButRefused,
}

/// What the provider's answer says of the effect, read as the call reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderSays {
    /// Found and done (or found, for a consumer without `[effect.outcome]`).
    Applied,
    /// Found, and its value says the effect will not happen (`failed` values).
    Refused,
    /// Found, not final: `pending` or `needs_attention` values.
    NotFinal,
    /// The provider has no record.
    NotFound,
}

/// Pure: what a lookup's answer says, with a sentence of what the provider said; `Err` with
/// the reason when it decides nothing (no answer, or a value the table does not map).
/// `outcomes` is the consumer's `[effect.outcome]`, `object` where the object is in a found
/// answer (`effect.status.found_pointer`).
pub fn read_lookup(
    outcomes: Option<&ValueOutcomes>,
    object: &str,
    lookup: Option<&Lookup>,
) -> Result<(ProviderSays, String), String> {
    match lookup {
        None => Err("no status endpoint".into()),
        Some(Lookup::Unknown { error }) => Err(error.clone()),
        Some(Lookup::NotFound { status, detail }) => Ok((
            ProviderSays::NotFound,
            format!("not found ({status}): {detail}"),
        )),
        Some(Lookup::Found {
            status,
            response,
            provider_id,
        }) => {
            let found = match provider_id {
                Some(id) => format!("found {id} ({status})"),
                None => format!("found ({status})"),
            };
            let Some(map) = outcomes else {
                return Ok((ProviderSays::Applied, found));
            };
            let reading = by_value::read_body(map, response, object);
            let said = format!("{found}: {}", reading.describe(map));
            match reading.verdict {
                Some(Verdict::Completed) => Ok((ProviderSays::Applied, said)),
                Some(Verdict::Failed) => Ok((ProviderSays::Refused, said)),
                Some(Verdict::Pending | Verdict::NeedsAttention) => {
                    Ok((ProviderSays::NotFinal, said))
                }
                None => Err(said),
            }
        }
    }
}

/// Pure: the mismatch, if any, between a local state and what the provider says. A
/// `pending` claim is its poller's and its provider events' to settle: never a mismatch.
pub fn compare(state: ClaimState, provider: ProviderSays) -> Option<MismatchKind> {
    use ProviderSays as P;
    match (state, provider) {
        (ClaimState::Completed, P::NotFound) => Some(MismatchKind::CompletedUnknownToProvider),
        (ClaimState::Completed, P::Refused) => Some(MismatchKind::CompletedButRefused),
        (ClaimState::Failed, P::Applied) => Some(MismatchKind::FailedButApplied),
        (ClaimState::Completed | ClaimState::Failed, P::NotFinal) => {
            Some(MismatchKind::ClosedButNotFinal)
        }
        (ClaimState::Started | ClaimState::NeedsAttention, P::Applied) => {
            Some(MismatchKind::OpenButApplied)
        }
        (ClaimState::Started | ClaimState::NeedsAttention, P::Refused) => {
            Some(MismatchKind::OpenButRefused)
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
    /// What the provider said (found or not, and the value `[effect.outcome]` read).
    pub provider: String,
    /// What to run.
    pub suggestion: String,
}

/// A claim whose provider answer decided nothing.
#[derive(Debug, Clone, Serialize)]
pub struct Undecided {
    /// Consumer.
    pub consumer: String,
    /// Tenant.
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// Local state.
    pub state: String,
    /// Why: the lookup's error, or the value `[effect.outcome]` does not map.
    pub reason: String,
}

/// The audit's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Audit {
    /// Claims compared with the provider.
    pub checked: u64,
    /// Claims whose provider answer decided nothing.
    pub undecided: u64,
    /// Those claims, each with its reason (at most [`MAX_UNDECIDED_LISTED`]), by consumer and
    /// message id.
    pub undecided_claims: Vec<Undecided>,
    /// Claims the provider did not find, settled less than its `not_found_after` before the
    /// audit: its search may not show them yet, so they are neither checked nor a mismatch.
    pub too_recent: u64,
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

/// Pure: whether a "not found" at database time `now` is too soon after the claim's last call
/// (`last`: its settle, else its current attempt's start) to be trusted, for a provider whose
/// search lags its writes by up to `not_found_after`.
pub fn too_recent(
    last: DateTime<Utc>,
    now: DateTime<Utc>,
    not_found_after: std::time::Duration,
) -> bool {
    (now - last).to_std().unwrap_or_default() < not_found_after
}

/// What to run about a mismatch: the command, from [`OperatorCommands`] (ids and tenants come
/// from clients, so the command quotes them). Only an effect the provider has is ever to be
/// marked completed.
fn suggestion(commands: &OperatorCommands, kind: MismatchKind, c: &Claim) -> String {
    let claim = ClaimRef {
        consumer: &c.consumer,
        tenant: &c.tenant,
        message_id: &c.message_id,
    };
    let sweep = || {
        format!(
            "{} (the sweeper reconciles stuck claims when on_unknown = \"reconcile\")",
            commands.sweep()
        )
    };
    match kind {
        MismatchKind::CompletedUnknownToProvider => format!(
            "investigate with the provider; if the effect never happened: {}, then repair by hand",
            commands.show(claim)
        ),
        MismatchKind::CompletedButRefused => format!(
            "the provider refused it: the effect did not happen although the claim says completed; check with the provider ({}), then repair by hand",
            commands.show(claim)
        ),
        MismatchKind::ClosedButNotFinal => format!(
            "the provider has not finished it and may still end it the other way: check with the provider ({}) and correct the claim when it ends",
            commands.show(claim)
        ),
        MismatchKind::FailedButApplied => commands.resolve(
            claim,
            ClaimState::Completed,
            Note::Text("provider has the effect (reconcile)"),
        ),
        MismatchKind::OpenButApplied if c.state == ClaimState::NeedsAttention => commands.resolve(
            claim,
            ClaimState::Completed,
            Note::Text("provider has the effect (reconcile)"),
        ),
        MismatchKind::OpenButRefused if c.state == ClaimState::NeedsAttention => commands.resolve(
            claim,
            ClaimState::Failed,
            Note::Text("provider refused the effect (reconcile)"),
        ),
        MismatchKind::OpenButApplied | MismatchKind::OpenButRefused => sweep(),
    }
}

/// Whether the consumer's lookup needs the claim's payload: an HTTP effect whose URL, status
/// URL or body names payload fields (the effect then parses the payload for every request);
/// an embedded effect may read it too. The claim listing carries no payload, so those claims
/// are read whole.
fn lookup_needs_payload(effect: &EffectConfig) -> bool {
    match effect {
        EffectConfig::Http(h) => {
            let names_fields = |t: &str| Template::parse(t).is_ok_and(|t| t.needs_payload());
            names_fields(&h.url)
                || names_fields(&h.status_url)
                || h.body_template
                    .as_ref()
                    .and_then(|b| BodyTemplate::parse(b).ok())
                    .is_some_and(|b| b.templates().iter().any(|t| t.needs_payload()))
        }
        EffectConfig::Smtp(_) | EffectConfig::Sql(_) => false,
        EffectConfig::Custom(_) => true,
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
    // Database time, as every age: a worker's clock may drift.
    let now = claimer.store().now().await?;
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
        let needs_payload = lookup_needs_payload(&consumer.config.effect);
        for claim in claims {
            let consumer = consumer.clone();
            let limit = limit.clone();
            let store = claimer.store().clone();
            jobs.spawn(async move {
                let _permit = limit.acquire_owned().await;
                // The listing carries no payload; the claim is read whole (as `claims show`
                // reads it) when the lookup is built from its fields.
                if needs_payload && claim.erased_utc.is_some() {
                    let why = String::from(
                        "the claim's payload was erased, and this consumer's status lookup is built from payload fields: check it at the provider by its key",
                    );
                    return (claim, Err(why));
                }
                let claim = if needs_payload {
                    match store
                        .find(&claim.consumer, &claim.tenant, &claim.message_id)
                        .await
                    {
                        Ok(Some(full)) => full,
                        Ok(None) => {
                            let why =
                                String::from("the claim is gone since it was listed (retention)");
                            return (claim, Err(why));
                        }
                        Err(e) => {
                            let why = format!("the claim's payload could not be read: {e}");
                            return (claim, Err(why));
                        }
                    }
                } else {
                    claim
                };
                let lookup = consumer.effect.lookup(&claim).await;
                let said = read_lookup(
                    consumer.effect.outcomes(),
                    consumer.effect.lookup_object(),
                    lookup.as_ref(),
                );
                let last = claim.processed_utc.unwrap_or(claim.started_utc);
                let lagging = too_recent(last, now, consumer.effect.not_found_after());
                (claim, said.map(|(p, s)| (p, s, lagging)))
            });
        }
    }
    while let Some(joined) = jobs.join_next().await {
        let Ok((claim, said)) = joined else {
            continue;
        };
        let (provider, said) = match said {
            // Not found yet, by a search that may lag: no verdict either way.
            Ok((ProviderSays::NotFound, _, true)) => {
                result.too_recent += 1;
                continue;
            }
            Ok((p, s, _)) => (p, s),
            Err(reason) => {
                result.undecided += 1;
                if result.undecided_claims.len() < MAX_UNDECIDED_LISTED {
                    result.undecided_claims.push(Undecided {
                        consumer: claim.consumer,
                        tenant: claim.tenant,
                        message_id: claim.message_id,
                        state: claim.state.as_str().to_string(),
                        reason,
                    });
                }
                continue;
            }
        };
        result.checked += 1;
        if let Some(kind) = compare(claim.state, provider) {
            result.mismatches.push(Mismatch {
                kind,
                suggestion: suggestion(commands, kind, &claim),
                provider: said,
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
    result
        .undecided_claims
        .sort_by(|a, b| (&a.consumer, &a.message_id).cmp(&(&b.consumer, &b.message_id)));
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_flags_each_disagreement() {
        use ProviderSays as P;
        assert_eq!(
            compare(ClaimState::Completed, P::NotFound),
            Some(MismatchKind::CompletedUnknownToProvider)
        );
        assert_eq!(compare(ClaimState::Completed, P::Applied), None);
        assert_eq!(
            compare(ClaimState::Completed, P::Refused),
            Some(MismatchKind::CompletedButRefused)
        );
        assert_eq!(
            compare(ClaimState::Failed, P::Applied),
            Some(MismatchKind::FailedButApplied)
        );
        assert_eq!(compare(ClaimState::Failed, P::NotFound), None);
        assert_eq!(compare(ClaimState::Failed, P::Refused), None);
        assert_eq!(
            compare(ClaimState::Failed, P::NotFinal),
            Some(MismatchKind::ClosedButNotFinal)
        );
        assert_eq!(
            compare(ClaimState::Started, P::Applied),
            Some(MismatchKind::OpenButApplied)
        );
        assert_eq!(compare(ClaimState::Started, P::NotFound), None);
        assert_eq!(
            compare(ClaimState::NeedsAttention, P::Applied),
            Some(MismatchKind::OpenButApplied)
        );
        assert_eq!(
            compare(ClaimState::NeedsAttention, P::Refused),
            Some(MismatchKind::OpenButRefused)
        );
        assert_eq!(compare(ClaimState::NeedsAttention, P::NotFinal), None);
        for p in [P::Applied, P::Refused, P::NotFinal, P::NotFound] {
            assert_eq!(compare(ClaimState::Pending, p), None, "{p:?}");
        }
        assert!(MismatchKind::CompletedUnknownToProvider < MismatchKind::CompletedButRefused);
        assert!(MismatchKind::CompletedButRefused < MismatchKind::OpenButApplied);
    }

    fn stripe() -> ValueOutcomes {
        ValueOutcomes {
            pointer: "/status".into(),
            completed: vec!["succeeded".into()],
            pending: vec!["processing".into()],
            needs_attention: vec!["requires_action".into()],
            failed: vec!["requires_payment_method".into(), "canceled".into()],
            id_pointer: "/id".into(),
            reason_pointer: "/last_payment_error/message".into(),
            ..Default::default()
        }
    }

    fn found(body: &str) -> Lookup {
        Lookup::Found {
            status: 200,
            response: body.into(),
            provider_id: Some("pi_1".into()),
        }
    }

    #[test]
    fn a_found_object_is_read_by_its_value_when_the_consumer_reads_outcomes_by_value() {
        let map = stripe();
        let read = |status: &str| {
            let body = format!(r#"{{"data":[{{"id":"pi_1","status":"{status}"}}]}}"#);
            read_lookup(Some(&map), "/data/0", Some(&found(&body)))
        };
        assert_eq!(read("succeeded").unwrap().0, ProviderSays::Applied);
        for refused in ["requires_payment_method", "canceled"] {
            let (says, said) = read(refused).unwrap();
            assert_eq!(says, ProviderSays::Refused, "{refused}");
            assert!(said.contains(refused) && said.contains("pi_1"), "{said}");
        }
        assert_eq!(read("processing").unwrap().0, ProviderSays::NotFinal);
        assert_eq!(read("requires_action").unwrap().0, ProviderSays::NotFinal);
        let why = read("requires_confirmation").unwrap_err();
        assert!(
            why.contains("requires_confirmation") && why.contains("does not map"),
            "{why}"
        );
        let why = read_lookup(Some(&map), "/data/0", Some(&found("<html>"))).unwrap_err();
        assert!(why.contains("unknown"), "{why}");
    }

    #[test]
    fn without_an_outcome_table_found_is_applied_and_no_answer_is_undecided_with_why() {
        let body = r#"{"status":"requires_payment_method"}"#;
        assert_eq!(
            read_lookup(None, "", Some(&found(body))).unwrap().0,
            ProviderSays::Applied
        );
        let not_found = Lookup::NotFound {
            status: 404,
            detail: "404".into(),
        };
        assert_eq!(
            read_lookup(None, "", Some(&not_found)).unwrap().0,
            ProviderSays::NotFound
        );
        let down = Lookup::Unknown {
            error: "status endpoint: connection refused".into(),
        };
        assert_eq!(
            read_lookup(Some(&stripe()), "", Some(&down)).unwrap_err(),
            "status endpoint: connection refused"
        );
    }

    #[test]
    fn a_lookup_built_from_payload_fields_needs_the_payload() {
        let http = |status_url: &str, body: Option<serde_json::Value>| {
            let mut config = serde_json::json!({
                "url": "https://p.example/v1/pay",
                "status_url": status_url,
            });
            if let Some(b) = body {
                config["body_template"] = b;
            }
            EffectConfig::Http(serde_json::from_value(config).unwrap())
        };
        assert!(!lookup_needs_payload(&http(
            "https://p.example/s/{key}",
            None
        )));
        assert!(lookup_needs_payload(&http(
            "https://p.example/s/{order}",
            None
        )));
        assert!(lookup_needs_payload(&http(
            "https://p.example/s/{key}",
            Some(serde_json::json!({"amount": "{amount}", "k": "{key}"}))
        )));
    }

    #[test]
    fn a_not_found_is_trusted_only_not_found_after_the_settle() {
        let now = Utc::now();
        let lag = std::time::Duration::from_secs(30);
        let settled = now - chrono::Duration::seconds(2);
        assert!(too_recent(settled, now, lag));
        assert!(!too_recent(settled, now, std::time::Duration::ZERO));
        assert!(!too_recent(now - chrono::Duration::seconds(31), now, lag));
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
