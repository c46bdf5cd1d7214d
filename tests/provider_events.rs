//! `POST /v1/provider-events/{consumer}` on both stores, against a provider on loopback whose
//! answers carry the status the message asks for: pending claims settled by signed events
//! (`Stripe-Signature` and Standard Webhooks), and everything that must change nothing —
//! unsigned, badly signed, tampered, stale, re-played, late and contradicting events — with
//! the answers a provider reads (2xx: taken; 400/401: refused).

mod common;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use claimd::internal::claim::{Claim, ClaimState};
use claimd::internal::provider_events::signature::{sign_standard, sign_stripe};
use claimd::internal::run::Running;
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

async fn claim_in(
    s: &claimd::internal::store::Store,
    consumer: &str,
    id: &str,
    state: ClaimState,
) -> Claim {
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

/// Runs one test body on SQLite and on PostgreSQL.
macro_rules! on_both_stores {
    ($body:ident, $sqlite:ident, $postgres:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            $body(TestStore::sqlite()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            let Some(store) = TestStore::pg().await else {
                return;
            };
            $body(store).await;
        }
    };
}

/// A worker with the consumers `cards` (and `shop`, on the same provider account, with its
/// own secret), its store and its endpoint.
async fn cards_and_shop(store: &TestStore) -> (Running, claimd::internal::store::Store, Endpoint) {
    let provider = echo_provider().await;
    let consumers = format!(
        "{}{}",
        consumer("cards", &provider, "stripe", STRIPE_SECRET),
        consumer("shop", &provider, "stripe", SHOP_SECRET)
    );
    let running = start(&config_toml(&store.url(), &consumers)).await;
    let s = running.app().store.clone();
    let ep = Endpoint {
        base: format!("http://{}", running.http_addr),
    };
    (running, s, ep)
}

const SHOP_SECRET: &str = "whsec_claimd_test_shop_secret";

/// The claim's history lines written by provider events: `(outcome, detail)`.
async fn event_lines(s: &claimd::internal::store::Store, claim: &Claim) -> Vec<(String, String)> {
    s.events(claim.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.action == "event")
        .map(|e| (e.outcome, e.detail.unwrap_or_default()))
        .collect()
}

/// Issue item 2, first way: another object carrying the same order number (message id) does
/// not decide a pending claim; the claim's own object still does.
async fn another_object_with_the_same_order_number(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    ep.message("cards", "1001", "processing").await;
    let claim = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    let own = claim.provider_id.clone().unwrap();

    let other = event(
        "evt_other",
        "payment_intent.payment_failed",
        json!({"id": "pi_other_order", "status": "failed", "metadata": {"message_id": "1001"}}),
    );
    let (status, body) = ep.stripe(&other, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("foreign_object")),
        "{body}"
    );
    let after = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    assert_eq!(after.provider_id.as_deref(), Some(own.as_str()));
    let unmatched = s.unmatched_provider_events(None, 10).await.unwrap();
    assert_eq!(unmatched.len(), 1, "listed for reconciliation");
    assert_eq!(unmatched[0].object_id.as_deref(), Some("pi_other_order"));

    // The real object's event still finds and settles it.
    let real = event(
        "evt_real",
        "payment_intent.succeeded",
        json!({"id": own, "status": "succeeded", "metadata": {"message_id": "1001"}}),
    );
    let (_, body) = ep.stripe(&real, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    claim_in(&s, "cards", "1001", ClaimState::Completed).await;
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    another_object_with_the_same_order_number,
    sqlite_another_object_with_the_same_order_number_decides_nothing,
    postgres_another_object_with_the_same_order_number_decides_nothing
);

/// Issue item 2, second way: another tenant's object with the same message id does not
/// complete a tenant-less claim whose own payment was declined.
async fn another_tenants_object(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    ep.message("cards", "1001", "processing").await;
    let claim = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    let acme = event(
        "evt_acme",
        "payment_intent.succeeded",
        json!({"id": "pi_acme", "status": "succeeded",
               "metadata": {"message_id": "1001", "key": "cards:acme:1001"}}),
    );
    let (status, body) = ep.stripe(&acme, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("foreign_object")),
        "{body}"
    );
    claim_in(&s, "cards", "1001", ClaimState::Pending).await;

    let declined = event(
        "evt_declined",
        "payment_intent.payment_failed",
        json!({"id": claim.provider_id, "status": "failed"}),
    );
    let (_, body) = ep.stripe(&declined, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    let after = claim_in(&s, "cards", "1001", ClaimState::Failed).await;
    assert_eq!(after.provider_id, claim.provider_id);
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    another_tenants_object,
    sqlite_another_tenants_object_decides_nothing,
    postgres_another_tenants_object_decides_nothing
);

/// Issue item 2, third way: one provider account delivers every event to every endpoint, so
/// `cards` receives `shop`'s events, signed with `cards`' own secret. `shop`'s object with
/// the same message id decides nothing for `cards`.
async fn another_consumers_object(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    ep.message("cards", "1001", "processing").await;
    ep.message("shop", "1001", "processing").await;
    let cards = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    let shop = claim_in(&s, "shop", "1001", ClaimState::Pending).await;
    let shops_event = event(
        "evt_shop",
        "payment_intent.payment_failed",
        json!({"id": shop.provider_id, "status": "failed",
               "metadata": {"message_id": "1001", "key": "shop::1001"}}),
    );
    let (status, body) = ep
        .stripe_to("cards", &shops_event, now(), STRIPE_SECRET)
        .await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("foreign_object")),
        "{body}"
    );
    let after = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    assert_eq!(after.provider_id, cards.provider_id);
    // Delivered to its own endpoint, it settles its own claim.
    let (_, body) = ep.stripe_to("shop", &shops_event, now(), SHOP_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    claim_in(&s, "shop", "1001", ClaimState::Failed).await;
    claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    another_consumers_object,
    sqlite_another_consumers_object_decides_nothing,
    postgres_another_consumers_object_decides_nothing
);

