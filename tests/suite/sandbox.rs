//! Integration tests for the sandbox provider, over real HTTP on loopback.

use std::net::SocketAddr;
use std::time::Duration;

use claimd::provider::sandbox::{EffectRecord, Sandbox, SandboxOptions};
use serde_json::Value;
use tokio::sync::oneshot;

/// A running sandbox; shuts it down when dropped.
struct Running {
    sandbox: Sandbox,
    base: String,
    _stop: oneshot::Sender<()>,
}

async fn start(options: SandboxOptions) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let sandbox = Sandbox::new(options);
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(sandbox.clone().serve(listener, async move {
        let _ = stopped.await;
    }));
    Running {
        sandbox,
        base: format!("http://{addr}"),
        _stop: stop,
    }
}

fn client() -> reqwest::Client {
    claimd::provider::tls::http_client_builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &str,
) -> reqwest::Result<reqwest::Response> {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    request.send().await
}

async fn json(response: reqwest::Response) -> Value {
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

async fn effect(client: &reqwest::Client, base: &str, key: &str) -> (u16, Value) {
    let response = client
        .get(format!("{base}/v1/effects/{key}"))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, json(response).await)
}

#[tokio::test]
async fn first_post_applies_once_and_replay_returns_the_same_body() {
    let sb = start(SandboxOptions::default()).await;
    let c = client();
    let url = format!("{}/v1/payments", sb.base);
    let body = r#"{"amount":100}"#;

    let first = post(&c, &url, Some("k-1"), body).await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_body = first.bytes().await.unwrap();
    let first_json: Value = serde_json::from_slice(&first_body).unwrap();
    assert_eq!(first_json["key"], "k-1");
    assert_eq!(first_json["status"], "succeeded");
    assert_eq!(first_json["path"], "/v1/payments");
    assert!(first_json["id"].as_str().unwrap().starts_with("eff_"));

    let (status, record) = effect(&c, &sb.base, "k-1").await;
    assert_eq!(status, 200);
    assert_eq!(record["applied"], 1);

    let replay = post(&c, &url, Some("k-1"), body).await.unwrap();
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(replay.bytes().await.unwrap(), first_body);

    let records = sb.sandbox.effects();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].applied, 1);
    assert_eq!(records[0].key, "k-1");
    assert_eq!(records[0].path, "/v1/payments");
    assert_eq!(records[0].response, first_json);
    assert_eq!(sb.sandbox.requests(), 2);
}

#[tokio::test]
async fn same_key_with_a_different_body_is_422() {
    let sb = start(SandboxOptions::default()).await;
    let c = client();
    let url = format!("{}/v1/payments", sb.base);
    assert_eq!(
        post(&c, &url, Some("k-2"), "a").await.unwrap().status(),
        200
    );
    let changed = post(&c, &url, Some("k-2"), "b").await.unwrap();
    assert_eq!(changed.status(), 422);
    assert_eq!(
        changed.headers().get("content-type").unwrap(),
        "application/problem+json"
    );
    assert_eq!(sb.sandbox.effects()[0].applied, 1);
}

#[tokio::test]
async fn missing_or_invalid_key_is_400() {
    let sb = start(SandboxOptions::default()).await;
    let c = client();
    let url = format!("{}/v1/payments", sb.base);

    let missing = post(&c, &url, None, "{}").await.unwrap();
    assert_eq!(missing.status(), 400);
    let problem = json(missing).await;
    assert_eq!(problem["status"], 400);

    let too_long = "x".repeat(256);
    let invalid = post(&c, &url, Some(&too_long), "{}").await.unwrap();
    assert_eq!(invalid.status(), 400);
    let spaced = post(&c, &url, Some("has space"), "{}").await.unwrap();
    assert_eq!(spaced.status(), 400);

    assert!(sb.sandbox.effects().is_empty());
    assert_eq!(sb.sandbox.requests(), 3);
}

