//! Scheduled sends (`Not-Before`), with the sweeper every second: none is sent before its
//! time, each within one sweep period after it, once; they survive a restart; a cancel before
//! the time wins and nothing is sent, a cancel after it is refused, and a cancel racing the
//! sweeper's take leaves each claim either cancelled and never sent, or sent and not cancelled.

use crate::common::*;
use chrono::{DateTime, Utc};
use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::Sandbox;
use claimd::service::run::Running;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

async fn worker(store: &TestStore, provider: &str) -> Running {
    start(&config_toml_with(
        &store.url(),
        "admin_token = \"secret-admin-token\"",
        &consumer_toml("payments", provider, ""),
    ))
    .await
}

async fn post(base: &str, id: &str, not_before: &str) -> reqwest::Response {
    client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", id)
        .header("Not-Before", not_before)
        .json(&json!({ "amount_cents": 100 }))
        .send()
        .await
        .unwrap()
}

async fn cancel(base: &str, id: &str) -> reqwest::Response {
    client()
        .post(format!("{base}/v1/claims/payments/{id}/cancel"))
        .bearer_auth("secret-admin-token")
        .json(&json!({ "reason": "customer changed their mind", "actor": "ann" }))
        .send()
        .await
        .unwrap()
}

fn applied(sandbox: &Sandbox) -> BTreeMap<String, (u64, DateTime<Utc>)> {
    sandbox
        .effects()
        .into_iter()
        .map(|e| (e.key, (e.applied, e.first_applied_utc)))
        .collect()
}

