//! `claimd reconcile` reads a found object as the call does: through the consumer's
//! `[effect.outcome]` table. A declined or canceled payment is the provider refusing the
//! effect, never "the provider has the effect"; a value the table does not list is undecided,
//! and every undecided claim is listed with its reason. A status lookup built from payload
//! fields gets the claim's payload.
//!
//! The provider is a real HTTP server on loopback answering `GET /v1/effects/{id}` with the
//! object it holds (a PaymentIntent-shaped `{"id", "status"}`), `404` otherwise. Each test runs
//! on SQLite and on PostgreSQL (a failure under CI=true when PostgreSQL is missing).

use crate::common;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use claimd::domain::claim::{ClaimState, NewClaim};
use claimd::store::{ClaimOutcome, NewEvent, Settlement, Store};
use common::*;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A provider holding `objects` (by the id its status URL names).
async fn provider(objects: HashMap<String, Value>) -> String {
    async fn status(
        State(objects): State<Arc<HashMap<String, Value>>>,
        Path(id): Path<String>,
    ) -> Response {
        match objects.get(&id) {
            Some(o) => (StatusCode::OK, axum::Json(o.clone())).into_response(),
            None => (StatusCode::NOT_FOUND, "{}").into_response(),
        }
    }
    let app = Router::new()
        .route("/v1/effects/{id}", get(status))
        .with_state(Arc::new(objects));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    url
}

