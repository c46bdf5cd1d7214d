//! The hostile provider: an HTTP proxy between the provider's door (the gate) and the sandbox
//! that lies the way real proxies and providers do, so that only the provider's own evidence
//! about a claim can decide it:
//!
//! - for a share of `POST`s (`applied_503`) it forwards the request, lets the sandbox apply
//!   it, and answers `503` (a proxy's `503` after the origin applied): half wait for the
//!   sandbox's answer first, half answer at once and forward after a hold of up to a second
//!   (a request queued behind the proxy);
//! - while a key is in flight at the sandbox through it, another request with that key gets
//!   `409` without being forwarded;
//! - for a share of `POST`s (`unforwarded_503`) it answers `503` without forwarding (a real
//!   "not applied");
//! - for a share of keys (`pending`) the sandbox's `"succeeded"` is answered `"processing"`:
//!   the claim waits `pending` for the provider's signed event (sent by
//!   [`super::lookalike`], which also sends the look-alikes) or its poll;
//! - every object it answers carries the metadata a real integration writes (the claim's
//!   key, consumer, tenant and message id, read from the `Idempotency-Key`), so events can
//!   name the claim by its full key.
//!
//! Lookups (`GET`) pass through unchanged. A connection the sandbox drops is answered `502`.

use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// How hostile the provider is. The shares are of `POST`s (503s) and of keys (pending).
#[derive(Debug, Clone, PartialEq)]
pub struct HostileOptions {
    /// Forwarded, applied by the sandbox, answered `503`.
    pub applied_503: f64,
    /// Answered `503` without forwarding: nothing applied.
    pub unforwarded_503: f64,
    /// Keys answered `"processing"` (pending) and settled by a signed event or a poll.
    pub pending: f64,
    /// Send look-alike events (another tenant's, another consumer's, another object with the
    /// same metadata) to each pending claim before its own event.
    pub lookalikes: bool,
    /// The payments consumer's `send_deadline`: short, so that the deadline falls inside the
    /// run and a `503` taken for proof of non-receipt shows as "never sent".
    pub send_deadline: Duration,
}

impl Default for HostileOptions {
    fn default() -> Self {
        HostileOptions {
            applied_503: 0.2,
            unforwarded_503: 0.25,
            pending: 0.3,
            lookalikes: true,
            send_deadline: Duration::from_secs(2),
        }
    }
}

/// A payment object the proxy answered `processing` for: its claim waits for an event.
#[derive(Debug, Clone)]
pub struct PendingObject {
    /// The claim's key (`payments:{tenant}:{message_id}`).
    pub key: String,
    /// The object's id (the sandbox's `eff_N`).
    pub id: String,
    pub tenant: String,
    pub message_id: String,
}

/// What the proxy did, for the table.
#[derive(Debug, Default)]
pub struct HostileCounts {
    /// `503`s answered after forwarding (the sandbox applied or replayed it).
    pub applied_503: AtomicUsize,
    /// `503`s answered without forwarding.
    pub unforwarded_503: AtomicUsize,
    /// `409`s answered for a key in flight through the proxy.
    pub in_flight_409: AtomicUsize,
    /// Keys answered `processing`.
    pub pending: AtomicUsize,
}

struct State {
    options: HostileOptions,
    upstream: String,
    client: reqwest::Client,
    rng: Mutex<fastrand::Rng>,
    in_flight: Mutex<HashSet<String>>,
    /// Per key: answered `processing` (decided once), and whether its object was announced.
    pending: Mutex<HashMap<String, (bool, bool)>>,
    /// Taken by [`HostileProxy::close`]: objects answered later are settled by polls.
    announce: Mutex<Option<mpsc::UnboundedSender<PendingObject>>>,
    counts: Arc<HostileCounts>,
}

/// The running proxy.
pub struct HostileProxy {
    pub addr: SocketAddr,
    pub counts: Arc<HostileCounts>,
    state: Arc<State>,
}