async fn sent_on_time(store: TestStore) {
    let (sandbox, provider) = sandbox(Default::default()).await;
    let running = worker(&store, &provider).await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    let now = Utc::now();
    for i in 0..20 {
        let at = 2.0 + f64::from(i) * 0.2;
        let header = if i % 2 == 0 {
            (now + chrono::Duration::milliseconds((at * 1000.0) as i64)).to_rfc3339()
        } else {
            format!("{}s", at.round() as u32)
        };
        let r = post(&base, &format!("s-{i}"), &header).await;
        assert_eq!(r.status(), 202, "{header}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert!(body.to_string().contains("not_before"), "{body}");
    }
    assert!(
        sandbox.effects().is_empty(),
        "nothing is sent before its time"
    );
    let all_done = eventually(Duration::from_secs(20), || async {
        let mut done = 0;
        for i in 0..20 {
            let c = s
                .get("payments", "", &format!("s-{i}"))
                .await
                .unwrap()
                .unwrap();
            done += usize::from(c.state == ClaimState::Completed);
        }
        done == 20
    })
    .await;
    assert!(all_done, "every scheduled send completed");
    let applied = applied(&sandbox);
    let mut worst = chrono::Duration::zero();
    for i in 0..20 {
        let c = s
            .get("payments", "", &format!("s-{i}"))
            .await
            .unwrap()
            .unwrap();
        let at = c.not_before.expect("stored with its time");
        let (times, first) = applied[&c.idem_key];
        assert_eq!(times, 1);
        assert_eq!(c.attempt, 1, "its first attempt");
        assert!(first >= at, "s-{i} sent at {first}, before its time {at}");
        worst = worst.max(first - at);
        let history = s.events(c.id).await.unwrap();
        assert!(
            history
                .iter()
                .any(|e| e.action == "schedule" && e.outcome == "due"),
            "{:?}",
            lines(&history)
        );
        assert!(
            !history.iter().any(|e| e.outcome == "lease_expired"),
            "its time is no lease running out: {:?}",
            lines(&history)
        );
    }
    println!(
        "scheduled sends ({}): 20 sent, none early, the latest {} ms after its time (sweeper every 1 s)",
        if matches!(store, TestStore::Pg(_)) {
            "postgres"
        } else {
            "sqlite"
        },
        worst.num_milliseconds()
    );
    assert!(
        worst < chrono::Duration::milliseconds(2500),
        "one sweep period (1 s) and the pass's own time: {worst}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

async fn kept_across_a_restart(store: TestStore) {
    let (sandbox, provider) = sandbox(Default::default()).await;
    let running = worker(&store, &provider).await;
    let base = format!("http://{}", running.http_addr);
    for i in 0..10 {
        assert_eq!(post(&base, &format!("r-{i}"), "3s").await.status(), 202);
    }
    running.shutdown(Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(sandbox.effects().is_empty(), "nobody ran meanwhile");
    let running = worker(&store, &provider).await;
    let s = running.app().store.clone();
    let done = eventually(Duration::from_secs(15), || async {
        let mut done = 0;
        for i in 0..10 {
            let c = s
                .get("payments", "", &format!("r-{i}"))
                .await
                .unwrap()
                .unwrap();
            done += usize::from(c.state == ClaimState::Completed);
        }
        done == 10
    })
    .await;
    assert!(done, "every scheduled send survived the restart");
    assert_eq!(sandbox.effects().len(), 10);
    assert!(sandbox.effects().iter().all(|e| e.applied == 1));
    running.shutdown(Duration::from_secs(5)).await;
}

async fn cancelled_before_never_after(store: TestStore) {
    let (sandbox, provider) = sandbox(Default::default()).await;
    let running = worker(&store, &provider).await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    // Refusals name the header.
    for bad in ["tomorrow", "400d"] {
        let r = post(&base, "bad", bad).await;
        assert_eq!(r.status(), 400);
        assert!(r.text().await.unwrap().contains("Not-Before"));
    }
    assert!(s.get("payments", "", "bad").await.unwrap().is_none());
    // Cancelled over HTTP before its time: never sent, failed with the reason.
    assert_eq!(post(&base, "c-1", "30s").await.status(), 202);
    let r = cancel(&base, "c-1").await;
    assert_eq!(r.status(), 200);
    let c = s.get("payments", "", "c-1").await.unwrap().unwrap();
    assert_eq!(c.state, ClaimState::Failed);
    assert!(
        c.last_error
            .unwrap()
            .contains("cancelled before its scheduled time by api:ann")
    );
    // Through the CLI.
    assert_eq!(post(&base, "c-2", "30s").await.status(), 202);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("claimd.toml");
    std::fs::write(
        &cfg,
        config_toml(&store.url(), &consumer_toml("payments", &provider, "")),
    )
    .unwrap();
    let cfg = cfg.to_string_lossy().to_string();
    let (code, out, err) = cli_with_env(
        &[
            "--config",
            &cfg,
            "claims",
            "cancel",
            "payments",
            "c-2",
            "--reason",
            "duplicate order",
        ],
        &[("CLAIMD_OPERATOR", "bob")],
    );
    assert_eq!(code, 0, "{out}{err}");
    let c = s.get("payments", "", "c-2").await.unwrap().unwrap();
    assert_eq!(c.state, ClaimState::Failed);
    // Sent already: too late. Never scheduled: nothing to cancel.
    assert_eq!(post(&base, "c-3", "1s").await.status(), 202);
    let sent = eventually(Duration::from_secs(10), || async {
        s.get("payments", "", "c-3").await.unwrap().unwrap().state == ClaimState::Completed
    })
    .await;
    assert!(sent);
    let r = cancel(&base, "c-3").await;
    assert_eq!(r.status(), 409);
    assert!(r.text().await.unwrap().contains("too late"));
    let r = client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "now")
        .json(&json!({ "amount_cents": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let r = cancel(&base, "now").await;
    assert_eq!(r.status(), 409);
    assert!(r.text().await.unwrap().contains("not a scheduled send"));
    // Cancels racing the sweeper's take, around each claim's time.
    let ids: Vec<String> = (0..20).map(|i| format!("race-{i}")).collect();
    for id in &ids {
        assert_eq!(post(&base, id, "2s").await.status(), 202);
    }
    let mut cancels = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let (base, id) = (base.clone(), id.clone());
        cancels.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500 + 100 * i as u64)).await;
            (id.clone(), cancel(&base, &id).await.status().as_u16())
        }));
    }
    let mut answers = BTreeMap::new();
    for c in cancels {
        let (id, status) = c.await.unwrap();
        answers.insert(id, status);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let applied = applied(&sandbox);
    let (mut won, mut lost) = (0, 0);
    for id in &ids {
        let c = s.get("payments", "", id).await.unwrap().unwrap();
        let sent = applied.contains_key(&c.idem_key);
        match answers[id] {
            200 => {
                won += 1;
                assert_eq!(c.state, ClaimState::Failed, "{id}");
                assert!(!sent, "{id} was cancelled and sent");
            }
            409 => {
                lost += 1;
                assert_eq!(c.state, ClaimState::Completed, "{id}");
                assert!(sent, "{id}: cancel refused but never sent");
            }
            other => panic!("{id}: cancel answered {other}"),
        }
    }
    println!("cancel races: {won} cancelled before their take, {lost} refused after it");
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_sends_are_sent_on_time_sqlite() {
    sent_on_time(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_sends_are_sent_on_time_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    sent_on_time(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_sends_survive_a_restart_sqlite() {
    kept_across_a_restart(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_sends_survive_a_restart_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    kept_across_a_restart(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_sends_cancel_until_taken_sqlite() {
    cancelled_before_never_after(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_sends_cancel_until_taken_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    cancelled_before_never_after(store).await;
}
