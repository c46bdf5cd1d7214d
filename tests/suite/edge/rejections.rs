//! What a request the routes cannot read is answered with: a JSON body that is not UTF-8 or
//! nests past the parser's limit is refused `400` on a pass-through consumer as on every other
//! route, nothing claimed; a path segment or query value that is not UTF-8, or a number out of
//! range, is a `400` in `application/problem+json` naming the problem, on every route of the
//! OpenAPI document (never axum's `text/plain`, never a search for replacement characters).

use crate::common::*;
use std::time::Duration;

/// A `400` in problem+json whose detail contains `says`.
fn assert_problem(what: &str, status: u16, content_type: &str, body: &str, says: &str) {
    assert_eq!(status, 400, "{what}: {status} {content_type} {body}");
    assert_eq!(
        content_type, "application/problem+json",
        "{what}: {status} {body}"
    );
    let v: serde_json::Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{what}: problem body is not JSON ({e}): {body}"));
    assert_eq!(v["status"], 400, "{what}: {body}");
    let detail = v["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains(says),
        "{what}: detail {detail:?} should say {says:?}"
    );
}

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

async fn get(url: &str) -> (u16, String, String) {
    let r = client().get(url).send().await.unwrap();
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, ct, r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_path_and_query_values_answer_problem_json_naming_the_problem() {
    let (_store, _sandbox, running) = payments_worker("").await;
    let base = format!("http://{}", running.http_addr);
    for (path, says) in [
        ("/v1/messages/payments/%ff%fe", "message_id"),
        ("/v1/claims?limit=99999999999999999999", "limit"),
        ("/v1/claims?q=%ff%fe", "q is not UTF-8"),
        ("/v1/claims?limit=ten", "limit"),
    ] {
        let (status, ct, body) = get(&format!("{base}{path}")).await;
        eprintln!("GET {path}: {status} {ct} {body}");
        assert_problem(&format!("GET {path}"), status, &ct, &body, says);
    }
    running.shutdown(Duration::from_secs(2)).await;
}

/// Every route of the OpenAPI document, with each path parameter in turn not UTF-8, and with
/// each query parameter not UTF-8: `400` problem+json.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_answers_a_bad_path_or_query_with_problem_json() {
    let (_store, _sandbox, running) = payments_worker("").await;
    let base = format!("http://{}", running.http_addr);
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    let mut tried = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            let mut urls = Vec::new();
            for p in &params {
                let name = p["name"].as_str().unwrap();
                let fill = |bad: &str| {
                    path.replace(&format!("{{{name}}}"), bad)
                        .replace("{consumer}", "payments")
                        .replace("{message_id}", "probe-1")
                };
                match p["in"].as_str() {
                    Some("path") => urls.push((fill("%ff%fe"), name.to_string())),
                    Some("query") => urls.push((
                        format!("{}?{name}=%ff%fe", fill("payments")),
                        format!("{name} is not UTF-8"),
                    )),
                    _ => {}
                }
            }
            for (url, says) in urls {
                let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                let mut req = client().request(m, format!("{base}{url}"));
                if method == "post" {
                    req = req
                        .header("Idempotency-Key", "probe-1")
                        .header("Content-Type", "application/json")
                        .body("{}");
                }
                let r = req.send().await.unwrap();
                let status = r.status().as_u16();
                let ct = r
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let body = r.text().await.unwrap();
                assert_problem(&format!("{method} {url}"), status, &ct, &body, &says);
                tried += 1;
            }
        }
    }
    eprintln!("{tried} bad requests, each 400 problem+json");
    assert!(tried >= 25, "only {tried} probes");
    running.shutdown(Duration::from_secs(2)).await;
}
