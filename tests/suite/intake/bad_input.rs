//! Refused input: every bad request answered with its status and a problem body that says
//! why, the store unchanged; the intake token.

use super::*;

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
        &claim.payload[..],
        br#"{"amount":10}"#,
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
        "intake_token = \"in-tok-0123456789ab\"\nadmin_token = \"adm-tok-0123456789ab\"",
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
        post(Some("adm-tok-0123456789ab"))
            .await
            .unwrap()
            .status()
            .as_u16(),
        401,
        "the admin token is not the intake token"
    );
    assert_eq!(
        post(Some("in-tok-0123456789ab"))
            .await
            .unwrap()
            .status()
            .as_u16(),
        202
    );
    let r = c
        .get(format!("{base}/v1/claims"))
        .bearer_auth("in-tok-0123456789ab")
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