/// An event that arrives while the claim's call is in flight (no provider id yet) does not
/// decide it on weaker evidence than its full key; the worker's own answer does. One that
/// carries its full key may decide it, and keeps its object id.
async fn events_during_the_call(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    let in_flight = |id: &'static str| {
        let s = s.clone();
        async move {
            eventually(Duration::from_secs(5), || async {
                s.get("cards", "", id).await.unwrap().is_some()
            })
            .await
        }
    };
    // Declined, answered after 800 ms; meanwhile a look-alike reports success.
    let sending = tokio::spawn({
        let base = ep.base.clone();
        async move {
            Endpoint { base }
                .message_with(
                    "cards",
                    "1001",
                    json!({"status": "failed", "delay_ms": 800}),
                )
                .await
        }
    });
    assert!(in_flight("1001").await);
    sending.await.unwrap();
    let look_alike = event(
        "evt_look_alike",
        "payment_intent.succeeded",
        json!({"id": "pi_look_alike", "status": "succeeded", "metadata": {"message_id": "1001"}}),
    );
    let (status, body) = ep.stripe(&look_alike, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("foreign_object")),
        "{body}"
    );
    let declined = claim_in(&s, "cards", "1001", ClaimState::Failed).await;
    assert_eq!(declined.provider_id.as_deref(), Some("obj-cards::1001"));

    // The claim's own object, named by its full key before the answer came back.
    ep.message_with(
        "cards",
        "1002",
        json!({"status": "succeeded", "delay_ms": 800}),
    )
    .await;
    assert!(in_flight("1002").await);
    let own = event(
        "evt_own",
        "payment_intent.succeeded",
        json!({"id": "obj-cards::1002", "status": "succeeded",
               "metadata": {"message_id": "1002", "key": "cards::1002"}}),
    );
    let (_, body) = ep.stripe(&own, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    let done = claim_in(&s, "cards", "1002", ClaimState::Completed).await;
    assert_eq!(done.provider_id.as_deref(), Some("obj-cards::1002"));
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    events_during_the_call,
    sqlite_an_event_during_the_call_needs_the_full_key,
    postgres_an_event_during_the_call_needs_the_full_key
);

/// Issue item 7: `succeeded` then `payment_failed` for the claim's own object asks a person,
/// with both pieces of evidence in the reason.
async fn failure_after_success(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    ep.message("cards", "1001", "processing").await;
    let claim = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    let own = claim.provider_id.clone().unwrap();
    let succeeded = event(
        "evt_ok",
        "payment_intent.succeeded",
        json!({"id": own, "status": "succeeded"}),
    );
    let (_, body) = ep.stripe(&succeeded, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    claim_in(&s, "cards", "1001", ClaimState::Completed).await;
    let failed = event(
        "evt_failed",
        "payment_intent.payment_failed",
        json!({"id": own, "status": "failed"}),
    );
    let (status, body) = ep.stripe(&failed, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("conflict")),
        "{body}"
    );
    let parked = claim_in(&s, "cards", "1001", ClaimState::NeedsAttention).await;
    let reason = parked.last_error.clone().unwrap_or_default();
    assert!(
        reason.contains("evt_failed") && reason.contains("\"succeeded\""),
        "both pieces of evidence: {reason}"
    );
    assert_eq!(parked.provider_id.as_deref(), Some(own.as_str()));
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    failure_after_success,
    sqlite_a_failure_after_success_of_its_own_object_asks_a_person,
    postgres_a_failure_after_success_of_its_own_object_asks_a_person
);

