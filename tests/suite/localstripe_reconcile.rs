//! `claimd reconcile` on the Stripe example (`config/examples/stripe.toml`) against localstripe
//! (PyPI, pinned 1.15.10; `.ci/run` installs it and sets `LOCALSTRIPE`), behind the fault
//! proxy of `tests/common/localstripe.rs`, which serves Stripe's search API over localstripe's
//! list (and drops nothing here).
//!
//! The example's request is built from the message's fields, so each lookup needs the claim's
//! payload; and its answers are read by value, so a declined PaymentIntent
//! (`requires_payment_method`) is the provider refusing the payment, never "the provider has
//! it". Every claim is checked; only the claim whose payment succeeded at Stripe is to be
//! marked completed.
//!
//! Under CI=true a missing localstripe or PostgreSQL is a failure; elsewhere the test says
//! why it skips.

use crate::common;

use claimd::domain::claim::{ClaimState, NewClaim};
use claimd::store::{ClaimOutcome, NewEvent, Settlement, Store};
use common::localstripe::*;
use common::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CONSUMER: &str = "stripe-payments";

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/stripe.toml")
}

fn env(store_url: &str, api: &str) -> Vec<(String, String)> {
    [
        ("STRIPE_API", api),
        ("STRIPE_SECRET_KEY", SECRET),
        ("STRIPE_WEBHOOK_SECRET", "whsec_claimd_reconcile_test"),
        ("CLAIMD_STORE_URL", store_url),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn claimd(args: &[&str], env: &[(String, String)]) -> (i32, String, String) {
    let example = example_path();
    let mut full = vec!["--config", example.to_str().unwrap()];
    full.extend_from_slice(args);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    cli_with_env(&full, &env)
}

/// The key the example's template gives a message without a tenant.
fn key(message_id: &str) -> String {
    format!("{CONSUMER}::{message_id}")
}

/// The example's message for `order`, paid with `pm`.
fn message(order: &str, pm: &str) -> Value {
    json!({"amount": 1999, "currency": "eur", "order": order, "payment_method": pm})
}

/// A claim of `message_id` for `payload`, settled in `state`.
async fn claim_in(store: &Store, message_id: &str, payload: &Value, state: ClaimState) {
    let payload = payload.to_string();
    let new = NewClaim {
        consumer: CONSUMER.into(),
        tenant: String::new(),
        message_id: message_id.into(),
        idem_key: key(message_id),
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
        panic!("new claim {message_id}")
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

/// A PaymentIntent for `message_id`'s key, confirmed with `pm` as the example's request makes
/// it (localstripe keeps a declined one, `requires_payment_method`, and answers `402`).
async fn payment_intent(ls: &LocalStripe, pm: &str, message_id: &str) -> Value {
    let form = [
        ("amount", "1999".to_string()),
        ("currency", "eur".into()),
        ("payment_method", pm.into()),
        ("confirm", "true".into()),
        ("metadata[claimd_key]", key(message_id)),
        ("metadata[claimd_message_id]", message_id.into()),
    ];
    client()
        .post(format!("{}/v1/payment_intents", ls.url))
        .bearer_auth(SECRET)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(form).unwrap())
        .send()
        .await
        .unwrap();
    let pis = ls.payment_intents().await;
    pis.into_iter()
        .find(|p| p["metadata"]["claimd_key"] == json!(key(message_id)))
        .unwrap_or_else(|| panic!("a PaymentIntent for {message_id}"))
}

async fn reconciles_the_stripe_example(store_kind: TestStore) {
    let Some(bin) = require_localstripe() else {
        return;
    };
    let ls = LocalStripe::start(&bin).await;
    let proxy = fault_proxy(ls.url.clone(), 0, Arc::new(Mutex::new(Faults::default()))).await;
    let url = store_kind.url();
    let env = env(&url, &proxy);
    let (code, _, err) = claimd(&["migrate"], &env);
    assert_eq!(code, 0, "migrate: {err}");
    let store = claimd::store::open(&url, 2).await.unwrap();
    let ok = ls.payment_method(CARD_OK).await;
    let declined = ls.payment_method(CARD_DECLINED).await;
    let three_ds = ls.payment_method(CARD_3DS).await;
    // (message, payment method or none, the claim's state, the PaymentIntent's status)
    let arranged: [(&str, Option<&str>, ClaimState, &str); 6] = [
        ("paid", Some(&ok), ClaimState::Completed, "succeeded"),
        (
            "declined",
            Some(&declined),
            ClaimState::Failed,
            "requires_payment_method",
        ),
        (
            "3ds",
            Some(&three_ds),
            ClaimState::NeedsAttention,
            "requires_action",
        ),
        (
            "declined-but-completed",
            Some(&declined),
            ClaimState::Completed,
            "requires_payment_method",
        ),
        (
            "paid-but-failed",
            Some(&ok),
            ClaimState::Failed,
            "succeeded",
        ),
        ("never-sent", None, ClaimState::Completed, ""),
    ];
    for (id, pm, state, status) in arranged {
        claim_in(&store, id, &message(id, pm.unwrap_or(&ok)), state).await;
        if let Some(pm) = pm {
            let pi = payment_intent(&ls, pm, id).await;
            assert_eq!(pi["status"], status, "{id}: {pi}");
        }
    }

    // Settled a moment ago: Stripe's search may not show a payment yet (`not_found_after =
    // "90s"` in the example), so "not found" is too recent to judge, never a mismatch.
    let (code, out, err) = claimd(&["reconcile", "--format", "json"], &env);
    assert_eq!(code, 3, "two disagree: {err}\n{out}");
    let audit: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(audit["checked"], 5, "{out}");
    assert_eq!(audit["too_recent"], 1, "{out}");
    assert_eq!(audit["mismatches"].as_array().unwrap().len(), 2, "{out}");
    settled_long_ago(&store_kind, "never-sent").await;

    let (code, out, err) = claimd(&["reconcile", "--format", "json"], &env);
    assert_eq!(code, 3, "every claim checked, three disagree: {err}\n{out}");
    let audit: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(audit["checked"], 6, "{out}");
    assert_eq!(audit["undecided"], 0, "{out}");
    let found: BTreeMap<String, (String, String)> = audit["mismatches"]
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
        .collect();
    let kinds: BTreeMap<&str, &str> = found
        .iter()
        .map(|(id, (kind, _))| (id.as_str(), kind.as_str()))
        .collect();
    assert_eq!(
        kinds,
        BTreeMap::from([
            ("declined-but-completed", "completed_but_refused"),
            ("never-sent", "completed_unknown_to_provider"),
            ("paid-but-failed", "failed_but_applied"),
        ]),
        "{out}"
    );
    for (id, (_, suggestion)) in &found {
        assert_eq!(
            suggestion.contains("--as completed"),
            id == "paid-but-failed",
            "only the succeeded payment is to be marked completed: {id}: {suggestion}"
        );
    }

    let (code, table, _) = claimd(&["reconcile"], &env);
    assert_eq!(code, 3, "{table}");
    assert!(
        table.contains("checked 6 claims, 0 undecided, 3 mismatches"),
        "{table}"
    );
}

/// Moves a claim's settle ten minutes back, as if it had been settled then.
async fn settled_long_ago(store: &TestStore, message_id: &str) {
    use sqlx::Connection;
    match store {
        TestStore::Pg(db) => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query(
                "UPDATE claims SET processed_utc = processed_utc - interval '10 minutes' \
                 WHERE message_id = $1",
            )
            .bind(message_id)
            .execute(&mut c)
            .await
            .unwrap();
        }
        TestStore::Sqlite(_) => {
            let mut c = sqlx::SqliteConnection::connect(&store.url()).await.unwrap();
            sqlx::query(
                "UPDATE claims SET processed_utc = processed_utc - 600000 WHERE message_id = ?1",
            )
            .bind(message_id)
            .execute(&mut c)
            .await
            .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_checks_the_stripe_example_by_value_on_sqlite() {
    reconciles_the_stripe_example(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_checks_the_stripe_example_by_value_on_postgres() {
    let Some(db) = TestStore::pg().await else {
        return;
    };
    reconciles_the_stripe_example(db).await;
}
