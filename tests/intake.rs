//! HTTP intake as a client sees it: statuses, problem bodies, duplicates and conflicts, and
//! that refused input leaves the store unchanged.

mod common;

use claimd::sandbox::SandboxOptions;
use claimd::store::ClaimFilter;
use common::*;
use std::time::Duration;

async fn claim_count(running: &claimd::run::Running) -> usize {
    running
        .app()
        .store
        .list(&ClaimFilter {
            limit: 100_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .len()
}

/// consumer, key bytes, body, expected status, expected words in the problem detail.
type Case = (&'static str, Option<Vec<u8>>, Vec<u8>, u16, &'static str);

async fn bad_input_matrix(store: TestStore) {
    let (_sb, provider) = sandbox(SandboxOptions::default()).await;
    let toml = config_toml_with(
        &store.url(),
        "max_body_bytes = 1024",
        &consumer_toml("payments", &provider, ""),
    );
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let c = client();

    let cases: Vec<Case> = vec![
        (
            "payments",
            None,
            b"{}".to_vec(),
            400,
            "Idempotency-Key header is required",
        ),
        (
            "payments",
            Some(vec![b'k'; 300]),
            b"{}".to_vec(),
            400,
            "300 characters long",
        ),
        (
            "payments",
            Some(b"a\tb".to_vec()),
            b"{}".to_vec(),
            400,
            "not visible ASCII",
        ),
        (
            "payments",
            Some(b"a b".to_vec()),
            b"{}".to_vec(),
            400,
            "not visible ASCII",
        ),
        (
            "payments",
            Some(vec![b'a', 0xC3, 0xA9]),
            b"{}".to_vec(),
            400,
            "not visible ASCII",
        ),
        (
            "nosuch",
            Some(b"k1".to_vec()),
            b"{}".to_vec(),
            404,
            "no consumer named \\\"nosuch\\\"",
        ),
        (
            "payments",
            Some(b"k2".to_vec()),
            vec![b'x'; 2048],
            413,
            "over the limit of 1024 bytes",
        ),
    ];
    for (consumer, key, body, status, needle) in cases {
        let path = format!("/v1/messages/{consumer}");
        let (got, text) = match key {
            // Control characters and non-ASCII bytes: no client library sends them, so the
            // request is written by hand.
            Some(k) if k.iter().any(|b| !(0x20..0x7f).contains(b)) => {
                raw_post(running.http_addr, &path, &k, &body).await
            }
            key => {
                let mut req = c.post(format!("{base}{path}")).body(body);
                if let Some(k) = key {
                    req = req.header("Idempotency-Key", k);
                }
                let r = req.send().await.unwrap();
                assert_eq!(
                    r.headers()["content-type"],
                    "application/problem+json",
                    "case {needle}"
                );
                (r.status().as_u16(), r.text().await.unwrap())
            }
        };
        assert_eq!(got, status, "case {needle}: {text}");
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    // A raw control character other than tab never reaches claimd: the HTTP parser refuses
    // the request line itself with a bare 400 (documented in docs/operations.md).
    let (got, _) = raw_post(running.http_addr, "/v1/messages/payments", b"a\x01b", b"{}").await;
    assert_eq!(got, 400);
    assert_eq!(
        claim_count(&running).await,
        0,
        "refused input must leave the store unchanged"
    );

    // New, duplicate, conflict.
    let post = |key: &'static str, body: &'static str| {
        c.post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let r = post("order-1", r#"{"amount":10}"#).await.unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["duplicate"], false);
    assert_eq!(v["message_id"], "order-1");
    assert_eq!(v["consumer"], "payments");
    assert_eq!(v["tenant"], "");
    let r = post("order-1", r#"{"amount":10}"#).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["duplicate"], true);
    let r = post("order-1", r#"{"amount":99}"#).await.unwrap();
    assert_eq!(r.status().as_u16(), 422);
    assert!(r.text().await.unwrap().contains("different payload"));
    assert_eq!(claim_count(&running).await, 1);

    let store = running.app().store.clone();
    assert!(
        eventually(Duration::from_secs(10), || async {
            store
                .get("payments", "", "order-1")
                .await
                .unwrap()
                .unwrap()
                .processed_utc
                .is_some()
        })
        .await,
        "claim should complete"
    );
    let claim = store.get("payments", "", "order-1").await.unwrap().unwrap();
    assert_eq!(claim.duplicate_count, 1);
    assert_eq!(claim.mismatch_count, 1);
    assert_eq!(
        claim.payload, br#"{"amount":10}"#,
        "the first payload is kept verbatim"
    );
    assert_eq!(claim.content_type, "application/json");

    // Read API.
    let r = c
        .get(format!("{base}/v1/messages/payments/order-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["state"], "completed");
    assert!(v["processed_utc"].is_string());
    let r = c
        .get(format!("{base}/v1/messages/payments/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // Tenants are separate keys.
    let r = c
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "order-1")
        .header("Tenant-Id", "acme")
        .body(r#"{"amount":99}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        202,
        "same id under another tenant is a new claim"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_clearly_on_sqlite() {
    bad_input_matrix(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_clearly_on_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    bad_input_matrix(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intake_token_guards_intake_when_configured() {
    let store = TestStore::sqlite();
    let (_sb, provider) = sandbox(SandboxOptions::default()).await;
    let toml = config_toml_with(
        &store.url(),
        "intake_token = \"in-tok\"\nadmin_token = \"adm-tok\"",
        &consumer_toml("payments", &provider, ""),
    );
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    let post = |token: Option<&'static str>| {
        let mut r = c
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", "t1")
            .body("{}");
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    assert_eq!(post(None).await.unwrap().status().as_u16(), 401);
    assert_eq!(
        post(Some("adm-tok")).await.unwrap().status().as_u16(),
        401,
        "the admin token is not the intake token"
    );
    assert_eq!(post(Some("in-tok")).await.unwrap().status().as_u16(), 202);
    let r = c
        .get(format!("{base}/v1/claims"))
        .bearer_auth("in-tok")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        401,
        "the intake token does not open admin routes"
    );
    assert_eq!(
        c.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    running.shutdown(Duration::from_secs(5)).await;
}

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

/// Issue 11 (2 and 4, and the header checks of 5): nothing is acknowledged that would be sent
/// under another message's key, or that the provider could never accept.
async fn keys_and_headers(store: TestStore) {
    let (sb, provider) = sandbox(SandboxOptions::default()).await;
    let consumers = format!(
        "{}{}",
        // The default key template: {consumer}:{tenant}:{message_id}.
        consumer_toml("payments", &provider, ""),
        consumer_toml("plain", &provider, "key = \"{message_id}\""),
    );
    let running = start(&config_toml(&store.url(), &consumers)).await;
    let addr = running.http_addr;
    let body: &[u8] = br#"{"amount":1250}"#;

    // Two tenants, one message id, the same body: two claims, two payments, two keys.
    for tenant in ["acme", "globex"] {
        let (status, text) = raw_request(
            addr,
            "/v1/messages/payments",
            &[
                ("Idempotency-Key", b"order-1"),
                ("Tenant-Id", tenant.as_bytes()),
            ],
            body,
        )
        .await;
        assert_eq!(status, 202, "{tenant}: {text}");
    }
    let store_h = running.app().store.clone();
    assert!(
        eventually(Duration::from_secs(10), || async {
            let mut done = 0;
            for t in ["acme", "globex"] {
                if let Some(c) = store_h.get("payments", t, "order-1").await.unwrap()
                    && c.processed_utc.is_some()
                {
                    done += 1;
                }
            }
            done == 2
        })
        .await,
        "both tenants' claims complete"
    );
    let mut applied: Vec<(String, u64)> = sb
        .effects()
        .into_iter()
        .filter(|e| e.key.ends_with(":order-1"))
        .map(|e| (e.key, e.applied))
        .collect();
    applied.sort();
    assert_eq!(
        applied,
        vec![
            ("payments:acme:order-1".to_string(), 1),
            ("payments:globex:order-1".to_string(), 1)
        ],
        "each tenant's payment happened once, under its own key"
    );

    // A consumer whose key does not mention {tenant} refuses tenants: they would share keys.
    let (status, text) = raw_request(
        addr,
        "/v1/messages/plain",
        &[("Idempotency-Key", b"order-2"), ("Tenant-Id", b"acme")],
        body,
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("does not key on tenants"), "{text}");
    assert!(
        store_h
            .get("plain", "acme", "order-2")
            .await
            .unwrap()
            .is_none()
    );
    let (status, text) = raw_request(
        addr,
        "/v1/messages/plain",
        &[("Idempotency-Key", b"order-2")],
        body,
    )
    .await;
    assert_eq!(status, 202, "without a tenant it is accepted: {text}");

    // A message id the contract accepts whose rendered key the provider would refuse.
    let long_id = "k".repeat(250);
    let (status, text) = raw_request(
        addr,
        "/v1/messages/payments",
        &[("Idempotency-Key", long_id.as_bytes())],
        body,
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("limit is 255"), "{text}");
    assert!(text.contains("max_key_length"), "{text}");
    assert!(
        store_h
            .get("payments", "", &long_id)
            .await
            .unwrap()
            .is_none()
    );
    // Under a template that adds nothing, the same id fits.
    let (status, text) = raw_request(
        addr,
        "/v1/messages/plain",
        &[("Idempotency-Key", long_id.as_bytes())],
        body,
    )
    .await;
    assert_eq!(status, 202, "{text}");

    // Content types that could not be sent on, and repeated identity headers.
    type Headers<'a> = Vec<(&'a str, &'a [u8])>;
    let cases: Vec<(Headers, &str)> = vec![
        (
            vec![
                ("Idempotency-Key", b"ct-1"),
                ("Content-Type", &[0xff, 0xfe]),
            ],
            "not printable ASCII",
        ),
        (
            vec![
                ("Idempotency-Key", b"ct-2"),
                ("Content-Type", b"text/pl\xe9in"),
            ],
            "not printable ASCII",
        ),
        (
            vec![("Idempotency-Key", b"dup-1"), ("Idempotency-Key", b"dup-2")],
            "Idempotency-Key header appears more than once",
        ),
        (
            vec![
                ("Idempotency-Key", b"dup-3"),
                ("Tenant-Id", b"acme"),
                ("Tenant-Id", b"globex"),
            ],
            "Tenant-Id header appears more than once",
        ),
    ];
    for (headers, needle) in cases {
        let (status, text) = raw_request(addr, "/v1/messages/payments", &headers, body).await;
        assert_eq!(status, 400, "{needle}: {text}");
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    for id in ["ct-1", "ct-2", "dup-1", "dup-2", "dup-3"] {
        for t in ["", "acme", "globex"] {
            assert!(
                store_h.get("payments", t, id).await.unwrap().is_none(),
                "{id} must not be claimed"
            );
        }
    }
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_tenants_and_headers_are_checked_before_acknowledging_on_sqlite() {
    keys_and_headers(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_tenants_and_headers_are_checked_before_acknowledging_on_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    keys_and_headers(store).await;
}
