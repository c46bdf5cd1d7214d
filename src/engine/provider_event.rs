//! Receiving one provider event (`POST /v1/provider-events/{consumer}`): verified
//! ([`signature`](crate::provider::provider_events::signature)), matched to the claim it may be about (by the provider's
//! object id, else by the key or message id the object carries in its metadata), applied only
//! if it names that claim ([`names`], invariant I9), and then as [`on_event`] says with the
//! same fenced settle as every other transition. The answer tells the provider whether to
//! deliver it again: `2xx` once the event is taken (also for an object claimd has no claim
//! for, or one that only looks like a claim's, which is recorded and listed, and for a
//! repeat), `400`/`401` for an event that is not the provider's (nothing changed), `503` when
//! the store could not record it (the provider's retry brings it back).

use crate::config::{ProviderEventsConfig, ValueOutcomes};
use crate::domain::claim::{Claim, ClaimState};
use crate::engine::claimer::{Claimer, Consumer};
use crate::engine::settle::{by_reading, park};
use crate::provider::effect::by_value::{self, Reading};
use crate::provider::provider_events::decide::{Contradiction, EventMove, on_event};
use crate::provider::provider_events::evidence::{Carried, ClaimSide, Naming, names};
use crate::provider::provider_events::signature::{Scheme, SignatureError};
use crate::store::{ClaimFilter, ProviderEventRecord, StoreError, truncate};
use axum::http::HeaderMap;
use serde::Serialize;
use serde_json::Value;
use tracing::{info, warn};

/// What the provider is answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Answer {
    /// HTTP status.
    #[serde(skip)]
    pub status: u16,
    /// What came of the event: `settled`, `same`, `stale`, `conflict`, `unmapped`,
    /// `duplicate`, `ignored`, `unknown_object`, `foreign_object`, `other_object`; or,
    /// refused, why.
    pub result: String,
    /// The claim it was applied to, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimRef>,
}

/// The claim an event was applied to, as the answer names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimRef {
    /// Tenant.
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// Its state after the event.
    pub state: ClaimState,
}

impl Answer {
    fn taken(result: &str, claim: Option<ClaimRef>) -> Answer {
        Answer {
            status: 200,
            result: result.to_string(),
            claim,
        }
    }

    fn refused(status: u16, why: String) -> Answer {
        Answer {
            status,
            result: why,
            claim: None,
        }
    }
}

/// How many times an event is applied again after its claim moved meanwhile (a poll, the
/// worker's own settle, another delivery of an event).
const RETRIES: usize = 3;