/// A payments consumer whose answers are read by value, Stripe's way; the status URL is
/// `status_path` under the provider (`{key}`, or a payload field such as `{order}`).
fn config(store: &str, provider: &str, status_path: &str) -> String {
    let consumer = format!(
        r#"
[[consumers]]
name = "payments"
source = "http"
lease = "3s"
max_attempts = 5
redrive_within = "1h"
on_unknown = "reconcile"

[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "1s"
status_url = "{provider}/v1/effects/{status_path}"

[consumers.effect.outcome]
pointer = "/status"
completed = ["succeeded"]
pending = ["processing"]
needs_attention = ["requires_action"]
failed = ["requires_payment_method", "canceled"]
id_pointer = "/id"
reason_pointer = "/last_payment_error/message"
"#
    );
    config_toml(store, &consumer)
}

fn write_config(dir: &std::path::Path, toml: &str) -> String {
    let path = dir.join("c.toml");
    std::fs::write(&path, toml).unwrap();
    path.to_str().unwrap().to_string()
}

/// A claim of message `id` (key `id`) for `payload`, settled in `state`.
async fn claim_in(store: &Store, id: &str, payload: &Value, state: ClaimState) {
    let payload = payload.to_string();
    let new = NewClaim {
        consumer: "payments".into(),
        tenant: String::new(),
        message_id: id.into(),
        idem_key: id.into(),
        fingerprint: claimd::domain::claim::fingerprint(payload.as_bytes()),
        payload: bytes::Bytes::from(payload),
        content_type: "application/json".into(),
        worker: "test".into(),
        lease: Duration::from_secs(60),
        claim_token: claimd::domain::claim::new_claim_token(),
        mark_not_called: false,
        order_key: None,
        not_before: None,
        trace_parent: None,
        priority: 0,
    };
    let ClaimOutcome::Created(c) = store.claim(&new).await.unwrap() else {
        panic!("new claim {id}")
    };
    let settled = Settlement {
        state: Some(state),
        error: (state != ClaimState::Completed).then(|| "arranged".into()),
        ..Default::default()
    };
    let ev = NewEvent {
        actor: "test",
        action: "test",
        outcome: "arranged",
        provider_status: None,
        detail: None,
    };
    assert!(store.settle(c.id, 1, &settled, &ev).await.unwrap());
}

fn pi(id: &str, status: &str) -> Value {
    json!({"id": format!("pi_{id}"), "object": "payment_intent", "status": status})
}

async fn open(store: &TestStore) -> Store {
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    s.migrate().await.unwrap();
    s
}

/// The mismatches of a JSON audit as message id -> (kind, suggestion).
fn mismatches(audit: &Value) -> HashMap<String, (String, String)> {
    audit["mismatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["message_id"].as_str().unwrap().to_string(),
                (
                    m["kind"].as_str().unwrap().to_string(),
                    m["suggestion"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

async fn declined_payments_are_read_by_value(store: TestStore) {
    let objects: HashMap<String, Value> = [
        ("declined-failed", "requires_payment_method"),
        ("declined-completed", "requires_payment_method"),
        ("canceled-parked", "canceled"),
        ("3ds-parked", "requires_action"),
        ("paid-failed", "succeeded"),
        ("paid-completed", "succeeded"),
        ("odd-parked", "requires_confirmation"),
    ]
    .into_iter()
    .map(|(id, status)| (id.to_string(), pi(id, status)))
    .collect();
    let provider = provider(objects).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &config(&store.url(), &provider, "{key}"));
    let s = open(&store).await;
    let payload = json!({"amount": 1999, "currency": "eur"});
    for (id, state) in [
        ("declined-failed", ClaimState::Failed),
        ("declined-completed", ClaimState::Completed),
        ("canceled-parked", ClaimState::NeedsAttention),
        ("3ds-parked", ClaimState::NeedsAttention),
        ("paid-failed", ClaimState::Failed),
        ("paid-completed", ClaimState::Completed),
        ("odd-parked", ClaimState::NeedsAttention),
    ] {
        claim_in(&s, id, &payload, state).await;
    }

    let (code, out, err) = cli(&["reconcile", "--format", "json", "--config", &cfg]);
    assert_eq!(code, 3, "mismatches found: {err}\n{out}");
    let audit: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(audit["checked"], 6, "{out}");
    assert_eq!(audit["undecided"], 1, "{out}");
    let found = mismatches(&audit);
    let kinds: HashMap<&str, &str> = found
        .iter()
        .map(|(id, (kind, _))| (id.as_str(), kind.as_str()))
        .collect();
    assert_eq!(
        kinds,
        HashMap::from([
            ("declined-completed", "completed_but_refused"),
            ("canceled-parked", "open_but_refused"),
            ("paid-failed", "failed_but_applied"),
        ]),
        "a declined payment that failed here agrees, and so does a 3-D Secure one parked: {out}"
    );
    // Only the payment the provider completed is to be marked completed.
    for (id, (_, suggestion)) in &found {
        assert_eq!(
            suggestion.contains("--as completed"),
            id == "paid-failed",
            "{id}: {suggestion}"
        );
    }
    assert!(
        found["canceled-parked"]
            .1
            .contains("claims resolve payments canceled-parked --as failed"),
        "{:?}",
        found["canceled-parked"]
    );
    assert!(
        found["declined-completed"]
            .1
            .contains("claims show payments declined-completed"),
        "{:?}",
        found["declined-completed"]
    );
    // What the provider said goes with each mismatch.
    let declined = audit["mismatches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["message_id"] == "declined-completed")
        .unwrap();
    assert!(
        declined["provider"]
            .as_str()
            .unwrap()
            .contains("requires_payment_method"),
        "{declined}"
    );
    // The undecided claim, with why: a value the table does not map.
    let undecided = audit["undecided_claims"].as_array().unwrap();
    assert_eq!(undecided.len(), 1, "{out}");
    assert_eq!(undecided[0]["message_id"], "odd-parked");
    assert!(
        undecided[0]["reason"]
            .as_str()
            .unwrap()
            .contains("requires_confirmation"),
        "{out}"
    );

    // The table and the CSV say the same.
    let (code, table, _) = cli(&["reconcile", "--config", &cfg]);
    assert_eq!(code, 3);
    assert!(table.contains("checked 6 claims, 1 undecided"), "{table}");
    assert!(
        table.contains("odd-parked") && table.contains("requires_confirmation"),
        "the undecided claim and its reason:\n{table}"
    );
    assert!(
        !table.contains("declined-completed --as completed"),
        "{table}"
    );
    let (code, csv, _) = cli(&["reconcile", "--format", "csv", "--config", &cfg]);
    assert_eq!(code, 3);
    let undecided_row = csv
        .lines()
        .find(|l| l.contains("odd-parked"))
        .unwrap_or_else(|| panic!("the undecided claim is in the CSV:\n{csv}"));
    assert!(
        undecided_row.starts_with("undecided,") && undecided_row.contains("requires_confirmation"),
        "{csv}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_payment_is_never_to_be_marked_completed_on_sqlite() {
    declined_payments_are_read_by_value(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_payment_is_never_to_be_marked_completed_on_postgres() {
    let Some(db) = TestStore::pg().await else {
        return;
    };
    declined_payments_are_read_by_value(db).await;
}

async fn lookups_built_from_the_payload(store: TestStore) {
    // The provider knows payments by the order number in the message, not by claimd's key.
    let objects: HashMap<String, Value> =
        [("1001", "succeeded"), ("1002", "requires_payment_method")]
            .into_iter()
            .map(|(order, status)| (order.to_string(), pi(order, status)))
            .collect();
    let provider = provider(objects).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &config(&store.url(), &provider, "{order}?key={key}"),
    );
    let s = open(&store).await;
    for (id, order, state) in [
        ("paid", "1001", ClaimState::Completed),
        ("declined", "1002", ClaimState::Failed),
        ("ghost", "1003", ClaimState::Completed),
    ] {
        claim_in(&s, id, &json!({"order": order, "amount": 5}), state).await;
    }
    let (code, out, err) = cli(&["reconcile", "--format", "json", "--config", &cfg]);
    assert_eq!(
        code, 3,
        "every claim checked, one completed that the provider never saw: {err}\n{out}"
    );
    let audit: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(audit["checked"], 3, "{out}");
    assert_eq!(audit["undecided"], 0, "{out}");
    let found = mismatches(&audit);
    assert_eq!(found.len(), 1, "{out}");
    assert_eq!(found["ghost"].0, "completed_unknown_to_provider");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_lookup_built_from_payload_fields_gets_the_payload_on_sqlite() {
    lookups_built_from_the_payload(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_lookup_built_from_payload_fields_gets_the_payload_on_postgres() {
    let Some(db) = TestStore::pg().await else {
        return;
    };
    lookups_built_from_the_payload(db).await;
}

/// A provider that cannot be reached: nothing decided, exit 1, and each claim listed with why.
async fn undecided_claims_are_listed(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &config(&store.url(), "http://127.0.0.1:9", "{key}"),
    );
    let s = open(&store).await;
    claim_in(&s, "a", &json!({}), ClaimState::Completed).await;
    claim_in(&s, "b", &json!({}), ClaimState::NeedsAttention).await;
    let (code, out, err) = cli(&["reconcile", "--config", &cfg]);
    assert_eq!(code, 1, "nothing could be decided: {out}{err}");
    assert!(out.contains("checked 0 claims, 2 undecided"), "{out}");
    for id in ["a", "b"] {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == id))
            .unwrap_or_else(|| panic!("{id} listed:\n{out}"));
        assert!(line.contains("status endpoint"), "{id}'s reason: {line}");
    }
    assert!(err.contains("status endpoint"), "the first reason: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_undecided_claim_is_listed_with_its_reason_on_sqlite() {
    undecided_claims_are_listed(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_undecided_claim_is_listed_with_its_reason_on_postgres() {
    let Some(db) = TestStore::pg().await else {
        return;
    };
    undecided_claims_are_listed(db).await;
}
