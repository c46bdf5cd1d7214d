//! A consumer at its limits: `503` + `Retry-After` with nothing committed, a `park` consumer
//! that claims no further than its calls, a claim that waited out its lease handed off.

use super::*;

/// A `payments` consumer calling the sandbox at `provider` without a status endpoint, with
/// the given concurrency, lease, `on_unknown` and call timeout.
fn plain_consumer(
    provider: &str,
    concurrency: u32,
    lease: &str,
    on_unknown: &str,
    timeout: &str,
) -> String {
    format!(
        r#"
[[consumers]]
name = "payments"
source = "http"
concurrency = {concurrency}
lease = "{lease}"
max_attempts = 5
redrive_within = "1h"
on_unknown = "{on_unknown}"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "{timeout}"
"#
    )
}

/// Saturation, as DESIGN.md asks it documented and tested. A consumer that claims ahead
/// (`redrive`) holds `concurrency` calls in flight plus `concurrency` claimed deliveries
/// waiting for a slot; a `park` consumer only its `concurrency` calls. Beyond that intake waits
/// `intake_wait`, then answers `503` with `Retry-After` and commits nothing.
async fn saturation(on_unknown: &str, accepted: usize) {
    let store = TestStore::sqlite();
    let (sb, provider) = sandbox(SandboxOptions {
        latency: Duration::from_secs(2),
        ..Default::default()
    })
    .await;
    let consumer = plain_consumer(&provider, 2, "20s", on_unknown, "5s");
    let running = start(&config_toml_with(
        &store.url(),
        "intake_wait = \"300ms\"",
        &consumer,
    ))
    .await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    let post = |key: String| {
        c.post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", key)
            .body("{\"amount\":1}")
            .send()
    };
    // Two calls in flight, then (claiming ahead) two claimed deliveries waiting for a slot.
    for i in 0..accepted {
        if i == 2 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(post(format!("s{i}")).await.unwrap().status().as_u16(), 202);
    }
    let r = post("late".into()).await.unwrap();
    assert_eq!(
        r.status().as_u16(),
        503,
        "{on_unknown}: the next delivery finds no room"
    );
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert!(r.text().await.unwrap().contains("concurrency limit"));
    assert_eq!(
        claim_count(&running).await,
        accepted,
        "the refused one left no claim"
    );
    assert_eq!(sb.requests(), 2, "two calls at once, never more");

    // The waiting ones get their turn; the refused one, sent again, is taken.
    assert!(
        eventually(Duration::from_secs(15), || async {
            sb.effects().len() == accepted
        })
        .await
    );
    assert_eq!(post("late".into()).await.unwrap().status().as_u16(), 202);
    assert!(
        eventually(Duration::from_secs(15), || async {
            sb.effects().len() == accepted + 1
        })
        .await
    );
    running.shutdown(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_consumer_answers_503_and_commits_nothing() {
    saturation("redrive", 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_park_consumer_claims_no_further_than_its_calls() {
    saturation("park", 2).await;
}

/// A claimed delivery that waited for a call slot until too little lease was left (a consumer
/// that claims ahead: `redrive`) is handed to the sweeper as "not called": the sweeper performs
/// it as a first send, not as a re-send after an unknown outcome (`resent` stays 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waited_out_its_lease_is_handed_off_as_not_called() {
    let store = TestStore::sqlite();
    let (sb, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(900),
        ..Default::default()
    })
    .await;
    let consumer = plain_consumer(&provider, 1, "1500ms", "redrive", "1s");
    let running = start(&config_toml(&store.url(), &consumer)).await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    for key in ["w1", "w2"] {
        let r = c
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", key)
            .body("{\"amount\":1}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
    let store = &running.app().store;
    assert!(
        eventually(Duration::from_secs(20), || async {
            let w2 = store.get("payments", "", "w2").await.unwrap();
            w2.is_some_and(|c| c.state.is_terminal())
        })
        .await,
        "w2 was never settled"
    );
    for key in ["w1", "w2"] {
        let claim = store.get("payments", "", key).await.unwrap().unwrap();
        assert_eq!(
            claim.state.as_str(),
            "completed",
            "{key}: {:?}",
            claim.last_error
        );
    }
    let w2 = store.get("payments", "", "w2").await.unwrap().unwrap();
    let events = store.events(w2.id).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.action == "handoff" && e.outcome == "not_applied"),
        "{events:?}"
    );
    assert_eq!(
        w2.resent_count, 0,
        "performed as a first send, not a re-send"
    );
    assert!(sb.effects().iter().all(|e| e.applied == 1));
    assert_eq!(sb.effects().len(), 2);
    running.shutdown(Duration::from_secs(3)).await;
}
