//! A parked claim holds its line (`order_hold = "hold"`), visibly: the claim behind it says
//! whom it waits behind (`GET /v1/claims/...`), the report counts it and says how many the
//! parked one holds; resolving the parked claim lets the line go on. With `order_hold =
//! "skip"` the claim behind goes ahead at once and its history says whom it went past. Other
//! lines never wait.

use crate::common::*;
use claimd::domain::claim::ClaimState;
use claimd::service::{app::App, run};
use serde_json::json;
use std::time::Duration;

async fn parked_head_holds_or_is_skipped(store: TestStore) {
    let (sandbox, provider) = sandbox(Default::default()).await;
    let consumers = format!(
        "{}{}",
        consumer_toml("payments", &provider, "order_key = \"{order_id}\""),
        consumer_toml(
            "payouts",
            &provider,
            "order_key = \"{order_id}\"\norder_hold = \"skip\""
        )
    );
    let toml = config_toml_with(
        &store.url(),
        "admin_token = \"secret-admin-token\"",
        &consumers,
    );
    let app = App::open(load(&toml), true).await.unwrap();
    let s = app.store.clone();
    // The head of each line, parked before the worker runs (as the sweeper parks an unknown
    // outcome).
    for consumer in ["payments", "payouts"] {
        let mut head = orphan_claim(consumer, "", "o1-charge", &format!("{consumer}:o1-charge"));
        head.order_key = Some("o1".into());
        park_claim(&s, &head, "outcome unknown: the provider timed out", "test").await;
    }
    let running = run::start(app).await.unwrap();
    let base = format!("http://{}", running.http_addr);
    refuses_enqueue(&store).await;
    let c = client();
    let post = |consumer: &'static str, id: &'static str, order: &'static str| {
        c.post(format!("{base}/v1/messages/{consumer}"))
            .header("Idempotency-Key", id)
            .json(&json!({ "order_id": order, "amount_cents": 100 }))
            .send()
    };
    for consumer in ["payments", "payouts"] {
        assert_eq!(
            post(consumer, "o1-refund", "o1").await.unwrap().status(),
            202
        );
        assert_eq!(
            post(consumer, "o2-charge", "o2").await.unwrap().status(),
            202
        );
    }
    let state = |consumer: &'static str, id: &'static str| {
        let s = s.clone();
        async move { s.get(consumer, "", id).await.unwrap().unwrap().state }
    };
    // Other lines, and the skipping consumer's line, go on.
    for (consumer, id) in [
        ("payments", "o2-charge"),
        ("payouts", "o2-charge"),
        ("payouts", "o1-refund"),
    ] {
        let done = eventually(Duration::from_secs(10), || async {
            state(consumer, id).await == ClaimState::Completed
        })
        .await;
        assert!(done, "{consumer}/{id} did not complete");
    }
    let skipped = s
        .events(s.get("payouts", "", "o1-refund").await.unwrap().unwrap().id)
        .await
        .unwrap();
    assert!(
        skipped.iter().any(|e| e.action == "order"
            && e.outcome == "went_ahead"
            && e.detail.as_deref().unwrap_or("").contains("o1-charge")),
        "the skip is in the history: {:?}",
        lines(&skipped)
    );
    // The held claim waits, visibly.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(state("payments", "o1-refund").await, ClaimState::Started);
    assert!(
        !sandbox
            .effects()
            .iter()
            .any(|e| e.key.contains("payments:o1-refund")),
        "nothing was sent for the held claim"
    );
    let admin = |path: String| {
        c.get(format!("{base}{path}"))
            .bearer_auth("secret-admin-token")
            .send()
    };
    let shown: serde_json::Value = admin("/v1/claims/payments/o1-refund".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        shown["waiting_behind"]["message_id"], "o1-charge",
        "{shown}"
    );
    assert_eq!(shown["waiting_behind"]["state"], "needs_attention");
    assert_eq!(shown["claim"]["order_key"], "o1");
    assert_eq!(
        shown["claim"]["stuck"], false,
        "waiting in a line is not stuck"
    );
    let report: serde_json::Value = admin("/v1/report".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(report["in_line"]["payments"], 1, "{}", report["in_line"]);
    let head = report["attention"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["consumer"] == "payments" && a["message_id"] == "o1-charge")
        .expect("the parked head is listed");
    assert_eq!(head["behind_in_line"], 1);
    // The operator settles the parked head: the line goes on.
    let r = c
        .post(format!("{base}/v1/claims/payments/o1-charge/resolve"))
        .bearer_auth("secret-admin-token")
        .json(&json!({"to": "completed", "note": "paid at the provider", "actor": "ann"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let went = eventually(Duration::from_secs(5), || async {
        state("payments", "o1-refund").await == ClaimState::Completed
    })
    .await;
    assert!(went, "the line did not go on after its head was resolved");
    running.shutdown(Duration::from_secs(5)).await;
}

/// An enqueued claim carries no order key: a producer's enqueue into an ordered consumer is
/// refused, through Rust and (PostgreSQL) through the SQL function, and nothing is written.
async fn refuses_enqueue(store: &TestStore) {
    use claimd::{Enqueue, EnqueueError, enqueue};
    use sqlx::Connection;
    let e = Enqueue::new("payments", "enqueued", br#"{"order_id": "o9"}"#);
    match store {
        TestStore::Pg(db) => {
            let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
            let refused = enqueue(&mut conn, &e).await.unwrap_err();
            assert!(matches!(refused, EnqueueError::Ordered(_)), "{refused}");
            let raw = sqlx::query(
                "SELECT * FROM claimd.enqueue('payments', 'raw', '{\"order_id\": \"o9\"}'::jsonb)",
            )
            .execute(&mut conn)
            .await
            .unwrap_err();
            let code = raw
                .as_database_error()
                .and_then(|d| d.code())
                .unwrap_or_default();
            assert_eq!(code, "CD010", "{raw}");
        }
        TestStore::Sqlite(_) => {
            let mut conn = sqlx::SqliteConnection::connect(&store.url()).await.unwrap();
            let refused = enqueue(&mut conn, &e).await.unwrap_err();
            assert!(matches!(refused, EnqueueError::Ordered(_)), "{refused}");
            assert!(refused.to_string().contains("order_key"), "{refused}");
        }
    }
}

#[tokio::test]
async fn parked_head_holds_or_is_skipped_sqlite() {
    parked_head_holds_or_is_skipped(TestStore::sqlite()).await;
}

#[tokio::test]
async fn parked_head_holds_or_is_skipped_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    parked_head_holds_or_is_skipped(store).await;
}

/// A scheduled claim holds the claims after it in its line, joins the line at its time, and
/// the line then runs in order.
async fn a_scheduled_claim_keeps_its_place(store: TestStore) {
    let (sandbox, provider) = sandbox(Default::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &consumer_toml("payments", &provider, "order_key = \"{order_id}\""),
    ))
    .await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    let c = client();
    let r = c
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "o1-charge")
        .header("Not-Before", "2s")
        .json(&json!({ "order_id": "o1", "amount_cents": 100 }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let r = c
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "o1-refund")
        .json(&json!({ "order_id": "o1", "amount_cents": -100 }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        sandbox.effects().is_empty(),
        "the refund waits behind the scheduled charge"
    );
    let both = eventually(Duration::from_secs(10), || async {
        let mut done = 0;
        for id in ["o1-charge", "o1-refund"] {
            let c = s.get("payments", "", id).await.unwrap().unwrap();
            done += usize::from(c.state == ClaimState::Completed);
        }
        done == 2
    })
    .await;
    assert!(both, "the line ran once the charge's time came");
    let charge = s.get("payments", "", "o1-charge").await.unwrap().unwrap();
    let refund = s.get("payments", "", "o1-refund").await.unwrap().unwrap();
    let applied = |key: &str| {
        sandbox
            .effects()
            .into_iter()
            .find(|e| e.key == key)
            .unwrap()
            .first_applied_utc
    };
    assert!(applied(&charge.idem_key) >= charge.not_before.unwrap());
    assert!(
        applied(&refund.idem_key) >= charge.processed_utc.unwrap(),
        "the refund went after the charge settled"
    );
    let history = s.events(charge.id).await.unwrap();
    assert!(
        history
            .iter()
            .any(|e| e.action == "schedule" && e.outcome == "due"),
        "{:?}",
        lines(&history)
    );
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_scheduled_claim_keeps_its_place_sqlite() {
    a_scheduled_claim_keeps_its_place(TestStore::sqlite()).await;
}

#[tokio::test]
async fn a_scheduled_claim_keeps_its_place_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    a_scheduled_claim_keeps_its_place(store).await;
}