impl HostileProxy {
    /// Starts the proxy in front of `sandbox` (served at `upstream`); pending objects are
    /// announced on the returned receiver.
    pub async fn start(
        options: HostileOptions,
        upstream: SocketAddr,
        seed: u64,
    ) -> (HostileProxy, mpsc::UnboundedReceiver<PendingObject>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let counts = Arc::new(HostileCounts::default());
        let state = Arc::new(State {
            options,
            upstream: format!("http://{upstream}"),
            client: claimd::provider::tls::http_client_builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            rng: Mutex::new(fastrand::Rng::with_seed(seed ^ 0x0005_511e)),
            in_flight: Mutex::default(),
            pending: Mutex::default(),
            announce: Mutex::new(Some(tx)),
            counts: counts.clone(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = state.clone();
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let state = served.clone();
            async move { handle(state, req).await }
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (
            HostileProxy {
                addr,
                counts,
                state,
            },
            rx,
        )
    }

    /// Stops announcing pending objects, so the event sender can finish; a claim answered
    /// `processing` from now on is settled by its poll.
    pub fn close(&self) {
        self.state.announce.lock().unwrap().take();
    }
}

type Answer = (u16, Vec<(String, String)>, Vec<u8>);

async fn handle(state: Arc<State>, req: axum::extract::Request) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 16 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .filter(|(n, _)| {
            !matches!(
                n.as_str(),
                "host" | "content-length" | "connection" | "transfer-encoding"
            )
        })
        .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let key = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let answer = match (parts.method == axum::http::Method::POST, key) {
        (true, Some(key)) => post(&state, &path, headers, body.to_vec(), key).await,
        _ => forward(&state, &parts.method, &path, headers, body.to_vec()).await,
    };
    respond(answer)
}

/// A `POST` with a key: the hostile part.
async fn post(
    state: &Arc<State>,
    path: &str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    key: String,
) -> Answer {
    let (roll, early) = {
        let mut r = state.rng.lock().unwrap();
        (r.f64(), r.bool())
    };
    if !state.in_flight.lock().unwrap().insert(key.clone()) {
        state.counts.in_flight_409.fetch_add(1, Ordering::Relaxed);
        return problem(409, "a request with this Idempotency-Key is in progress");
    }
    let o = &state.options;
    if roll < o.unforwarded_503 {
        state.in_flight.lock().unwrap().remove(&key);
        state.counts.unforwarded_503.fetch_add(1, Ordering::Relaxed);
        return problem(503, "upstream unavailable");
    }
    if roll < o.unforwarded_503 + o.applied_503 {
        state.counts.applied_503.fetch_add(1, Ordering::Relaxed);
        let post = post_upstream(state.clone(), path.to_string(), headers, body, key);
        if early {
            // The proxy gives up at once; the request still reaches the sandbox after a
            // hold, the key in flight meanwhile (a repeat gets 409).
            let hold = Duration::from_millis(state.rng.lock().unwrap().u64(0..1000));
            tokio::spawn(async move {
                tokio::time::sleep(hold).await;
                post.await;
            });
        } else {
            let _ = tokio::spawn(post).await;
        }
        return problem(503, "upstream timed out");
    }
    // In a task of its own: a worker that gives up (its call timeout) does not leave the key
    // in flight for ever.
    let post = post_upstream(state.clone(), path.to_string(), headers, body, key.clone());
    match tokio::spawn(post).await {
        Ok(answer) => dress(state, &key, answer),
        Err(_) => problem(502, "bad gateway"),
    }
}

/// Forwards a `POST` and takes its key out of flight when the sandbox has answered.
async fn post_upstream(
    state: Arc<State>,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    key: String,
) -> Answer {
    let answer = forward(&state, &axum::http::Method::POST, &path, headers, body).await;
    state.in_flight.lock().unwrap().remove(&key);
    answer
}

/// Adds the claim's metadata to an object the sandbox answered, and answers `processing`
/// for a pending key (announcing its object once).
fn dress(state: &State, key: &str, (status, headers, body): Answer) -> Answer {
    if !(200..300).contains(&status) {
        return (status, headers, body);
    }
    let Ok(mut object) = serde_json::from_slice::<Value>(&body) else {
        return (status, headers, body);
    };
    let mut parts = key.splitn(3, ':');
    let (consumer, tenant, message_id) = (
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
    );
    object["metadata"] = metadata(key, &consumer, Some(&tenant), &message_id);
    let (pending, announce) = {
        let mut map = state.pending.lock().unwrap();
        let entry = map.entry(key.to_string()).or_insert_with(|| {
            let p = state.rng.lock().unwrap().f64() < state.options.pending;
            (p, false)
        });
        let announce = entry.0 && !entry.1;
        entry.1 |= entry.0;
        (entry.0, announce)
    };
    if pending {
        object["status"] = json!("processing");
        if let Some(id) = object.get("id").and_then(Value::as_str)
            && announce
        {
            state.counts.pending.fetch_add(1, Ordering::Relaxed);
            let sender = state.announce.lock().unwrap().clone();
            let _ = sender.map(|a| {
                a.send(PendingObject {
                    key: key.to_string(),
                    id: id.to_string(),
                    tenant,
                    message_id,
                })
            });
        }
    }
    (status, headers, object.to_string().into_bytes())
}

/// The metadata an object carries: the claim's key and its parts (`tenant` left out when
/// `None`: an integration that does not write it).
pub fn metadata(key: &str, consumer: &str, tenant: Option<&str>, message_id: &str) -> Value {
    let mut m = json!({
        "claimd_key": key,
        "consumer": consumer,
        "message_id": message_id,
    });
    if let Some(t) = tenant {
        m["tenant"] = json!(t);
    }
    m
}

async fn forward(
    state: &State,
    method: &axum::http::Method,
    path: &str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap();
    let mut req = state
        .client
        .request(method, format!("{}{path}", state.upstream));
    for (n, v) in &headers {
        req = req.header(n, v);
    }
    match req.body(body).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let headers = r
                .headers()
                .iter()
                .filter(|(n, _)| {
                    matches!(
                        n.as_str(),
                        "content-type" | "retry-after" | "idempotent-replayed"
                    )
                })
                .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
                .collect();
            match r.bytes().await {
                Ok(b) => (status, headers, b.to_vec()),
                Err(_) => problem(502, "the upstream answer was cut"),
            }
        }
        // The sandbox dropped the connection (applied, maybe) or is down.
        Err(_) => problem(502, "bad gateway"),
    }
}

fn problem(status: u16, detail: &str) -> Answer {
    (
        status,
        vec![("content-type".into(), "application/problem+json".into())],
        json!({"status": status, "detail": detail})
            .to_string()
            .into_bytes(),
    )
}

fn respond((status, headers, body): Answer) -> axum::response::Response {
    let mut r = axum::response::Response::new(axum::body::Body::from(body));
    *r.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
    for (n, v) in headers {
        if let (Ok(n), Ok(v)) = (
            axum::http::HeaderName::from_bytes(n.as_bytes()),
            axum::http::HeaderValue::from_str(&v),
        ) {
            r.headers_mut().insert(n, v);
        }
    }
    r
}
