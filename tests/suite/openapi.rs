//! The OpenAPI document (issue 15): served at `/openapi.json`, valid JSON naming OpenAPI 3.1,
//! and in step with the router: every route `src/edge/api.rs` assembles is documented, and every
//! documented path and method reaches a handler (not the "no such route" fallback, not 405).

use crate::common;

use common::*;
use std::collections::BTreeSet;

/// The paths `src/edge/api.rs` gives to `.route(...)`.
fn routed_paths() -> BTreeSet<String> {
    let src =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/edge/api.rs")).unwrap();
    let mut paths = BTreeSet::new();
    let mut rest = src.as_str();
    while let Some(at) = rest.find(".route(") {
        rest = &rest[at + ".route(".len()..];
        let open = rest.find('"').unwrap();
        let close = rest[open + 1..].find('"').unwrap();
        paths.insert(rest[open + 1..open + 1 + close].to_string());
    }
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_matches_the_routes_that_exist() {
    let (_store, _sandbox, running) = payments_worker("").await;
    let base = format!("http://{}", running.http_addr);
    let r = client()
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let doc: serde_json::Value = r.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().expect("paths");

    let documented: BTreeSet<String> = paths.keys().cloned().collect();
    let routed = routed_paths();
    assert!(routed.len() >= 8, "{routed:?}");
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "routes without documentation: {undocumented:?}"
    );

    for (path, ops) in paths {
        let url = format!(
            "{base}{}",
            path.replace("{consumer}", "payments")
                .replace("{message_id}", "openapi-probe")
        );
        for method in ops.as_object().unwrap().keys() {
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let mut req = client().request(m, &url);
            if method == "post" {
                req = req
                    .header("Idempotency-Key", "openapi-probe")
                    .header("Content-Type", "application/json")
                    .body("{}");
            }
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let body = r.text().await.unwrap();
            assert_ne!(status, 405, "{method} {path}: method not allowed");
            assert!(
                !body.contains("no such route"),
                "{method} {path}: documented but not routed"
            );
            for code in ops[method]["responses"].as_object().unwrap().keys() {
                assert!(
                    code.parse::<u16>().is_ok(),
                    "{method} {path}: response {code}"
                );
            }
        }
    }
    running.shutdown(std::time::Duration::from_secs(2)).await;
}
