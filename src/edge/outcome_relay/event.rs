//! The outcome event as it is published (pure): its id, its JSON body, its AMQP routing key
//! and its Standard Webhooks headers. The same event always makes the same id and body, so a
//! repeat after a crash is recognisable by its id.

use crate::domain::redaction::mask_text;
use crate::provider::provider_events::signature::{SignatureError, sign_standard};
use crate::store::outbox::OutcomeEvent;
use serde::Serialize;

/// The body's `type` prefix: `claim.completed`, `claim.failed`, ...
pub const TYPE_PREFIX: &str = "claim.";

/// The event's id: unique in the store, the same on every send of the event and at every
/// destination (AMQP `message_id`, `webhook-id`, `Nats-Msg-Id`, the body's `id`): made from
/// the claim's id and its version after the change, which every change bumps. An event
/// written before destinations had names keeps the id made from its row.
pub fn event_id(e: &OutcomeEvent) -> String {
    match e.claim_version {
        Some(v) => format!("evt_{}_{v}", e.claim_id),
        None => format!("evt_{}", e.seq),
    }
}

/// The JSON body (see docs/outcome-events.md for its schema).
#[derive(Debug, Serialize)]
pub struct Body<'a> {
    /// [`event_id`].
    pub id: String,
    /// `claim.<state>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Consumer.
    pub consumer: &'a str,
    /// Tenant (`""` when none).
    pub tenant: &'a str,
    /// The producer's message id (its `Idempotency-Key` or AMQP `message_id`).
    pub message_id: &'a str,
    /// The idempotency key claimd sent to the provider.
    pub key: &'a str,
    /// The claim's state after the change.
    pub state: &'a str,
    /// The claim's attempt after the change.
    pub attempt: i32,
    /// The provider's status, when it answered.
    pub provider_status: Option<i32>,
    /// The provider's id of the object.
    pub provider_id: Option<&'a str>,
    /// The provider's answer, masked ([`mask_text`]: card numbers, e-mail addresses, and in
    /// JSON the default sensitive names), at most 4 KiB (cut on a character boundary).
    pub provider_answer: Option<String>,
    /// Why, when the claim did not complete (or the operator's note), masked likewise.
    pub reason: Option<String>,
    /// What made the change: `perform`, `reconcile`, `poll`, `event`, `resolve`, `redrive`, ...
    pub action: &'a str,
    /// Who: the worker instance, or the operator for `resolve` and `redrive`.
    pub actor: &'a str,
    /// When the change committed (RFC 3339, UTC).
    pub occurred_at: String,
    /// The claim whose settle created this one (a follow-up), while it is stored; left out
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<&'a crate::store::outbox::OutcomeParent>,
}

/// Most bytes of the provider's answer an event carries.
pub const MAX_ANSWER: usize = 4096;

/// The body of `e`.
pub fn body(e: &OutcomeEvent) -> Body<'_> {
    // Masked before it is cut: a card number across the cut would keep its digits.
    let answer = e.provider_response.as_deref().map(|a| {
        let a = mask_text(a);
        let mut end = a.len().min(MAX_ANSWER);
        while !a.is_char_boundary(end) {
            end -= 1;
        }
        a[..end].to_string()
    });
    Body {
        id: event_id(e),
        kind: format!("{TYPE_PREFIX}{}", e.state),
        consumer: &e.consumer,
        tenant: &e.tenant,
        message_id: &e.message_id,
        key: &e.key,
        state: &e.state,
        attempt: e.attempt,
        provider_status: e.provider_status,
        provider_id: e.provider_id.as_deref(),
        provider_answer: answer,
        reason: e.reason.as_deref().map(mask_text),
        action: &e.action,
        actor: &e.actor,
        occurred_at: e
            .at_utc
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        parent: e.parent.as_ref(),
    }
}

/// The body of `e` as bytes.
pub fn body_bytes(e: &OutcomeEvent) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    write_body(&mut out, e);
    out
}