/// Receives one delivery for `consumer`, `now_unix` being the current time.
pub async fn receive(
    claimer: &Claimer,
    consumer: &Consumer,
    headers: &HeaderMap,
    body: &[u8],
    now_unix: i64,
) -> Answer {
    let name = consumer.name();
    let metrics = claimer.metrics();
    let (Some(events), Some(map)) = (
        consumer.provider_events.as_deref(),
        consumer.effect.outcomes(),
    ) else {
        return Answer::refused(
            404,
            format!("consumer {name} takes no provider events ([consumers.provider_events])"),
        );
    };
    let verified = match events.verifier.verify(headers, body, now_unix) {
        Ok(v) => v,
        Err(e) => {
            metrics.provider_event(name, refusal(&e));
            return Answer::refused(e.status(), format!("refused: {e}; nothing changed"));
        }
    };
    let cfg = &events.config;
    let Ok(event) = serde_json::from_slice::<Value>(body) else {
        metrics.provider_event(name, "malformed");
        return Answer::refused(
            400,
            "refused: the event is not JSON; nothing changed".into(),
        );
    };
    let text = |pointer: &str| -> Option<String> {
        match event.pointer(pointer)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    };
    let event_id = verified.webhook_id.clone().or_else(|| {
        (!cfg.event_id_pointer.is_empty())
            .then(|| text(&cfg.event_id_pointer))
            .flatten()
    });
    let Some(event_id) = event_id.map(|id| truncate(&id, 255)) else {
        metrics.provider_event(name, "malformed");
        return Answer::refused(
            400,
            format!(
                "refused: the event has no id at {}; nothing changed",
                cfg.event_id_pointer
            ),
        );
    };
    let event_type = text(&cfg.type_pointer)
        .map(|t| truncate(&t, 100))
        .unwrap_or_default();
    if !cfg.types.is_empty() && !cfg.types.contains(&event_type) {
        metrics.provider_event(name, "ignored");
        return Answer::taken("ignored", None);
    }
    let Some(object) = event.pointer(&cfg.object_pointer) else {
        metrics.provider_event(name, "malformed");
        return Answer::refused(
            400,
            format!(
                "refused: the event has no object at {}; nothing changed",
                cfg.object_pointer
            ),
        );
    };
    let store = claimer.store();
    match store.provider_event_seen(name, &event_id).await {
        Ok(true) => {
            metrics.provider_event(name, "duplicate");
            return Answer::taken("duplicate", None);
        }
        Ok(false) => {}
        Err(e) => return unavailable(name, &e),
    }
    let reading = by_value::read(map, object);
    let carried = CarriedText::read(cfg, object);
    let found = match find_claim(claimer, consumer, &carried, &reading).await {
        Ok(found) => found,
        Err(e) => return unavailable(name, &e),
    };
    let about = Event {
        id: &event_id,
        kind: &event_type,
        scheme: events.scheme(),
        object,
    };
    let applied = match found {
        None => Ok(Applied::NoClaim),
        Some(claim) => {
            let check = |c: &Claim| names(&side(consumer, c), &carried.borrow(&reading));
            apply(claimer, map, claim, &reading, &about, check).await
        }
    };
    let applied = match applied {
        Ok(done) => done,
        Err(e) => return unavailable(name, &e),
    };
    let (result, claim) = match applied {
        Applied::Done(result, claim) => (result, claim),
        not_named => {
            // No claim, or evidence about another object, tenant or consumer: recorded
            // without a claim, so `claimd reconcile` lists it with the objects claimd has no
            // claim for.
            let result = match not_named {
                Applied::NotNamed(naming) => naming.result(),
                _ => "unknown_object",
            };
            let record = ProviderEventRecord {
                consumer: name,
                event_id: &event_id,
                event_type: &event_type,
                object_id: reading.provider_id.as_deref(),
                claim_id: None,
                result,
            };
            if let Err(e) = store.record_provider_event(&record).await {
                return unavailable(name, &e);
            }
            metrics.provider_event(name, result);
            info!(
                consumer = name,
                event_id,
                event_type,
                result,
                "provider event that names no claim; recorded for reconciliation"
            );
            return Answer::taken(result, None);
        }
    };
    let record = ProviderEventRecord {
        consumer: name,
        event_id: &event_id,
        event_type: &event_type,
        object_id: reading.provider_id.as_deref(),
        claim_id: Some(claim.id),
        result,
    };
    if let Err(e) = store.record_provider_event(&record).await {
        // The claim is settled already; a re-delivery finds it where this one left it.
        warn!(error = %e, "could not record the provider event; a re-delivery changes nothing");
    }
    metrics.provider_event(name, result);
    Answer::taken(
        result,
        Some(ClaimRef {
            tenant: claim.tenant.clone(),
            message_id: claim.message_id.clone(),
            state: claim.state,
        }),
    )
}

/// The event, for history lines.
struct Event<'a> {
    id: &'a str,
    kind: &'a str,
    scheme: Scheme,
    object: &'a Value,
}

impl Event<'_> {
    fn describe(&self, map: &ValueOutcomes, reading: &Reading) -> String {
        let scheme = match self.scheme {
            Scheme::Stripe => "Stripe-Signature",
            Scheme::Standard => "Standard Webhooks",
        };
        format!(
            "event {} ({}), signature verified ({scheme}); object {}: {}",
            self.id,
            if self.kind.is_empty() {
                "no type"
            } else {
                self.kind
            },
            reading.provider_id.as_deref().unwrap_or("without id"),
            reading.describe(map)
        )
    }
}

