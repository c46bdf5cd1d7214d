//! Only the provider's own evidence decides a claim. A claim ends `failed` "never sent" (which
//! tells its producer to submit it again, under a new key) only from proof that the provider
//! never received it: a `503` after the provider charged, or a `409` saying it holds the key,
//! are no such proof. An answer is read whole before it is cut for storage. A failing status
//! endpoint never holds back new calls to a healthy create endpoint. Both stores.

use crate::common;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use claimd::domain::claim::{Claim, ClaimState};
use common::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// How the status endpoint answers.
#[derive(Clone)]
enum Status {
    /// `200 {}` for a key it charged, else `404`.
    Ledger,
    /// This body for a key it charged, else `404`.
    Body(Arc<String>),
    /// Never answers.
    Hang,
}

/// A provider that charges on every POST (once per key: it honours keys) and then answers
/// `status` with `body` after `delay`.
#[derive(Clone)]
struct Provider {
    charged: Arc<Mutex<HashMap<String, u32>>>,
    posts: Arc<Mutex<Vec<Instant>>>,
    status: u16,
    body: Arc<String>,
    delay: Duration,
    lookup: Status,
    /// How long after a POST arrives its charge is made (a provider that queues requests):
    /// the answer does not wait for it.
    apply_after: Duration,
}

impl Provider {
    fn new(status: u16, body: &str, delay: Duration, lookup: Status) -> Provider {
        Provider {
            charged: Arc::default(),
            posts: Arc::default(),
            status,
            body: Arc::new(body.to_string()),
            delay,
            lookup,
            apply_after: Duration::ZERO,
        }
    }

    fn charged(&self, key: &str) -> u32 {
        self.charged.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    async fn serve(&self) -> String {
        let app = Router::new()
            .route("/v1/effects/{key}", get(lookup))
            .route("/v1/{*path}", post(charge))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        url
    }
}

async fn charge(State(p): State<Provider>, headers: HeaderMap, _body: Bytes) -> Response {
    let key = headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    p.posts.lock().unwrap().push(Instant::now());
    if p.apply_after.is_zero() {
        p.charged.lock().unwrap().entry(key).or_insert(1);
    } else {
        let (charged, after) = (p.charged.clone(), p.apply_after);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            charged.lock().unwrap().entry(key).or_insert(1);
        });
    }
    tokio::time::sleep(p.delay).await;
    (
        StatusCode::from_u16(p.status).unwrap(),
        [("Content-Type", "application/json")],
        p.body.to_string(),
    )
        .into_response()
}

async fn lookup(State(p): State<Provider>, Path(key): Path<String>) -> Response {
    let body = match &p.lookup {
        Status::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return StatusCode::OK.into_response();
        }
        Status::Ledger => Arc::new("{}".to_string()),
        Status::Body(b) => b.clone(),
    };
    if p.charged(&key) > 0 {
        (StatusCode::OK, body.to_string()).into_response()
    } else {
        (StatusCode::NOT_FOUND, "{}").into_response()
    }
}

/// A payments consumer against `url`: lease 2 s, `send_deadline` 3 s, the given effect
/// `timeout`, `extra` consumer keys; `status_url` kept only when `with_status`.
fn config(store: &TestStore, url: &str, timeout: &str, with_status: bool, extra: &str) -> String {
    let mut consumer = consumer_toml(
        "payments",
        url,
        &format!(
            "key = \"{{message_id}}\"\nlease = \"2s\"\nsend_deadline = \"3s\"\nmax_sends = 3\n{extra}"
        ),
    )
    .replace("timeout = \"1s\"", &format!("timeout = \"{timeout}\""));
    if !with_status {
        consumer = consumer
            .lines()
            .filter(|l| !l.starts_with("status_url"))
            .collect::<Vec<_>>()
            .join("\n");
    }
    config_toml(&store.url(), &consumer)
}

