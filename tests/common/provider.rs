//! A scriptable provider for fault tests, written as a user would write their own: it honours
//! idempotency keys, can answer 503 for a while, reject with 400, or check that the claim row
//! is already committed when it is called (invariant I1).

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What the provider does.
#[derive(Clone, Default)]
pub struct Script {
    /// Answer 503 to the first N requests for each key.
    pub fail_first: u32,
    /// Answer 503 to every request for this long after the provider starts (an outage).
    pub fail_for_ms: u64,
    /// Always answer this status without applying.
    pub always: Option<u16>,
    /// A store URL: before applying, check the claim for this key is committed there.
    pub check_committed_in: Option<claimd::store::Store>,
    /// Sleep this long before applying (a kill then lands during the call).
    pub delay_before_apply_ms: u64,
    /// Apply, then sleep this long before answering (a kill then lands between the
    /// provider's effect and the worker's settle).
    pub delay_after_apply_ms: u64,
    /// Answer with the request's body in the answer (`{"key":..,"echo":<body>}`), as
    /// providers that repeat what they were sent do.
    pub echo_body: bool,
}

#[derive(Default)]
pub struct Ledger {
    /// key -> times applied.
    pub applied: HashMap<String, u32>,
    /// key -> every request's key header, in order.
    pub requests: HashMap<String, u32>,
    /// Keys called before their claim was committed (must stay empty).
    pub uncommitted_calls: Vec<String>,
}

#[derive(Clone)]
pub struct TestProvider {
    pub url: String,
    pub ledger: Arc<Mutex<Ledger>>,
}

#[derive(Clone)]
struct S {
    script: Script,
    ledger: Arc<Mutex<Ledger>>,
    started: std::time::Instant,
}

async fn apply(State(s): State<S>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(key) = headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return (StatusCode::BAD_REQUEST, "no key").into_response();
    };
    let echo = s
        .script
        .echo_body
        .then(|| String::from_utf8_lossy(&body).into_owned());
    let n = {
        let mut l = s.ledger.lock().unwrap();
        let n = l.requests.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    if let Some(store) = &s.script.check_committed_in {
        // The key is "{message_id}" in these tests; look the claim up on another connection.
        let found = store
            .get("payments", "", &key)
            .await
            .ok()
            .flatten()
            .is_some();
        if !found {
            s.ledger.lock().unwrap().uncommitted_calls.push(key.clone());
        }
    }
    if let Some(status) = s.script.always {
        return (StatusCode::from_u16(status).unwrap(), "scripted answer").into_response();
    }
    if n <= s.script.fail_first
        || s.started.elapsed() < std::time::Duration::from_millis(s.script.fail_for_ms)
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response();
    }
    if s.script.delay_before_apply_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(
            s.script.delay_before_apply_ms,
        ))
        .await;
    }
    {
        let mut l = s.ledger.lock().unwrap();
        let applied = l.applied.entry(key.clone()).or_default();
        if *applied == 0 {
            *applied = 1;
        }
    }
    if s.script.delay_after_apply_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(
            s.script.delay_after_apply_ms,
        ))
        .await;
    }
    match echo {
        Some(body) => (
            StatusCode::OK,
            format!("{{\"key\":\"{key}\",\"echo\":{body}}}"),
        )
            .into_response(),
        None => (StatusCode::OK, format!("{{\"key\":\"{key}\"}}")).into_response(),
    }
}

async fn status(State(s): State<S>, Path(key): Path<String>) -> Response {
    if s.ledger.lock().unwrap().applied.contains_key(&key) {
        (StatusCode::OK, "{}").into_response()
    } else {
        (StatusCode::NOT_FOUND, "{}").into_response()
    }
}

impl TestProvider {
    pub async fn start(script: Script) -> TestProvider {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let app = Router::new()
            .route("/v1/effects/{key}", get(status))
            .route("/v1/{*path}", post(apply))
            .with_state(S {
                script,
                ledger: ledger.clone(),
                started: std::time::Instant::now(),
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        TestProvider { url, ledger }
    }

    pub fn applied(&self, key: &str) -> u32 {
        self.ledger
            .lock()
            .unwrap()
            .applied
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    pub fn applied_total(&self) -> usize {
        self.ledger.lock().unwrap().applied.len()
    }

    pub fn requests(&self, key: &str) -> u32 {
        self.ledger
            .lock()
            .unwrap()
            .requests
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}
