//! Keys, tenants and headers checked before acknowledging (issue 11).

use super::*;

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