async fn post_payment(base: &str, key: &str) -> u16 {
    client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body("{\"amount\":1250}")
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// The claim once it is no longer `started` (or as it is after `within`).
async fn settled(running: &claimd::service::run::Running, key: &str, within: Duration) -> Claim {
    let store = running.app().store.clone();
    eventually(within, || async {
        let c = store.get("payments", "", key).await.unwrap().unwrap();
        c.state != ClaimState::Started
    })
    .await;
    store.get("payments", "", key).await.unwrap().unwrap()
}

/// The provider charges on the first POST and answers every POST `status` (after `delay`):
/// past `send_deadline` the claim is never `failed` "never sent". With a status endpoint it
/// is looked up and completed; without, parked with what the provider answered and the key.
async fn charged_then_answered(store: TestStore, status: u16, delay: Duration, with_status: bool) {
    let provider = Provider::new(status, "{\"error\":\"busy\"}", delay, Status::Ledger);
    let url = provider.serve().await;
    let (timeout, on_unknown) = if with_status {
        ("1500ms", "\"reconcile\"")
    } else {
        ("1500ms", "\"redrive\"")
    };
    let toml = config(
        &store,
        &url,
        timeout,
        with_status,
        &format!("on_unknown = {on_unknown}"),
    );
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post_payment(&base, "ev-1").await, 202);
    let c = settled(&running, "ev-1", Duration::from_secs(40)).await;
    let why = c.last_error.clone().unwrap_or_default();
    assert!(
        !(c.state == ClaimState::Failed && why.contains("never sent")),
        "charged, yet failed as never sent: {why}"
    );
    if with_status {
        assert_eq!(c.state, ClaimState::Completed, "{why}");
        assert!(c.reconciled, "completed by the status endpoint");
    } else {
        assert_eq!(c.state, ClaimState::NeedsAttention, "{why}");
        assert!(why.contains(&format!("{status} \u{d7}")), "{why}");
        assert!(why.contains("by key ev-1"), "{why}");
    }
    assert_eq!(provider.charged("ev-1"), 1, "charged once");
    running.shutdown(Duration::from_secs(2)).await;
}

macro_rules! both_stores {
    ($($name:ident: $body:expr,)*) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let store = TestStore::sqlite();
                ($body)(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(store) = TestStore::pg().await else { return };
                ($body)(store).await;
            }
        }
    )*};
}

both_stores! {
    a_503_after_the_charge_is_looked_up_not_failed_as_never_sent:
        |s| charged_then_answered(s, 503, Duration::ZERO, true),
    a_503_after_the_charge_without_a_status_endpoint_is_parked_with_the_evidence:
        |s| charged_then_answered(s, 503, Duration::ZERO, false),
    // Slow enough that each attempt makes one call: the 409 is then only on its hand-off line.
    a_409_ending_each_attempt_is_looked_up_not_failed_as_never_sent:
        |s| charged_then_answered(s, 409, Duration::from_millis(800), true),
    a_409_ending_each_attempt_without_a_status_endpoint_is_parked_with_the_evidence:
        |s| charged_then_answered(s, 409, Duration::from_millis(800), false),
    refused_connections_past_send_deadline_still_end_failed_never_sent: refused,
    a_charge_the_provider_makes_after_the_first_lookup_is_found_not_failed_as_never_sent:
        charged_late,
}

/// The provider queues its work: every POST is answered `503` at once and charged 6 s later.
/// Past `send_deadline` (3 s) the first lookups find nothing; a "not found" ends a claim
/// "never sent" only once it has been quiet for three times the effect's timeout (4.5 s), by
/// which time the charge is there: completed, never failed as never sent.
async fn charged_late(store: TestStore) {
    let mut provider = Provider::new(503, "{\"error\":\"busy\"}", Duration::ZERO, Status::Ledger);
    provider.apply_after = Duration::from_secs(6);
    let url = provider.serve().await;
    let toml = config(&store, &url, "1500ms", true, "on_unknown = \"reconcile\"");
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post_payment(&base, "ev-late").await, 202);
    let c = settled(&running, "ev-late", Duration::from_secs(40)).await;
    let why = c.last_error.clone().unwrap_or_default();
    assert!(
        !(c.state == ClaimState::Failed && why.contains("never sent")),
        "charged, yet failed as never sent: {why}"
    );
    assert_eq!(c.state, ClaimState::Completed, "{why}");
    assert_eq!(provider.charged("ev-late"), 1, "charged once");
    running.shutdown(Duration::from_secs(2)).await;
}

/// Nothing listens at the provider's address: every call is refused before it leaves, which
/// proves it was never received, so past `send_deadline` the claim ends `failed` "never sent".
async fn refused(store: TestStore) {
    let url = format!("http://127.0.0.1:{}", free_port());
    let toml = config(&store, &url, "600ms", true, "on_unknown = \"reconcile\"");
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post_payment(&base, "ev-refused").await, 202);
    let c = settled(&running, "ev-refused", Duration::from_secs(40)).await;
    assert_eq!(c.state, ClaimState::Failed, "{:?}", c.last_error);
    assert!(
        c.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("never sent")),
        "{:?}",
        c.last_error
    );
    running.shutdown(Duration::from_secs(2)).await;
}

