//! Response replay (a retried `POST` after the claim settled answers its outcome with
//! `Idempotent-Replayed: true`) and `Prefer: wait=N` (the answer held until the claim settles
//! or N seconds pass), over HTTP, including a client that hangs up while it waits.

use crate::common::{
    TestStore, client, config_toml_with, consumer_toml, eventually, sandbox, start,
};
use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

async fn worker(latency_ms: u64) -> (claimd::service::run::Running, String, TestStore) {
    let ts = TestStore::sqlite();
    let (sb, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(latency_ms),
        ..Default::default()
    })
    .await;
    std::mem::forget(sb);
    let toml = config_toml_with(
        &ts.url(),
        "max_wait = \"4s\"",
        &consumer_toml("payments", &provider, ""),
    );
    let w = start(&toml).await;
    let base = format!("http://{}", w.http_addr);
    (w, base, ts)
}

async fn post(base: &str, key: &str, body: &str, prefer: Option<&str>) -> reqwest::Response {
    let mut r = client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_string());
    if let Some(p) = prefer {
        r = r.header("Prefer", p);
    }
    r.send().await.unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test]
async fn a_retry_after_the_claim_settled_replays_its_outcome() {
    let (w, base, _ts) = worker(600).await;
    let first = post(&base, "order-1", r#"{"amount":5}"#, None).await;
    assert_eq!(first.status(), 202);
    // Before it settled: what it answered before (a duplicate, not a replay).
    let early = post(&base, "order-1", r#"{"amount":5}"#, None).await;
    assert_eq!(early.status(), 200);
    assert_eq!(header(&early, "Idempotent-Replayed"), None);
    let v: Value = early.json().await.unwrap();
    assert_eq!(
        (v["state"].as_str(), v["duplicate"].as_bool()),
        (Some("started"), Some(true))
    );
    let done = eventually(Duration::from_secs(10), || async {
        w.app()
            .store
            .get("payments", "", "order-1")
            .await
            .unwrap()
            .unwrap()
            .state
            == ClaimState::Completed
    })
    .await;
    assert!(done);
    let replay = post(&base, "order-1", r#"{"amount":5}"#, None).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(
        header(&replay, "Idempotent-Replayed").as_deref(),
        Some("true")
    );
    let v: Value = replay.json().await.unwrap();
    assert_eq!(v["state"], "completed");
    assert_eq!(v["provider_status"], 200);
    assert!(
        v["provider_answer"].as_str().is_some_and(|a| !a.is_empty()),
        "{v}"
    );
    // Another body under the same key is still refused, never replayed.
    let other = post(&base, "order-1", r#"{"amount":6}"#, None).await;
    assert_eq!(other.status(), 422);
    assert_eq!(header(&other, "Idempotent-Replayed"), None);
    w.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn prefer_wait_holds_the_answer_until_the_outcome_or_the_time_is_up() {
    let (w, base, _ts) = worker(300).await;
    // Settles within the wait: 200 with the outcome.
    let r = post(&base, "w-1", "{}", Some("wait=3")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "Preference-Applied").as_deref(), Some("wait=3"));
    assert_eq!(
        header(&r, "Idempotent-Replayed"),
        None,
        "a first request is no replay"
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["state"], "completed");
    assert_eq!(v["provider_status"], 200);
    // GET waits the same way (already settled: at once).
    let g = client()
        .get(format!("{base}/v1/messages/payments/w-1"))
        .header("Prefer", "wait=3")
        .send()
        .await
        .unwrap();
    assert_eq!(g.status(), 200);
    assert_eq!(header(&g, "Preference-Applied").as_deref(), Some("wait=3"));
    // More than max_wait is capped (4s); a wait shorter than the call: 202 as before.
    w.shutdown(Duration::from_secs(2)).await;
    let (w, base, _ts) = worker(2500).await;
    let t = Instant::now();
    let r = post(&base, "w-2", "{}", Some("respond-async, wait=1")).await;
    assert_eq!(r.status(), 202);
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(header(&r, "Preference-Applied").as_deref(), Some("wait=1"));
    assert_eq!(r.json::<Value>().await.unwrap()["state"], "started");
    let r = post(&base, "w-2", "{}", Some("wait=100")).await;
    assert_eq!(header(&r, "Preference-Applied").as_deref(), Some("wait=4"));
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "Idempotent-Replayed").as_deref(), Some("true"));
    assert_eq!(r.json::<Value>().await.unwrap()["state"], "completed");
    w.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_client_that_hangs_up_while_waiting_changes_nothing() {
    let (w, base, _ts) = worker(800).await;
    let body = b"{}";
    let mut s = tokio::net::TcpStream::connect(w.http_addr).await.unwrap();
    let req = format!(
        "POST /v1/messages/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: hang-1\r\nContent-Type: application/json\r\nPrefer: wait=4\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(s);
    // The claim was committed before the wait: it completes once, and the worker still
    // answers.
    let done = eventually(Duration::from_secs(10), || async {
        w.app()
            .store
            .get("payments", "", "hang-1")
            .await
            .unwrap()
            .is_some_and(|c| c.state == ClaimState::Completed)
    })
    .await;
    assert!(done, "the claim completes after its client hung up");
    let c = w
        .app()
        .store
        .get("payments", "", "hang-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((c.attempt, c.duplicate_count), (1, 0));
    let r = post(&base, "hang-1", "{}", None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "Idempotent-Replayed").as_deref(), Some("true"));
    w.shutdown(Duration::from_secs(2)).await;
}