/// What the object carries through the configured pointers, as text.
struct CarriedText {
    key: Option<String>,
    message_id: Option<String>,
    tenant: Option<String>,
    tenant_read: bool,
    consumer: Option<String>,
}

impl CarriedText {
    fn read(cfg: &ProviderEventsConfig, object: &Value) -> CarriedText {
        let text = |pointer: &str| -> Option<String> {
            if pointer.is_empty() {
                return None;
            }
            match object.pointer(pointer)? {
                Value::String(s) => Some(s.clone()),
                _ => None,
            }
        };
        CarriedText {
            key: text(&cfg.key_pointer),
            message_id: text(&cfg.message_id_pointer),
            tenant: text(&cfg.tenant_pointer),
            tenant_read: !cfg.tenant_pointer.is_empty(),
            consumer: text(&cfg.consumer_pointer),
        }
    }

    fn borrow<'a>(&'a self, reading: &'a Reading) -> Carried<'a> {
        Carried {
            object_id: reading.provider_id.as_deref(),
            key: self.key.as_deref(),
            message_id: self.message_id.as_deref(),
            tenant: self.tenant.as_deref(),
            tenant_read: self.tenant_read,
            consumer: self.consumer.as_deref(),
        }
    }
}

/// The claim's side of [`names`].
fn side<'a>(consumer: &Consumer, claim: &'a Claim) -> ClaimSide<'a> {
    ClaimSide {
        provider_id: claim.provider_id.as_deref(),
        consumer: &claim.consumer,
        tenant: &claim.tenant,
        message_id: &claim.message_id,
        key: &claim.idem_key,
        key_has_tenant: consumer.template.mentions_tenant(),
        key_has_consumer: consumer.template.mentions_consumer(),
    }
}

/// At most this many claims are read when looking for the one whose key the object carries
/// (the search matches key prefixes; the exact key is picked among them).
const KEY_CANDIDATES: u32 = 20;

/// The claim an object may be about: the one holding its provider id, else the one whose key,
/// else whose message id (and tenant), it carries. Whether it is this claim's evidence is
/// [`names`]'s decision, not this lookup's.
async fn find_claim(
    claimer: &Claimer,
    consumer: &Consumer,
    carried: &CarriedText,
    reading: &Reading,
) -> Result<Option<Claim>, StoreError> {
    let store = claimer.store();
    if let Some(id) = &reading.provider_id
        && let Some(claim) = store.find_by_provider_id(consumer.name(), id).await?
    {
        return Ok(Some(claim));
    }
    if let Some(key) = &carried.key {
        let filter = ClaimFilter {
            consumer: Some(consumer.name().to_string()),
            search: Some(key.clone()),
            limit: KEY_CANDIDATES,
            ..ClaimFilter::default()
        };
        if let Some(c) = store
            .list(&filter)
            .await?
            .into_iter()
            .find(|c| &c.idem_key == key)
        {
            // A list leaves the payload out; the settle's follow-ups read it.
            return store.get(consumer.name(), &c.tenant, &c.message_id).await;
        }
    }
    let Some(message_id) = &carried.message_id else {
        return Ok(None);
    };
    // Only where to look: an unread tenant is not taken to be "" by `names`.
    let tenant = carried.tenant.as_deref().unwrap_or_default();
    store.get(consumer.name(), tenant, message_id).await
}