#[tokio::test]
async fn concurrent_repeat_during_latency_is_409() {
    let sb = start(SandboxOptions {
        latency: Duration::from_millis(300),
        ..SandboxOptions::default()
    })
    .await;
    let c = client();
    let url = format!("{}/v1/payments", sb.base);

    let first = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move { post(&c, &url, Some("k-3"), "x").await.unwrap().status() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = post(&c, &url, Some("k-3"), "x").await.unwrap().status();
    let first = first.await.unwrap();

    assert_eq!(first, 200);
    assert_eq!(second, 409);
    // While in flight the key is not visible; afterwards it is applied exactly once.
    let (status, record) = effect(&c, &sb.base, "k-3").await;
    assert_eq!(status, 200);
    assert_eq!(record["applied"], 1);
}

#[tokio::test]
async fn fail_rate_one_is_503_and_nothing_is_applied() {
    let sb = start(SandboxOptions {
        fail_rate: 1.0,
        ..SandboxOptions::default()
    })
    .await;
    let c = client();
    let response = post(&c, &format!("{}/v1/payments", sb.base), Some("k-4"), "x")
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let (status, body) = effect(&c, &sb.base, "k-4").await;
    assert_eq!(status, 404);
    assert_eq!(body, serde_json::json!({"error": "not found"}));
    assert!(sb.sandbox.effects().is_empty());
}

#[tokio::test]
async fn ambiguous_rate_one_applies_then_fails_or_drops() {
    ambiguous_outcomes(Duration::ZERO).await;
}

#[tokio::test]
async fn ambiguous_rate_one_with_latency_applies_then_fails_or_drops() {
    ambiguous_outcomes(Duration::from_millis(5)).await;
}

async fn ambiguous_outcomes(latency: Duration) {
    let sb = start(SandboxOptions {
        ambiguous_rate: 1.0,
        latency,
        ..SandboxOptions::default()
    })
    .await;
    let c = client();
    let url = format!("{}/v1/payments", sb.base);
    let (mut saw_500, mut saw_drop) = (false, false);
    for i in 0..16 {
        let key = format!("amb-{i}");
        match post(&c, &url, Some(&key), "x").await {
            Ok(response) => {
                assert_eq!(response.status(), 500);
                saw_500 = true;
            }
            Err(error) => {
                assert!(
                    !error.is_timeout(),
                    "expected a dropped connection: {error}"
                );
                assert!(error.status().is_none());
                saw_drop = true;
            }
        }
        let (status, record) = effect(&c, &sb.base, &key).await;
        assert_eq!(status, 200, "{key} must be recorded as applied");
        assert_eq!(record["applied"], 1);
    }
    // 2^-16 chance of a false failure each.
    assert!(saw_500 && saw_drop, "500: {saw_500}, drop: {saw_drop}");
}

#[tokio::test]
async fn retry_after_ambiguous_outcome_replays_without_reapplying() {
    let sb = start(SandboxOptions {
        ambiguous_rate: 1.0,
        ..SandboxOptions::default()
    })
    .await;
    let c = client();
    let url = format!("{}/v1/payments", sb.base);
    let _ = post(&c, &url, Some("k-5"), "x").await;
    // Replays are not subject to the ambiguous roll: they apply nothing.
    let retry = post(&c, &url, Some("k-5"), "x").await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(sb.sandbox.effects()[0].applied, 1);
}

#[tokio::test]
async fn ignore_keys_applies_every_request() {
    let sb = start(SandboxOptions {
        ignore_keys: true,
        ..SandboxOptions::default()
    })
    .await;
    let c = client();
    let url = format!("{}/v1/payments", sb.base);
    let a = post(&c, &url, Some("k-6"), "x").await.unwrap();
    let b = post(&c, &url, Some("k-6"), "x").await.unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(b.status(), 200);
    assert!(b.headers().get("idempotent-replayed").is_none());
    let (a, b) = (json(a).await, json(b).await);
    assert_ne!(a["id"], b["id"], "each request is a new effect");
    // A different body under the same key is no conflict either.
    assert_eq!(
        post(&c, &url, Some("k-6"), "y").await.unwrap().status(),
        200
    );
    let (status, record) = effect(&c, &sb.base, "k-6").await;
    assert_eq!(status, 200);
    assert_eq!(record["applied"], 3);

    // No key at all is accepted too.
    assert_eq!(post(&c, &url, None, "z").await.unwrap().status(), 200);
    let effects = sb.sandbox.effects();
    assert_eq!(effects.len(), 2);
    assert_eq!(effects.iter().map(|e| e.applied).sum::<u64>(), 4);
}

#[tokio::test]
async fn effects_lists_every_key_sorted() {
    let sb = start(SandboxOptions::default()).await;
    let c = client();
    for key in ["b", "c", "a"] {
        let url = format!("{}/v1/things/{key}", sb.base);
        assert_eq!(post(&c, &url, Some(key), key).await.unwrap().status(), 200);
    }
    let response = c
        .get(format!("{}/v1/effects", sb.base))
        .header("Idempotency-Key", "ignored")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let listed: Value = json(response).await;
    let records: Vec<EffectRecord> = serde_json::from_value(listed["effects"].clone()).unwrap();
    let keys: Vec<&str> = records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["a", "b", "c"]);
    assert!(records.iter().all(|r| r.applied == 1));
    assert_eq!(records[0].path, "/v1/things/a");
    assert_eq!(records, sb.sandbox.effects());
}