/// A PaymentIntent with its charges expanded: about 5.9 KB, more than the 4 KiB kept.
fn payment_intent(status: &str) -> String {
    let charge = |i: usize| {
        format!(
            r#"{{"id":"ch_3PqL{i:04}","object":"charge","amount":1250,"currency":"eur","outcome":{{"network_status":"approved_by_network","risk_level":"normal","seller_message":"Payment complete.","type":"authorized"}},"payment_method_details":{{"card":{{"brand":"visa","country":"DE","exp_month":12,"exp_year":2030,"fingerprint":"Xt5EWLLDS7FJjR1c","funding":"credit","last4":"4242","network":"visa"}},"type":"card"}}}}"#
        )
    };
    let charges: Vec<String> = (0..15).map(charge).collect();
    format!(
        r#"{{"id":"pi_3PqLbig","object":"payment_intent","amount":1250,"currency":"eur","charges":{{"object":"list","data":[{}]}},"status":"{status}"}}"#,
        charges.join(",")
    )
}

const OUTCOME: &str = r#"
[consumers.effect.outcome]
pointer = "/status"
completed = ["succeeded"]
pending = ["processing"]
failed = ["canceled"]
id_pointer = "/id"
pending_poll = "1s"
"#;

/// A 5.9 KB `200 {"status":"succeeded"}` completes the claim with the provider's id, for the
/// call's own answer and for a status lookup's answer read by a poll of a pending claim.
async fn a_long_answer_is_read_whole(store: TestStore, by_poll: bool) {
    let big = payment_intent("succeeded");
    assert!(big.len() > 5_800 && big.len() < 6_500, "{}", big.len());
    let provider = if by_poll {
        Provider::new(
            200,
            r#"{"id":"pi_3PqLbig","status":"processing"}"#,
            Duration::ZERO,
            Status::Body(Arc::new(big)),
        )
    } else {
        Provider::new(200, &big, Duration::ZERO, Status::Ledger)
    };
    let url = provider.serve().await;
    let toml = config(&store, &url, "1s", true, "") + OUTCOME;
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post_payment(&base, "ev-big").await, 202);
    let store = running.app().store.clone();
    eventually(Duration::from_secs(30), || async {
        let c = store.get("payments", "", "ev-big").await.unwrap().unwrap();
        !matches!(c.state, ClaimState::Started | ClaimState::Pending)
    })
    .await;
    let c = store.get("payments", "", "ev-big").await.unwrap().unwrap();
    assert_eq!(c.state, ClaimState::Completed, "{:?}", c.last_error);
    assert_eq!(c.provider_id.as_deref(), Some("pi_3PqLbig"));
    let kept = c.provider_response.unwrap_or_default();
    assert!(kept.len() <= 4096 + 8, "{} bytes stored", kept.len());
    assert_eq!(provider.charged("ev-big"), 1);
    running.shutdown(Duration::from_secs(2)).await;
}

both_stores! {
    a_long_call_answer_is_read_whole_then_cut_for_storage:
        |s| a_long_answer_is_read_whole(s, false),
    a_long_lookup_answer_read_by_a_poll_is_read_whole:
        |s| a_long_answer_is_read_whole(s, true),
}

/// A status endpoint that never answers, asked about 48 claims whose outcome is unknown,
/// while 300 new payments arrive: the create endpoint is healthy, so every one is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_status_endpoint_does_not_hold_back_new_payments() {
    let store = TestStore::sqlite();
    let provider = Provider::new(200, "{\"ok\":true}", Duration::ZERO, Status::Hang);
    let url = provider.serve().await;
    let toml = config(
        &store,
        &url,
        "600ms",
        true,
        "on_unknown = \"reconcile\"\nconcurrency = 16",
    );
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    for i in 0..48 {
        let id = format!("orphan-{i}");
        app.store
            .claim(&orphan_claim("payments", "", &id, &id))
            .await
            .unwrap();
    }
    drop(app);
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    // Let the lookups fail for a while first.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let began = Instant::now();
    let mut posts = JoinSet::new();
    for w in 0..6 {
        let base = base.clone();
        posts.spawn(async move {
            for i in 0..50 {
                assert_eq!(post_payment(&base, &format!("new-{w}-{i}")).await, 202);
            }
        });
    }
    while let Some(r) = posts.join_next().await {
        r.unwrap();
    }
    let within = Duration::from_secs(30);
    let sent = |p: &Provider| {
        (0..6)
            .flat_map(|w| (0..50).map(move |i| format!("new-{w}-{i}")))
            .filter(|k| p.charged(k) > 0)
            .count()
    };
    eventually(within, || async { sent(&provider) == 300 }).await;
    let n = sent(&provider);
    eprintln!(
        "{n} of 300 sent within {:.1} s while the status endpoint hangs",
        began.elapsed().as_secs_f64()
    );
    assert_eq!(
        n, 300,
        "new payments held back by a failing status endpoint"
    );
    running.shutdown(Duration::from_secs(2)).await;
}
