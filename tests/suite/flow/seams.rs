//! Where order keys' lines meet schedules, redrives and takeovers (I10, I11): a scheduled
//! claim whose time came is never held by a worker outside its line, so a worker that dies
//! after taking it leaves nothing to re-send; a scheduled claim taken and abandoned is a claim
//! never sent, not an unknown outcome; an operator's redrive of a line's head waits for the
//! claim of its line in flight.

use crate::common::*;
use claimd::domain::claim::{ClaimState, NewClaim};
use claimd::store::{ClaimOutcome, NewEvent, Settlement, Store, WaitingOrder};
use std::time::Duration;

fn far() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() + chrono::Duration::hours(1)
}

/// A claim of `order` in line, or scheduled `in_ms` from now.
fn ordered(id: &str, order: &str, in_ms: Option<i64>) -> NewClaim {
    let mut n = orphan_claim("payments", "", id, &format!("payments:{id}"));
    n.order_key = Some(order.into());
    n.not_before = in_ms.map(|ms| chrono::Utc::now() + chrono::Duration::milliseconds(ms));
    n
}

async fn created(s: &Store, n: &NewClaim) -> claimd::domain::claim::Claim {
    match s.claim(n).await.unwrap() {
        ClaimOutcome::Created(c) => c,
        other => panic!("{} is new: {other:?}", n.message_id),
    }
}

fn sent(sandbox: &claimd::provider::sandbox::Sandbox, key: &str) -> usize {
    sandbox.effects().iter().filter(|e| e.key == key).count()
}

