//! Effect URL templates cannot leave their path segment or choose the host. A payload field,
//! the message id or the tenant that would make a path segment `.`, `..` (also
//! percent-encoded) or empty is refused at intake (HTTP `400` naming the field, AMQP dead
//! letter with the same sentence), nothing is claimed, the provider receives nothing; a claim
//! stored before the check is not sent either. A placeholder in the scheme, host or port of
//! `effect.url` or `effect.status_url` stops the configuration from loading (exit 2).
//! Over real sockets: a provider on loopback records every path it is asked for.

use crate::common::amqp::{TestQueues, header};
use crate::common::*;
use claimd::domain::claim::{ClaimState, NewClaim};
use claimd::store::{ClaimOutcome, NewEvent, Settlement, Store};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A provider that records `METHOD /path` of every request: `GET`s (lookups) answer `404`
/// (no record), anything else `200` with an object.
#[derive(Clone)]
struct PathProvider {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl PathProvider {
    async fn start() -> PathProvider {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let recorded = recorded.clone();
            async move {
                let line = format!("{} {}", req.method(), req.uri().path());
                recorded.lock().unwrap().push(line);
                if req.method() == axum::http::Method::GET {
                    (axum::http::StatusCode::NOT_FOUND, "{}")
                } else {
                    (axum::http::StatusCode::OK, r#"{"id":"po_1"}"#)
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        PathProvider { url, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    fn posts(&self) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|l| l.starts_with("POST "))
            .collect()
    }
}

/// The `[consumers.effect]` table of a payout to `/v1/accounts/{account}/payouts`.
fn payout_effect(provider: &str) -> String {
    format!(
        r#"
[consumers.effect]
kind = "http"
url = "{provider}/v1/accounts/{{account}}/payouts"
timeout = "1s"
status_url = "{provider}/v1/effects/{{key}}"
"#
    )
}

/// An HTTP consumer `name` with `effect`.
fn http_consumer(name: &str, provider: &str, effect: &str) -> String {
    consumer_toml(name, provider, "").replace(
        &format!(
            "\n[consumers.effect]\nkind = \"http\"\nurl = \"{provider}/v1/{name}\"\ntimeout = \"1s\"\nstatus_url = \"{provider}/v1/effects/{{key}}\"\n"
        ),
        effect,
    )
}

/// Posts a message; the status and the problem's `detail` (or the whole body).
async fn post(base: &str, consumer: &str, id: &str, body: &str) -> (u16, String) {
    let r = client()
        .post(format!("{base}/v1/messages/{consumer}"))
        .header("Idempotency-Key", id)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let detail = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["detail"].as_str().map(str::to_string));
    (status, detail.unwrap_or(text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_segments_in_url_fields_are_refused_at_http_intake_on_both_stores() {
    let mut stores = vec![("sqlite", TestStore::sqlite())];
    if let Some(pg) = TestStore::pg().await {
        stores.push(("postgres", pg));
    }
    for (name, store) in stores {
        refused_at_http_intake(name, &store).await;
    }
}

async fn refused_at_http_intake(store_name: &str, store: &TestStore) {
    let provider = PathProvider::start().await;
    let consumers = format!(
        "{}{}",
        http_consumer("payouts", &provider.url, &payout_effect(&provider.url)),
        http_consumer(
            "items",
            &provider.url,
            &payout_effect(&provider.url)
                .replace("accounts/{account}/payouts", "items/{message_id}"),
        ),
    );
    assert!(
        consumers.contains("/v1/items/{message_id}")
            && consumers.contains("/v1/accounts/{account}/payouts"),
        "{consumers}"
    );
    let running = start(&config_toml(&store.url(), &consumers)).await;
    let base = format!("http://{}", running.http_addr);
    let st = running.app().store.clone();

    let mut table = Vec::new();
    for (i, value) in ["..", ".", "%2e%2e", ".%2E", "%2e", "%252e%252e", "../x", ""]
        .iter()
        .enumerate()
    {
        let id = format!("bad-{i}");
        let body = serde_json::json!({ "account": value, "amount": 5 }).to_string();
        let (status, text) = post(&base, "payouts", &id, &body).await;
        table.push((format!("account = {value:?}"), status));
        assert_eq!(status, 400, "{store_name}: account {value:?}: {text}");
        assert!(
            text.contains("URL field account is")
                && text.contains(&format!("{value:?}"))
                && text.contains("nothing was recorded"),
            "{store_name}: names the field and the value: {text}"
        );
        assert!(
            st.get("payouts", "", &id).await.unwrap().is_none(),
            "{store_name}: nothing claimed for {value:?}"
        );
    }
    // The message id is a URL field too.
    let (status, text) = post(&base, "items", "..", "{}").await;
    table.push(("message id \"..\" in /v1/items/{message_id}".into(), status));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("URL field message_id is \"..\""), "{text}");
    assert!(st.get("items", "", "..").await.unwrap().is_none());

    // A normal value goes where the template says.
    let (status, text) = post(&base, "payouts", "good-1", r#"{"account":"acct_1"}"#).await;
    table.push(("account = \"acct_1\"".into(), status));
    assert_eq!(status, 202, "{text}");
    let done = eventually(Duration::from_secs(10), || async {
        st.get("payouts", "", "good-1")
            .await
            .unwrap()
            .is_some_and(|c| c.state == ClaimState::Completed)
    })
    .await;
    assert!(done, "{store_name}: the good claim completes");
    assert_eq!(
        provider.posts(),
        vec!["POST /v1/accounts/acct_1/payouts".to_string()],
        "{store_name}: the provider received only the good call"
    );
    eprintln!("url_templates, HTTP intake on {store_name}:");
    eprintln!("  {:<46} status", "input");
    for (input, status) in &table {
        eprintln!("  {input:<46} {status}");
    }
    running.shutdown(Duration::from_secs(5)).await;
}

/// A placeholder before the path of `effect.url` or `effect.status_url` stops the load with
/// exit 2, naming the setting, the placeholder and why.
#[test]
fn a_placeholder_in_the_host_or_port_stops_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("claims.db").display());
    let effect = |url: &str, status_url: &str| {
        format!(
            "\n[consumers.effect]\nkind = \"http\"\nurl = \"{url}\"\ntimeout = \"1s\"\nstatus_url = \"{status_url}\"\n"
        )
    };
    let ok_status = "http://127.0.0.1:9/v1/effects/{key}";
    for (url, status_url, setting, placeholder) in [
        (
            "http://{region}.example/v1/payouts",
            ok_status,
            "consumers[0].effect.url",
            "{region}",
        ),
        (
            "http://h:{port}/v1/payouts",
            ok_status,
            "consumers[0].effect.url",
            "{port}",
        ),
        (
            "http://127.0.0.1:9/v1/payouts",
            "http://{region}.example/v1/effects/{key}",
            "consumers[0].effect.status_url",
            "{region}",
        ),
    ] {
        let consumers = http_consumer("payouts", "http://127.0.0.1:9", &effect(url, status_url));
        assert!(consumers.contains(url), "{consumers}");
        let cfg = dir.path().join("claimd.toml");
        std::fs::write(&cfg, config_toml(&store, &consumers)).unwrap();
        let (code, out, err) = cli(&["--config", &cfg.to_string_lossy(), "migrate"]);
        assert_eq!(code, 2, "{url} / {status_url}: {out}{err}");
        assert!(
            err.contains(&format!("{setting}: "))
                && err.contains(&format!(
                    "{placeholder} stands in the scheme, user, host or port: the message would choose the host that receives the provider's credentials"
                )),
            "{err}"
        );
    }
}

/// A claim stored before intake refused such values (here: as the previous version left
/// it) is not sent: `failed` "never sent" when its history proves no call reached the
/// provider, `needs_attention` when an earlier call may have (a crash mid-call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_claim_with_a_dot_segment_is_never_sent() {
    let store = TestStore::sqlite();
    let provider = PathProvider::start().await;
    let consumers = http_consumer("payouts", &provider.url, &payout_effect(&provider.url));
    let running = start(&config_toml(&store.url(), &consumers)).await;
    let st = running.app().store.clone();

    // Waited for its provider (connection refused) under the previous version: a clean
    // "not applied" hand-off, nothing sent.
    let waited = stored_claim("old-unsent", "payouts:old-unsent", Duration::from_secs(30));
    let c = created(&st, &waited).await;
    let handoff = Settlement {
        error: Some("connection refused".into()),
        handoff: Some(claimd::domain::claim::Handoff::NotApplied),
        lease_for: Some(Duration::ZERO),
        ..Default::default()
    };
    let ev = NewEvent {
        actor: "old-worker",
        action: "handoff",
        outcome: "not_applied",
        provider_status: None,
        detail: Some("connection refused"),
    };
    assert!(st.settle(c.id, 1, &handoff, &ev).await.unwrap());
    // Its worker died mid-call: the call may have gone to /v1/payouts.
    created(
        &st,
        &stored_claim("old-crashed", "payouts:old-crashed", Duration::ZERO),
    )
    .await;

    let settled = |id: &'static str, want: ClaimState| {
        let st = st.clone();
        async move {
            eventually(Duration::from_secs(20), || async {
                st.get("payouts", "", id)
                    .await
                    .unwrap()
                    .is_some_and(|c| c.state == want)
            })
            .await
        }
    };
    assert!(settled("old-unsent", ClaimState::Failed).await);
    let c = st.get("payouts", "", "old-unsent").await.unwrap().unwrap();
    let reason = c.last_error.clone().unwrap_or_default();
    assert!(
        reason.starts_with("never sent: URL field account is \"..\": a dot segment"),
        "{reason}"
    );
    assert!(settled("old-crashed", ClaimState::NeedsAttention).await);
    let c = st.get("payouts", "", "old-crashed").await.unwrap().unwrap();
    let reason = c.last_error.clone().unwrap_or_default();
    assert!(
        reason.contains("URL field account is \"..\"") && reason.contains("an earlier call"),
        "{reason}"
    );
    assert_eq!(provider.posts(), Vec::<String>::new(), "no call made");
    eprintln!(
        "url_templates, stored claims: provider saw {:?}",
        provider.seen()
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// A payout claim of `{"account": ".."}` as an earlier version's intake committed it, its
/// lease `lease` long.
fn stored_claim(id: &str, key: &str, lease: Duration) -> NewClaim {
    NewClaim {
        worker: "old-worker".into(),
        lease,
        payload: bytes::Bytes::from_static(br#"{"account":".."}"#),
        fingerprint: claimd::domain::claim::fingerprint(br#"{"account":".."}"#),
        ..orphan_claim("payouts", "", id, key)
    }
}

async fn created(st: &Store, n: &NewClaim) -> claimd::domain::claim::Claim {
    match st.claim(n).await.unwrap() {
        ClaimOutcome::Created(c) => c,
        _ => panic!("new claim {}", n.message_id),
    }
}

/// AMQP intake dead-letters the same message with the same sentence; nothing is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_intake_dead_letters_a_dot_segment_with_the_reason() {
    let Some(q) = TestQueues::new("url-dot").await else {
        return;
    };
    let store = TestStore::sqlite();
    let provider = PathProvider::start().await;
    let consumers = q.consumer_toml("payouts", "", &payout_effect(&provider.url));
    let running = start(&config_toml(&store.url(), &consumers)).await;
    let connected = eventually(Duration::from_secs(15), || async {
        running.amqp.connected()
    })
    .await;
    assert!(connected, "AMQP consumer connected");
    let st = running.app().store.clone();

    q.publish_json("amqp-dot", r#"{"account":".."}"#).await;
    q.publish_json("amqp-good", r#"{"account":"acct_2"}"#).await;
    let done = eventually(Duration::from_secs(15), || async {
        st.get("payouts", "", "amqp-good")
            .await
            .unwrap()
            .is_some_and(|c| c.state == ClaimState::Completed)
    })
    .await;
    assert!(done, "the good message completes");
    let mut dead = Vec::new();
    for _ in 0..100 {
        dead.extend(q.take_dead().await);
        if !dead.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead.len(), 1);
    let reason = header(&dead[0].delivery.properties, "claimd-reason").unwrap();
    assert!(
        reason.contains("URL field account is \"..\": a dot segment"),
        "{reason}"
    );
    assert!(st.get("payouts", "", "amqp-dot").await.unwrap().is_none());
    assert_eq!(
        provider.posts(),
        vec!["POST /v1/accounts/acct_2/payouts".to_string()]
    );
    running.shutdown(Duration::from_secs(5)).await;
}