/// Appends the body of `e` to `out` (several events' bodies can share one buffer).
pub fn write_body(out: &mut Vec<u8>, e: &OutcomeEvent) {
    // Serialising plain strings and numbers into a Vec cannot fail.
    let _ = serde_json::to_writer(out, &body(e));
}

/// The Standard Webhooks headers of one delivery of `body` at `timestamp` (Unix seconds):
/// `webhook-id`, `webhook-timestamp`, `webhook-signature` (`v1,<base64 HMAC-SHA256>` over
/// `id.timestamp.body`).
pub fn webhook_headers(
    secret: &str,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<[(&'static str, String); 3], SignatureError> {
    Ok([
        ("webhook-id", id.to_string()),
        ("webhook-timestamp", timestamp.to_string()),
        (
            "webhook-signature",
            sign_standard(secret, id, timestamp, body)?,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::provider_events::signature::{Scheme, Verifier};

    fn event() -> OutcomeEvent {
        OutcomeEvent {
            seq: 42,
            destination: "amqp".into(),
            claim_version: Some(3),
            claim_id: 7,
            consumer: "payments".into(),
            tenant: "".into(),
            message_id: "order-1".into(),
            key: "payments::order-1".into(),
            state: "completed".into(),
            attempt: 1,
            provider_status: Some(200),
            provider_id: Some("pi_1".into()),
            provider_response: Some("é".repeat(3000)),
            reason: None,
            actor: "host-1".into(),
            action: "perform".into(),
            at_utc: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            tries: 0,
            parent: None,
        }
    }

    #[test]
    fn the_body_names_the_claim_and_bounds_the_answer() {
        let e = event();
        let v: serde_json::Value = serde_json::from_slice(&body_bytes(&e)).unwrap();
        assert_eq!(
            v["id"], "evt_7_3",
            "the claim and its version: one id at every destination"
        );
        let old = OutcomeEvent {
            claim_version: None,
            ..e.clone()
        };
        assert_eq!(event_id(&old), "evt_42", "a row from before keeps its id");
        assert_eq!(v["type"], "claim.completed");
        assert_eq!(v["message_id"], "order-1");
        assert_eq!(v["provider_id"], "pi_1");
        assert_eq!(v["occurred_at"], "2023-11-14T22:13:20.000Z");
        let answer = v["provider_answer"].as_str().unwrap();
        assert!(answer.len() <= MAX_ANSWER && answer.len() > MAX_ANSWER - 2);
        assert_eq!(
            body_bytes(&e),
            body_bytes(&e),
            "the same event, the same bytes"
        );
    }

    #[test]
    fn the_body_carries_no_card_number_nor_address() {
        let e = OutcomeEvent {
            provider_response: Some(
                r#"{"error":"card 4242424242424242 declined","email":"ann@example.test"}"#.into(),
            ),
            reason: Some("declined for ann@example.test, card 4242424242424242".into()),
            ..event()
        };
        let body = String::from_utf8(body_bytes(&e)).unwrap();
        assert!(!body.contains("4242424242424242"), "{body}");
        assert!(!body.contains("ann@example.test"), "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["reason"], "declined for [redacted], card ••••4242");
        assert!(v["provider_answer"].as_str().unwrap().contains("••••4242"));
    }

    #[test]
    fn the_signature_verifies_with_the_standard_webhooks_scheme() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let e = event();
        let body = body_bytes(&e);
        let now = chrono::Utc::now().timestamp();
        let headers = webhook_headers(secret, &event_id(&e), now, &body).unwrap();
        let mut map = axum::http::HeaderMap::new();
        for (k, v) in &headers {
            map.insert(*k, v.parse().unwrap());
        }
        let verifier = Verifier::new(
            Scheme::Standard,
            &[secret.to_string()],
            std::time::Duration::from_secs(300),
        )
        .unwrap();
        verifier.verify(&map, &body, now).expect("verifies");
    }
}