#[tokio::test]
async fn effect_lookup_decodes_percent_escapes() {
    let sb = start(SandboxOptions::default()).await;
    let c = client();
    let url = format!("{}/v1/payments", sb.base);
    assert_eq!(
        post(&c, &url, Some("tenant/a:1"), "x")
            .await
            .unwrap()
            .status(),
        200
    );
    let (status, record) = effect(&c, &sb.base, "tenant%2Fa%3A1").await;
    assert_eq!(status, 200);
    assert_eq!(record["key"], "tenant/a:1");
    let (status, _) = effect(&c, &sb.base, "tenant/a:1").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn keep_alive_serves_many_requests_on_pooled_connections() {
    let sb = start(SandboxOptions::default()).await;
    let c = client();
    let url = format!("{}/v1/payments", sb.base);
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..100 {
                let key = format!("w{worker}-{i}");
                let response = post(&c, &url, Some(&key), "x").await.unwrap();
                assert_eq!(response.status(), 200);
                let _ = response.bytes().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let effects = sb.sandbox.effects();
    assert_eq!(effects.len(), 800);
    assert!(effects.iter().all(|e| e.applied == 1));
    assert_eq!(sb.sandbox.requests(), 800);
}

#[tokio::test]
async fn unknown_routes_and_methods_are_rejected() {
    let sb = start(SandboxOptions::default()).await;
    let c = client();
    let put = c
        .put(format!("{}/v1/payments", sb.base))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 405);
    assert_eq!(put.headers()["allow"], "GET, POST");
    let outside = c.post(format!("{}/other", sb.base)).send().await.unwrap();
    assert_eq!(outside.status(), 404);
    let post_effects = post(&c, &format!("{}/v1/effects", sb.base), Some("k"), "x")
        .await
        .unwrap();
    assert_eq!(post_effects.status(), 405);
    assert_eq!(sb.sandbox.requests(), 0);
}

#[tokio::test]
async fn serve_returns_after_shutdown() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(Sandbox::new(SandboxOptions::default()).serve(
        listener,
        async move {
            let _ = stopped.await;
        },
    ));
    let c = client();
    // Leave an idle keep-alive connection open.
    let response = post(&c, &format!("http://{addr}/v1/p"), Some("k"), "x")
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(2), server)
        .await
        .expect("serve must return promptly")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn effect_is_applied_even_when_the_client_gives_up_mid_flight() {
    let sb = start(SandboxOptions {
        latency: Duration::from_millis(200),
        ..SandboxOptions::default()
    })
    .await;
    let impatient = claimd::provider::tls::http_client_builder()
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let url = format!("{}/v1/payments", sb.base);
    let error = post(&impatient, &url, Some("k-7"), "x").await.unwrap_err();
    assert!(error.is_timeout());
    // Still in flight: a retry is told to come back later.
    let c = client();
    assert_eq!(
        post(&c, &url, Some("k-7"), "x").await.unwrap().status(),
        409
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    let retry = post(&c, &url, Some("k-7"), "x").await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(sb.sandbox.effects()[0].applied, 1);
}

/// `GET /v1/<objects>` lists what was applied under that path, oldest first, a page at a
/// time, as Stripe lists objects; `claimd reconcile --ledger` reads it.
#[tokio::test]
async fn the_list_of_a_path_pages_through_its_objects() {
    let sb = start(SandboxOptions::default()).await;
    let c = client();
    for i in 0..3 {
        let body = format!(r#"{{"amount": {}, "currency": "EUR"}}"#, 100 + i);
        let r = post(
            &c,
            &format!("{}/v1/payments", sb.base),
            Some(&format!("p{i}")),
            &body,
        )
        .await
        .unwrap();
        assert_eq!(r.status(), 200);
    }
    post(&c, &format!("{}/v1/refunds", sb.base), Some("r0"), "{}")
        .await
        .unwrap();
    let page = |query: String| {
        let c = c.clone();
        let url = format!("{}/v1/payments?{query}", sb.base);
        async move { json(c.get(url).send().await.unwrap()).await }
    };
    let first = page("limit=2".into()).await;
    assert_eq!(first["has_more"], true, "{first}");
    let data = first["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!(data[0]["key"], "p0");
    assert_eq!(data[0]["amount"], 100);
    assert_eq!(data[0]["currency"], "EUR");
    assert!(data[0]["created"].as_i64().unwrap() > 1_700_000_000);
    let last = data[1]["id"].as_str().unwrap();
    let second = page(format!("limit=2&starting_after={last}")).await;
    assert_eq!(second["has_more"], false, "{second}");
    assert_eq!(second["data"].as_array().unwrap().len(), 1);
    assert_eq!(second["data"][0]["key"], "p2");
    // Outside the window: nothing.
    let none = page("created[lt]=1000".into()).await;
    assert_eq!(none["data"].as_array().unwrap().len(), 0);
    let bad = c
        .get(format!("{}/v1/payments?limit=500", sb.base))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}