/// What came of applying an event.
enum Applied {
    /// Applied or recorded on the claim: the result name and the claim as the event left it.
    Done(&'static str, Box<Claim>),
    /// A claim was found but the event does not name it: nothing changed.
    NotNamed(Naming),
    /// No claim was found.
    NoClaim,
}

/// Applies the event to its claim if `check` says it names it, re-reading the claim (and
/// asking again) when it moved meanwhile.
async fn apply(
    claimer: &Claimer,
    map: &ValueOutcomes,
    mut claim: Claim,
    reading: &Reading,
    event: &Event<'_>,
    check: impl Fn(&Claim) -> Naming,
) -> Result<Applied, StoreError> {
    let settler = claimer.settler();
    let detail = event.describe(map, reading);
    for _ in 0..RETRIES {
        let naming = check(&claim);
        if !naming.applies() {
            if naming == Naming::OtherObject {
                // A second object carrying this claim's key: the claim keeps its own id and
                // state; its history says so, for whoever checks it.
                let note = format!(
                    "not applied: {}; this claim's object is {}; {detail}",
                    naming.why(),
                    claim.provider_id.as_deref().unwrap_or("unknown")
                );
                settler
                    .note(&claim, "event", naming.result(), None, Some(&note))
                    .await;
                warn!(
                    consumer = claim.consumer,
                    message_id = claim.message_id,
                    event_id = event.id,
                    "a provider event about another object carries this claim's key; not applied"
                );
            }
            return Ok(Applied::NotNamed(naming));
        }
        let from = claim.state;
        let mv = on_event(from, reading.verdict);
        let action_outcome = if event.kind.is_empty() {
            mv.result()
        } else {
            event.kind
        };
        let moved = match mv {
            EventMove::Settle(to) => {
                let response = truncate(
                    &event.object.to_string(),
                    crate::provider::effect::MAX_RESPONSE_BYTES,
                );
                let (mut s, _) = by_reading(map, reading, 200, response, false, "completed");
                s.provider_status = None;
                debug_assert_eq!(s.state, Some(to));
                if to != ClaimState::Completed {
                    s.error = Some(detail.clone());
                }
                settler
                    .settle_from(&claim, from, s, "event", action_outcome)
                    .await?
            }
            EventMove::Flag(contradiction) => {
                let reason = flag_reason(contradiction, &claim, &detail);
                settler
                    .settle_from(&claim, from, park(reason, None), "event", "conflict")
                    .await?
            }
            EventMove::Record(_) => {
                settler
                    .note(&claim, "event", mv.result(), None, Some(&detail))
                    .await;
                return Ok(Applied::Done(mv.result(), Box::new(claim)));
            }
        };
        if moved {
            let after = claimer
                .store()
                .get(&claim.consumer, &claim.tenant, &claim.message_id)
                .await?;
            return Ok(Applied::Done(mv.result(), Box::new(after.unwrap_or(claim))));
        }
        // It moved meanwhile (its own answer may have brought its provider id): read it
        // again and ask again whether the event names it.
        match claimer
            .store()
            .get(&claim.consumer, &claim.tenant, &claim.message_id)
            .await?
        {
            Some(now) => claim = now,
            None => return Ok(Applied::NoClaim),
        }
    }
    Err(StoreError::Contended(format!(
        "claim {}/{} kept moving while a provider event was applied",
        claim.consumer, claim.message_id
    )))
}

/// The reason a claim is parked with when the provider contradicts its final state: both
/// pieces of evidence, for the person who decides.
fn flag_reason(contradiction: Contradiction, claim: &Claim, detail: &str) -> String {
    match contradiction {
        Contradiction::DoneAfterFailed => format!(
            "the provider now reports this claim done after claimd failed it ({detail}): money may have moved although the claim says it did not; check the provider before resolving"
        ),
        Contradiction::FailedAfterDone => format!(
            "the provider now reports this claim's own object failed after it completed ({detail}); it completed on: {}: one of the two is wrong about money; check the provider before resolving",
            truncate(
                claim
                    .provider_response
                    .as_deref()
                    .unwrap_or("no answer kept"),
                500
            )
        ),
    }
}

/// The `claimd_provider_events_total` reason of a refused signature.
pub(crate) fn refusal(e: &SignatureError) -> &'static str {
    match e {
        SignatureError::Unsigned(_) => "unsigned",
        SignatureError::Stale { .. } | SignatureError::Future { .. } => "expired",
        SignatureError::Mismatch => "bad_signature",
        SignatureError::Malformed(_) | SignatureError::BadSecret(_) => "malformed",
    }
}

fn unavailable(consumer: &str, e: &StoreError) -> Answer {
    warn!(consumer, error = %e, "could not take a provider event; the provider will deliver it again");
    Answer::refused(
        503,
        format!("the store could not record the event ({e}); deliver it again later"),
    )
}