/// The refund behind a parked charge, scheduled: a sweeper of another process finds it due
/// and dies. The refund must not go while the charge is parked, and goes once, as a first
/// send, when the charge is settled.
async fn a_due_scheduled_claim_stays_in_its_line(store: TestStore) {
    let (sandbox, provider) = sandbox(Default::default()).await;
    let toml = config_toml_with(
        &store.url(),
        "admin_token = \"secret-admin-token\"",
        &consumer_toml("payments", &provider, "order_key = \"{order_id}\""),
    );
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    let s = app.store.clone();
    park_claim(
        &s,
        &ordered("o1-charge", "o1", None),
        "outcome unknown",
        "test",
    )
    .await;
    created(&s, &ordered("o1-refund", "o1", Some(300))).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The pass of a sweeper that dies right after its take (SIGKILL, or a store error before
    // the next step): whatever it takes, it never hands on.
    let taken = s
        .take_stale(
            "payments",
            10,
            "dead-worker",
            Duration::from_millis(300),
            far(),
            true,
        )
        .await
        .unwrap();
    assert!(
        taken.iter().all(|t| t.claim.message_id != "o1-refund"),
        "a sweeper took the due refund out of its line: {:?}",
        taken
            .iter()
            .map(|t| &t.claim.message_id)
            .collect::<Vec<_>>()
    );
    let running = claimd::service::run::start(app).await.unwrap();
    // Past the dead sweeper's lease and a few passes of the live one.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let refund = s.get("payments", "", "o1-refund").await.unwrap().unwrap();
    let history = s.events(refund.id).await.unwrap();
    assert_eq!(
        sent(&sandbox, "payments:o1-refund"),
        0,
        "the refund was sent while the charge ahead of it is parked: {:?}",
        lines(&history)
    );
    assert_eq!(refund.state, ClaimState::Started, "{:?}", lines(&history));
    assert!(
        history
            .iter()
            .any(|e| e.action == "schedule" && e.outcome == "due"),
        "{:?}",
        lines(&history)
    );
    // The operator settles the charge: the refund goes, once, as a first send.
    let base = format!("http://{}", running.http_addr);
    let r = client()
        .post(format!("{base}/v1/claims/payments/o1-charge/resolve"))
        .bearer_auth("secret-admin-token")
        .json(&serde_json::json!({"to": "completed", "note": "paid", "actor": "ann"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let done = eventually(Duration::from_secs(10), || async {
        s.get("payments", "", "o1-refund")
            .await
            .unwrap()
            .unwrap()
            .state
            == ClaimState::Completed
    })
    .await;
    let refund = s.get("payments", "", "o1-refund").await.unwrap().unwrap();
    let history = s.events(refund.id).await.unwrap();
    assert!(
        done,
        "the refund did not go after the charge: {:?}",
        lines(&history)
    );
    assert_eq!(sent(&sandbox, "payments:o1-refund"), 1);
    assert_eq!(refund.resent_count, 0, "{:?}", lines(&history));
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_due_scheduled_claim_stays_in_its_line_sqlite() {
    a_due_scheduled_claim_stays_in_its_line(TestStore::sqlite()).await;
}

#[tokio::test]
async fn a_due_scheduled_claim_stays_in_its_line_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    a_due_scheduled_claim_stays_in_its_line(store).await;
}

/// A scheduled send (no order key) taken by a sweeper that died before the call, on a consumer
/// that parks unknown outcomes: the takeover knows it was never sent and sends it, uncounted.
async fn a_scheduled_claim_abandoned_after_its_take_was_never_sent(store: TestStore) {
    let (sandbox, provider) = sandbox(Default::default()).await;
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", &provider, "on_unknown = \"park\""),
    );
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    let s = app.store.clone();
    let mut n = orphan_claim("payments", "", "later", "payments:later");
    n.not_before = Some(chrono::Utc::now() + chrono::Duration::milliseconds(200));
    created(&s, &n).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let taken = s
        .take_stale(
            "payments",
            10,
            "dead-worker",
            Duration::from_millis(300),
            far(),
            true,
        )
        .await
        .unwrap();
    assert_eq!(taken.len(), 1, "the due claim is taken");
    // The dead sweeper never calls. The live one takes it over after the lease.
    let running = claimd::service::run::start(app).await.unwrap();
    let done = eventually(Duration::from_secs(10), || async {
        s.get("payments", "", "later").await.unwrap().unwrap().state != ClaimState::Started
    })
    .await;
    let c = s.get("payments", "", "later").await.unwrap().unwrap();
    let history = s.events(c.id).await.unwrap();
    assert!(done, "{:?}", lines(&history));
    assert_eq!(
        c.state,
        ClaimState::Completed,
        "a claim never sent was treated as an unknown outcome: {:?}",
        lines(&history)
    );
    assert_eq!(c.resent_count, 0, "{:?}", lines(&history));
    assert_eq!(sent(&sandbox, "payments:later"), 1);
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_scheduled_claim_abandoned_after_its_take_was_never_sent_sqlite() {
    a_scheduled_claim_abandoned_after_its_take_was_never_sent(TestStore::sqlite()).await;
}

#[tokio::test]
async fn a_scheduled_claim_abandoned_after_its_take_was_never_sent_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    a_scheduled_claim_abandoned_after_its_take_was_never_sent(store).await;
}

/// `order_hold = "hold"`: the charge failed, the refund behind it went and is in flight; the
/// operator redrives the charge. The charge waits until the refund is settled, then goes.
async fn a_redriven_head_waits_for_the_claim_in_flight(store: TestStore) {
    let (sandbox, provider) = sandbox(Default::default()).await;
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", &provider, "order_key = \"{order_id}\""),
    );
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    let s = app.store.clone();
    let charge = created(&s, &ordered("o1-charge", "o1", None)).await;
    let failed = Settlement {
        state: Some(ClaimState::Failed),
        provider_status: Some(402),
        error: Some("card declined".into()),
        ..Default::default()
    };
    let ev = NewEvent {
        actor: "test",
        action: "perform",
        outcome: "failed",
        provider_status: Some(402),
        detail: None,
    };
    assert!(s.settle(charge.id, 1, &failed, &ev).await.unwrap());
    created(&s, &ordered("o1-refund", "o1", None)).await;
    // The refund is taken by a worker of another process, mid-call.
    let order = WaitingOrder {
        lines: Some(true),
        fair: None,
        aged: 0,
    };
    let taken = s
        .take_waiting(
            "payments",
            10,
            "busy-worker",
            Duration::from_secs(60),
            &order,
            None,
        )
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    let refund = taken[0].claim.clone();
    assert_eq!(refund.message_id, "o1-refund");
    let redriven = s
        .redrive("payments", "", "o1-charge", "ann", None)
        .await
        .unwrap();
    assert!(matches!(redriven, Some(Ok(_))), "{redriven:?}");
    let running = claimd::service::run::start(app).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let charge = s.get("payments", "", "o1-charge").await.unwrap().unwrap();
    let history = s.events(charge.id).await.unwrap();
    assert_eq!(
        sent(&sandbox, "payments:o1-charge"),
        0,
        "the redriven charge ran alongside the refund in flight: {:?}",
        lines(&history)
    );
    assert_eq!(charge.state, ClaimState::Started);
    // Held by its line, it waits: not stuck (no page), counted in its line, not aged.
    let counts = s.counts(None).await.unwrap();
    let c = counts.iter().find(|c| c.consumer == "payments").unwrap();
    assert_eq!(
        (c.stuck, c.in_line),
        (0, 1),
        "a redriven head held by its line counted as stuck: {c:?}"
    );
    // The refund settles: the charge goes.
    let done = Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        ..Default::default()
    };
    let ev = NewEvent {
        actor: "busy-worker",
        action: "perform",
        outcome: "completed",
        provider_status: Some(200),
        detail: None,
    };
    assert!(
        s.settle(refund.id, refund.attempt, &done, &ev)
            .await
            .unwrap()
    );
    let went = eventually(Duration::from_secs(10), || async {
        s.get("payments", "", "o1-charge")
            .await
            .unwrap()
            .unwrap()
            .state
            == ClaimState::Completed
    })
    .await;
    let charge = s.get("payments", "", "o1-charge").await.unwrap().unwrap();
    let history = s.events(charge.id).await.unwrap();
    assert!(
        went,
        "the charge did not go after the refund: {:?}",
        lines(&history)
    );
    assert_eq!(sent(&sandbox, "payments:o1-charge"), 1);
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_redriven_head_waits_for_the_claim_in_flight_sqlite() {
    a_redriven_head_waits_for_the_claim_in_flight(TestStore::sqlite()).await;
}

#[tokio::test]
async fn a_redriven_head_waits_for_the_claim_in_flight_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    a_redriven_head_waits_for_the_claim_in_flight(store).await;
}