/// A claim's known provider id is never replaced: another object carrying its full key is
/// recorded (and noted in the claim's history), not applied; the claim's own object still
/// settles it.
async fn provider_id_kept(store: TestStore) {
    let (running, s, ep) = cards_and_shop(&store).await;
    ep.message("cards", "1001", "processing").await;
    let claim = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    let own = claim.provider_id.clone().unwrap();
    let second = event(
        "evt_second",
        "payment_intent.succeeded",
        json!({"id": "pi_second", "status": "succeeded",
               "metadata": {"message_id": "1001", "key": "cards::1001"}}),
    );
    let (status, body) = ep.stripe(&second, now(), STRIPE_SECRET).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("other_object")),
        "{body}"
    );
    let after = claim_in(&s, "cards", "1001", ClaimState::Pending).await;
    assert_eq!(after.provider_id.as_deref(), Some(own.as_str()));
    let lines = event_lines(&s, &after).await;
    assert!(
        lines
            .iter()
            .any(|(o, d)| o == "other_object" && d.contains("pi_second") && d.contains(&own)),
        "{lines:?}"
    );
    let real = event(
        "evt_real",
        "payment_intent.succeeded",
        json!({"id": own, "status": "succeeded"}),
    );
    let (_, body) = ep.stripe(&real, now(), STRIPE_SECRET).await;
    assert_eq!(body["result"], "settled", "{body}");
    let done = claim_in(&s, "cards", "1001", ClaimState::Completed).await;
    assert_eq!(done.provider_id.as_deref(), Some(own.as_str()));
    running.shutdown(Duration::from_secs(5)).await;
}
on_both_stores!(
    provider_id_kept,
    sqlite_a_known_provider_id_is_never_overwritten,
    postgres_a_known_provider_id_is_never_overwritten
);

/// The configuration refusals of invariant I9, each naming its key on one line.
#[test]
fn configurations_that_cannot_tell_claims_apart_are_refused() {
    let refusal = |consumers: String| -> String {
        let toml = config_toml("sqlite://unused.db", &consumers);
        claimd::config::Config::from_toml(&toml, std::path::Path::new("t.toml"), std::env::vars())
            .map(|_| ())
            .expect_err("refused")
            .to_string()
    };
    let provider = "http://127.0.0.1:9";
    // Two consumers sharing a signing secret.
    let shared = refusal(format!(
        "{}{}",
        consumer("cards", provider, "stripe", STRIPE_SECRET),
        consumer("shop", provider, "stripe", STRIPE_SECRET)
    ));
    assert!(
        shared.contains("consumers[1].provider_events.secrets") && shared.contains("\"cards\""),
        "{shared}"
    );
    assert_eq!(shared.lines().count(), 1, "{shared}");
    // A key with {tenant} and nothing that reads the tenant.
    let no_tenant = refusal(
        consumer("cards", provider, "stripe", STRIPE_SECRET)
            .replace(BINDING, "consumer_pointer = \"/metadata/consumer\"\n"),
    );
    assert!(
        no_tenant.contains("consumers[0].provider_events.tenant_pointer"),
        "{no_tenant}"
    );
    // Nothing that binds an object to this consumer.
    let unbound = refusal(
        consumer("cards", provider, "stripe", STRIPE_SECRET)
            .replace(BINDING, "tenant_pointer = \"/metadata/tenant\"\n"),
    );
    assert!(
        unbound.contains("consumers[0].provider_events.consumer_pointer"),
        "{unbound}"
    );
    // All three read as fields, or the key: taken.
    for ok in [
        consumer("cards", provider, "stripe", STRIPE_SECRET),
        consumer("cards", provider, "stripe", STRIPE_SECRET).replace(
            BINDING,
            "tenant_pointer = \"/metadata/tenant\"\nconsumer_pointer = \"/metadata/consumer\"\n",
        ),
    ] {
        let toml = config_toml("sqlite://unused.db", &ok);
        claimd::config::Config::from_toml(&toml, std::path::Path::new("t.toml"), std::env::vars())
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
