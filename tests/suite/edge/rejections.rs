//! What a request the routes cannot read is answered with: a JSON body that is not UTF-8 or
//! nests past the parser's limit is refused `400` on a pass-through consumer as on every other
//! route, nothing claimed.

use crate::common::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_not_utf8_or_nested_too_deep_is_refused_on_a_pass_through_consumer() {
    let (store, sandbox, running) = payments_worker("").await;
    let addr = running.http_addr;
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n)).into_bytes();
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("utf8-1", b"{\"name\":\"caf\xe9\"}".to_vec(), "not UTF-8"),
        ("utf8-2", b"{\"a\":\"\xff\xfe\"}".to_vec(), "not UTF-8"),
        ("deep-1", deep(10_000), "more than 127 levels deep"),
    ];
    for (key, body, says) in &cases {
        let (status, answer) = raw_request(
            addr,
            "/v1/messages/payments",
            &[
                ("Idempotency-Key", key.as_bytes()),
                ("Content-Type", b"application/json"),
            ],
            body,
        )
        .await;
        eprintln!("{key}: {status} {answer}");
        assert_eq!(status, 400, "{key}: {answer}");
        let v: serde_json::Value = serde_json::from_str(&answer).expect("problem+json");
        let detail = v["detail"].as_str().unwrap_or("");
        assert!(
            detail.contains(says),
            "{key}: {detail:?} should say {says:?}"
        );
        assert!(detail.contains("nothing was recorded"), "{detail}");
    }
    // Within the limit, and UTF-8: accepted as before.
    let (status, answer) = raw_request(
        addr,
        "/v1/messages/payments",
        &[
            ("Idempotency-Key", b"deep-ok"),
            ("Content-Type", b"application/json"),
        ],
        &deep(100),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    let db = running.app().store.clone();
    let ids: Vec<String> = claims_in(&db, "payments", None)
        .await
        .into_iter()
        .map(|c| c.message_id)
        .collect();
    assert_eq!(ids, vec!["deep-ok".to_string()], "nothing else claimed");
    running.shutdown(Duration::from_secs(2)).await;
    drop((store, sandbox));
}
