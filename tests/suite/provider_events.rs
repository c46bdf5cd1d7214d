//! `POST /v1/provider-events/{consumer}` on both stores, against a provider on loopback whose
//! answers carry the status the message asks for: pending claims settled by signed events
//! (`Stripe-Signature` and Standard Webhooks), and everything that must change nothing —
//! unsigned, badly signed, tampered, stale, re-played, late and contradicting events — with
//! the answers a provider reads (2xx: taken; 400/401: refused).

use crate::common;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use claimd::domain::claim::{Claim, ClaimState};
use claimd::provider::provider_events::signature::{sign_standard, sign_stripe};
use common::*;
use serde_json::{Value, json};
use std::time::Duration;

const STRIPE_SECRET: &str = "whsec_claimd_test_stripe_secret";
/// Standard Webhooks secrets are `whsec_` and base64.
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A provider that applies every POST and answers `200 {"id": "obj-<key>", "status": <the
/// payload's status>}`, after the payload's `delay_ms` if it has one; its status endpoint
/// knows nothing (`404`).
async fn echo_provider() -> String {
    async fn apply(headers: HeaderMap, body: Bytes) -> Json<Value> {
        let key = headers
            .get("Idempotency-Key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let payload: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
        if let Some(ms) = payload["delay_ms"].as_u64() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Json(json!({"id": format!("obj-{key}"), "status": payload["status"]}))
    }
    async fn status(Path(_key): Path<String>) -> StatusCode {
        StatusCode::NOT_FOUND
    }
    let app = Router::new()
        .route("/v1/{name}", post(apply))
        .route("/v1/effects/{key}", get(status));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn consumer(name: &str, provider: &str, scheme: &str, secret: &str) -> String {
    format!(
        r#"{}
[consumers.effect.outcome]
pointer = "/status"
completed = ["succeeded"]
pending = ["processing"]
needs_attention = ["requires_action"]
failed = ["failed"]
id_pointer = "/id"
pending_poll = "1h"

[consumers.provider_events]
scheme = "{scheme}"
secrets = ["{old}", "{secret}"]
message_id_pointer = "/metadata/message_id"
{BINDING}"#,
        consumer_toml(name, provider, ""),
        // A secret being rotated out, each consumer its own.
        old = sign_standard_secret(name),
    )
}

/// What binds an object to its claim besides its message id: the claim's key (here
/// `{consumer}:{tenant}:{message_id}`, the default), which names tenant and consumer.
const BINDING: &str = "key_pointer = \"/metadata/key\"\n";

/// A Standard Webhooks secret of its own for `name`.
fn sign_standard_secret(name: &str) -> String {
    use base64::Engine;
    let raw = format!("an old secret being rotated: {name}");
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A Stripe-shaped event about `object`.
fn event(id: &str, kind: &str, object: Value) -> Vec<u8> {
    json!({"id": id, "type": kind, "data": {"object": object}})
        .to_string()
        .into_bytes()
}

struct Endpoint {
    base: String,
}

impl Endpoint {
    async fn post(&self, consumer: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
        let mut r = client()
            .post(format!("{}/v1/provider-events/{consumer}", self.base))
            .header("Content-Type", "application/json")
            .body(body.to_vec());
        for (k, v) in headers {
            r = r.header(*k, v);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(json!(null)))
    }

    /// Delivered as Stripe signs it, at `t`, with `secret`.
    async fn stripe(&self, body: &[u8], t: i64, secret: &str) -> (u16, Value) {
        self.stripe_to("cards", body, t, secret).await
    }

    /// Delivered to `consumer`'s endpoint as Stripe signs it.
    async fn stripe_to(&self, consumer: &str, body: &[u8], t: i64, secret: &str) -> (u16, Value) {
        let signature = sign_stripe(secret, t, body);
        self.post(consumer, &[("Stripe-Signature", signature)], body)
            .await
    }

    async fn message(&self, consumer: &str, id: &str, status: &str) {
        self.message_with(consumer, id, json!({"status": status}))
            .await
    }

    async fn message_with(&self, consumer: &str, id: &str, payload: Value) {
        let r = client()
            .post(format!("{}/v1/messages/{consumer}", self.base))
            .header("Idempotency-Key", id)
            .header("Content-Type", "application/json")
            .body(payload.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202, "{id}");
    }
}

async fn claim_in(s: &claimd::store::Store, consumer: &str, id: &str, state: ClaimState) -> Claim {
    let reached = eventually(Duration::from_secs(20), || async {
        s.get(consumer, "", id)
            .await
            .unwrap()
            .is_some_and(|c| c.state == state)
    })
    .await;
    let c = s.get(consumer, "", id).await.unwrap().unwrap();
    assert!(
        reached,
        "{consumer}/{id}: {} ({:?}), not {state}",
        c.state, c.last_error
    );
    c
}

async fn events_settle_pending_claims_and_nothing_else_changes_them(store: TestStore) {
    let provider = echo_provider().await;
    let consumers = format!(
        "{}{}",
        consumer("cards", &provider, "stripe", STRIPE_SECRET),
        consumer("standard", &provider, "standard", STANDARD_SECRET)
    );
    let running = start(&config_toml(&store.url(), &consumers)).await;
    let s = running.app().store.clone();
    let ep = Endpoint {
        base: format!("http://{}", running.http_addr),
    };

    // A 2xx that says "processing" is pending, not completed, and knows its object.
    ep.message("cards", "m1", "processing").await;
    let m1 = claim_in(&s, "cards", "m1", ClaimState::Pending).await;
    let object = m1.provider_id.clone().expect("the provider's id is kept");
    assert!(m1.processed_utc.is_none());
    let succeeded = event(
        "evt_1",
        "payment_intent.succeeded",
        json!({"id": object, "status": "succeeded"}),
    );

    // Refused, and nothing changes: unsigned, another secret, a tampered body, too old.
    let (status, _) = ep.post("cards", &[], &succeeded).await;
    assert_eq!(status, 401, "unsigned");
    let (status, _) = ep.stripe(&succeeded, now(), "whsec_not_the_secret").await;
    assert_eq!(status, 401, "signed with another secret");
    let signature = sign_stripe(STRIPE_SECRET, now(), &succeeded);
    let mut tampered = succeeded.clone();
    let at = tampered.len() - 5;
    tampered[at] = b'X';
    let (status, _) = ep
        .post("cards", &[("Stripe-Signature", signature)], &tampered)
        .await;
    assert_eq!(status, 401, "tampered body");
    let (status, _) = ep.stripe(&succeeded, now() - 600, STRIPE_SECRET).await;
    assert_eq!(status, 400, "ten minutes old (tolerance 5m)");
    let (status, _) = ep
        .post(
            "cards",
            &[("Stripe-Signature", "t=1,v1=zz".into())],
            &succeeded,
        )
        .await;
    assert_eq!(status, 400, "a signature that is not hex is malformed");
    assert_eq!(
        claim_in(&s, "cards", "m1", ClaimState::Pending)
            .await
            .attempt,
        m1.attempt
    );

    // The real one settles it; the same event again and a late "processing" change nothing
    // (a "failed" for the same object asks a person: see below).
    let (status, body) = ep.stripe(&succeeded, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("settled")),
        "{body}"
    );
    let done = claim_in(&s, "cards", "m1", ClaimState::Completed).await;
    assert!(done.processed_utc.is_some() && done.last_error.is_none());
    let (status, body) = ep.stripe(&succeeded, now(), STRIPE_SECRET).await;
    assert_eq!((status, body["result"].as_str()), (200, Some("duplicate")));
    let late = event(
        "evt_2",
        "payment_intent.processing",
        json!({"id": object, "status": "processing"}),
    );
    let (_, body) = ep.stripe(&late, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "stale");
    let after = claim_in(&s, "cards", "m1", ClaimState::Completed).await;
    let history = s.events(after.id).await.unwrap();
    let events: Vec<&str> = history
        .iter()
        .filter(|e| e.action == "event")
        .map(|e| e.outcome.as_str())
        .collect();
    assert_eq!(events, ["payment_intent.succeeded", "stale"], "{history:?}");

    // A failed claim the provider later reports succeeded is parked for a person.
    ep.message("cards", "m2", "failed").await;
    let m2 = claim_in(&s, "cards", "m2", ClaimState::Failed).await;
    let flipped = event(
        "evt_4",
        "payment_intent.succeeded",
        json!({"id": m2.provider_id, "status": "succeeded"}),
    );
    let (_, body) = ep.stripe(&flipped, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "conflict");
    let m2 = claim_in(&s, "cards", "m2", ClaimState::NeedsAttention).await;
    assert!(
        m2.last_error
            .as_deref()
            .is_some_and(|r| r.contains("money may have moved")),
        "{:?}",
        m2.last_error
    );

    // An object claimd has no claim for: taken (the provider must not retry it forever),
    // counted, and listed for reconciliation.
    let stranger = event(
        "evt_5",
        "payment_intent.succeeded",
        json!({"id": "obj-nobody", "status": "succeeded"}),
    );
    let (status, body) = ep.stripe(&stranger, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("unknown_object"))
    );
    let unmatched = s.unmatched_provider_events(None, 10).await.unwrap();
    assert_eq!(unmatched.len(), 1);
    assert_eq!(unmatched[0].event_id, "evt_5");
    assert_eq!(unmatched[0].object_id.as_deref(), Some("obj-nobody"));

    // Another object carrying the claim's message id in its metadata is not its evidence.
    ep.message("cards", "m3", "processing").await;
    claim_in(&s, "cards", "m3", ClaimState::Pending).await;
    let by_metadata = event(
        "evt_6",
        "payment_intent.payment_failed",
        json!({"id": "obj-renamed", "status": "failed", "metadata": {"message_id": "m3"}}),
    );
    let (_, body) = ep.stripe(&by_metadata, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "foreign_object", "{body}");
    claim_in(&s, "cards", "m3", ClaimState::Pending).await;

    // Standard Webhooks: webhook-id is the event's id.
    ep.message("standard", "m4", "processing").await;
    let m4 = claim_in(&s, "standard", "m4", ClaimState::Pending).await;
    let body = json!({"type": "payment.succeeded", "data": {"object":
        {"id": m4.provider_id, "status": "succeeded"}}})
    .to_string()
    .into_bytes();
    let t = now();
    let sig = sign_standard(STANDARD_SECRET, "msg_1", t, &body).unwrap();
    let headers = [
        ("webhook-id", "msg_1".to_string()),
        ("webhook-timestamp", t.to_string()),
        ("webhook-signature", sig),
    ];
    let (status, answer) = ep.post("standard", &headers, &body).await;
    assert_eq!(
        (status, answer["result"].as_str()),
        (200, Some("settled")),
        "{answer}"
    );
    claim_in(&s, "standard", "m4", ClaimState::Completed).await;
    let (_, answer) = ep.post("standard", &headers, &body).await;
    assert_eq!(answer["result"], "duplicate");
    let (status, _) = ep.post("standard", &headers[..2], &body).await;
    assert_eq!(status, 401, "no webhook-signature");

    let metrics = reqwest::get(format!("{}/metrics", ep.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"claimd_provider_events_total{consumer="cards",reason="settled"} 1"#,
        r#"claimd_provider_events_total{consumer="cards",reason="foreign_object"} 1"#,
        r#"claimd_provider_events_total{consumer="cards",reason="bad_signature"} 2"#,
        r#"claimd_provider_events_total{consumer="cards",reason="malformed"} 1"#,
        r#"claimd_provider_events_total{consumer="cards",reason="unsigned"} 1"#,
        r#"claimd_provider_events_total{consumer="cards",reason="expired"} 1"#,
        r#"claimd_provider_events_total{consumer="cards",reason="unknown_object"} 1"#,
        r#"claimd_claims{consumer="cards",state="pending"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_events_settle_pending_claims_and_nothing_else_changes_them() {
    events_settle_pending_claims_and_nothing_else_changes_them(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_events_settle_pending_claims_and_nothing_else_changes_them() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    events_settle_pending_claims_and_nothing_else_changes_them(store).await;
}

/// A consumer without `[effect.outcome]` has no events to take (`404`), and a configuration
/// that asks for events without it is refused at load, naming the key.
#[tokio::test]
async fn provider_events_need_an_outcome_mapping() {
    let store = TestStore::sqlite();
    let toml = config_toml(
        &store.url(),
        &format!(
            "{}\n[consumers.provider_events]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\n",
            consumer_toml("plain", "http://127.0.0.1:9", "")
        ),
    );
    let e =
        claimd::config::Config::from_toml(&toml, std::path::Path::new("t.toml"), std::env::vars())
            .map(|_| ())
            .expect_err("refused")
            .to_string();
    assert!(
        e.contains("provider_events") && e.contains("effect.outcome"),
        "{e}"
    );
}

#[path = "provider_events/naming.rs"]
mod naming;
