//! The sandbox provider: an in-process simulator of an external side-effect provider
//! (a payments or messaging API) that honours idempotency keys.
//!
//! It is the test double for every test and benchmark, and what `claimd sandbox` (or
//! `[sandbox] enabled = true` under `claimd run`) serves. Its behaviour:
//!
//! - `POST /v1/<anything>` or `/v2/<anything>` (except under `/v1/effects`) needs an `Idempotency-Key` header of
//!   1–255 visible ASCII characters, else `400`. After sleeping the configured latency (the key
//!   is *in flight* meanwhile) the first request for a key applies the effect once and stores
//!   the response. A repeat with the same body (compared by SHA-256) replays the stored
//!   response with `Idempotent-Replayed: true`; the same key with a different body gets `422`;
//!   a repeat while the first is still in flight gets `409`.
//! - `fail_rate` P: with probability P a `POST` is answered `503` without applying anything.
//! - `ambiguous_rate` P: with probability P the effect is applied and recorded, then the
//!   provider either answers `500` or drops the connection without any response (50/50).
//! - `rate_limit` N: at most N `POST`s a second (a token bucket holding one second's worth);
//!   beyond it a `POST` is answered `429` with `Retry-After: 1`, nothing applied.
//! - A JSON body whose top-level `"sandbox"` field is `"decline"` is refused with `402`
//!   (nothing applied); `"unknown"` is applied, then answered `500`: an outcome a message asks
//!   for, to see a failed or a parked claim on purpose (README's walk-through).
//! - `ignore_keys`: a provider without idempotency — every `POST` applies (the key header is
//!   optional; when present the effect is counted under it), nothing is replayed or refused.
//! - It speaks HTTP/1.1, and HTTP/2 to a client that starts with the HTTP/2 preface (h2c,
//!   prior knowledge), without a limit on concurrent streams.
//! - `GET /v1/<objects>/search?query=metadata['claimd_key']:'K'` (Stripe's search shape)
//!   returns `{"object":"search_result","data":[<stored response>]}`.
//! - `GET /v1/messages?reference=K` (an SMS API's list) returns `{"data":[{"id":...,
//!   "reference":K,...}]}`, an empty list when nothing was sent under K.
//! - `GET /v1/effects/{key}` returns the [`EffectRecord`] or `404 {"error":"not found"}`;
//!   `GET /v1/effects` returns `{"effects":[...]}` sorted by key; `GET /healthz` returns `200`.
//! - Other provider shapes ([`Sandbox::with_modes`], [`SandboxModes`]): the key in a JSON body
//!   field, lookups that lag writes, no lookup endpoint, and `GET /v1/search?key=K`.
//!
//! Once the latency sleep has started, the effect is applied even if the client goes away
//! (the work runs in its own task), just as a real provider keeps going after a client
//! timeout. State lives in sharded maps whose locks are never held across an `.await`, so the
//! simulator keeps up with a 100,000-message benchmark; in memory only, unless made with
//! [`Sandbox::with_state_file`] (`[sandbox] state_file`), which keeps the effects across
//! restarts.

mod journal;
mod ledger;
mod limits;
mod modes;
mod pending;
mod responses;

pub use journal::{JournalError, open, state_file_under_run};
pub use modes::{DEFAULT_PROCESSING_FOR, SandboxModes, SandboxWebhook};
use responses::*;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Name of the request header carrying the idempotency key.
const KEY_HEADER: &str = "idempotency-key";
/// Name of the response header marking a replayed response.
const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Largest request body accepted; larger bodies get `413`.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Number of independently locked shards of the effect map.
const SHARDS: usize = 32;
/// How long `serve` waits, beyond the configured latency, for open connections to finish
/// after shutdown was requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How the simulated provider behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxOptions {
    /// How long applying an effect takes; the key is in flight (a repeat gets `409`) meanwhile.
    pub latency: Duration,
    /// Probability (0.0–1.0) that a `POST` is answered `503` without applying anything.
    pub fail_rate: f64,
    /// Probability (0.0–1.0) that a `POST` applies the effect and then answers `500` or drops
    /// the connection without a response.
    pub ambiguous_rate: f64,
    /// Behave like a provider without idempotency: apply every request, never replay.
    pub ignore_keys: bool,
    /// Take at most this many `POST`s a second (`429` beyond it); `None`: no limit.
    pub rate_limit: Option<u32>,
}

impl Default for SandboxOptions {
    /// Zero latency, no failures, idempotency keys honoured.
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            fail_rate: 0.0,
            ambiguous_rate: 0.0,
            ignore_keys: false,
            rate_limit: None,
        }
    }
}

/// One idempotency key as the provider sees it: how often its effect was applied, and the
/// response it stored the first time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectRecord {
    /// The idempotency key (with `ignore_keys` and no key header: a generated `unkeyed-<n>`).
    pub key: String,
    /// How many times the effect was applied; stays `1` while keys are honoured.
    pub applied: u64,
    /// Request path of the first application, e.g. `/v1/payments`.
    pub path: String,
    /// Hex SHA-256 of the first request's body.
    pub body_sha256: String,
    /// When the effect was first applied.
    pub first_applied_utc: DateTime<Utc>,
    /// The JSON response body stored (and replayed) for this key.
    pub response: Value,
}

/// The provider simulator. Cheap to clone: clones share the same state.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox")
            .field("options", &self.inner.options)
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}

struct Inner {
    options: SandboxOptions,
    modes: SandboxModes,
    shards: Vec<Mutex<HashMap<String, Slot>>>,
    hasher: RandomState,
    requests: AtomicU64,
    connections: AtomicU64,
    next_id: AtomicU64,
    unkeyed: AtomicU64,
    /// The rate limit's token bucket: tokens left and when it was last filled.
    bucket: Mutex<(f64, std::time::Instant)>,
    /// `POST`s answered `429` by the rate limit.
    limited: AtomicU64,
    /// The per-account limit's buckets (`SandboxModes::per_key_limit`).
    key_buckets: limits::KeyBuckets,
    /// Where applied effects are kept across restarts, if anywhere.
    journal: Option<journal::Journal>,
}

/// The state of one key.
enum Slot {
    /// The first request is inside its latency sleep.
    InFlight { body_sha256: String },
    /// Applied; the stored response is replayed to repeats.
    Done(Box<Stored>),
}

struct Stored {
    record: EffectRecord,
    status: StatusCode,
    body: Bytes,
}

/// Returned by the service to make hyper close the connection without any response.
#[derive(Debug)]
struct DropConnection;

impl fmt::Display for DropConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sandbox dropped the connection (simulated ambiguous outcome)")
    }
}

impl std::error::Error for DropConnection {}

type Reply = Result<Response<Full<Bytes>>, DropConnection>;

/// What happens after an effect was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Aftermath {
    /// Answer with the stored response.
    Respond,
    /// Answer `500` (the effect was applied nevertheless).
    Error500,
    /// Drop the connection without a response (the effect was applied nevertheless).
    Drop,
}

impl Sandbox {
    /// Create a simulator with empty state. Rates are clamped to `0.0..=1.0`.
    pub fn new(options: SandboxOptions) -> Self {
        Self::with_modes(options, SandboxModes::default())
    }

    /// Like [`Sandbox::new`], shaped like another kind of provider (see [`SandboxModes`]).
    pub fn with_modes(options: SandboxOptions, modes: SandboxModes) -> Self {
        Self::build(options, modes, None)
    }

    fn build(
        options: SandboxOptions,
        modes: SandboxModes,
        journal: Option<journal::Journal>,
    ) -> Self {
        let clamp = |p: f64| if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        let options = SandboxOptions {
            fail_rate: clamp(options.fail_rate),
            ambiguous_rate: clamp(options.ambiguous_rate),
            ..options
        };
        let rate_limit = options.rate_limit;
        Self {
            inner: Arc::new(Inner {
                options,
                modes,
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
                hasher: RandomState::new(),
                requests: AtomicU64::new(0),
                connections: AtomicU64::new(0),
                next_id: AtomicU64::new(1),
                unkeyed: AtomicU64::new(1),
                bucket: Mutex::new((
                    f64::from(rate_limit.unwrap_or(0)),
                    std::time::Instant::now(),
                )),
                limited: AtomicU64::new(0),
                key_buckets: limits::KeyBuckets::default(),
                journal,
            }),
        }
    }

    /// Serve on an already-bound listener until `shutdown` resolves.
    ///
    /// Each accepted connection is served with HTTP/1.1 keep-alive, or with HTTP/2 when the
    /// client starts with the HTTP/2 preface (no stream limit). When `shutdown` resolves
    /// the listener stops accepting, idle connections are closed, and in-flight requests are
    /// given the configured latency plus a few seconds to finish before this returns.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (stop_tx, _) = watch::channel(false);
        let mut shutdown = std::pin::pin!(shutdown);
        if let Ok(addr) = listener.local_addr() {
            tracing::debug!(%addr, "sandbox provider listening");
        }
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Usually transient (a reset before accept, out of descriptors): back off.
                    tracing::debug!(%error, "sandbox accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            self.inner.connections.fetch_add(1, Ordering::Relaxed);
            let inner = Arc::clone(&self.inner);
            let mut stop = stop_tx.subscribe();
            tokio::spawn(async move {
                let service = service_fn(move |request| handle(Arc::clone(&inner), request));
                // HTTP/1.1 with keep-alive, or HTTP/2 when the client opens with its preface
                // (h2c, for `effect.http_version = "2"`), without a stream limit so one
                // connection can carry every call in flight.
                let mut builder = auto::Builder::new(TokioExecutor::new());
                builder.http1().timer(TokioTimer::new()).keep_alive(true);
                builder
                    .http2()
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(None);
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                let mut connection = std::pin::pin!(connection);
                let result = tokio::select! {
                    result = connection.as_mut() => result,
                    () = async { let _ = stop.wait_for(|stopping| *stopping).await; } => {
                        connection.as_mut().graceful_shutdown();
                        connection.await
                    }
                };
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "sandbox connection ended with an error");
                }
                drop(stop);
            });
        }
        tracing::debug!("sandbox provider shutting down");
        let _ = stop_tx.send(true);
        let grace = self.inner.options.latency.saturating_add(SHUTDOWN_GRACE);
        if tokio::time::timeout(grace, stop_tx.closed()).await.is_err() {
            tracing::debug!("sandbox connections still open after the grace period; leaving them");
        }
        Ok(())
    }

    /// Snapshot of every key with its applied count (for tests and benchmarks in-process),
    /// sorted by key. Keys still in their first latency sleep are not included.
    pub fn effects(&self) -> Vec<EffectRecord> {
        self.inner.effects()
    }

    /// Total requests that reached the apply path (including replays and rejections).
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Connections accepted so far (HTTP/1.1 holds one per call in flight; HTTP/2 shares one).
    pub fn connections(&self) -> u64 {
        self.inner.connections.load(Ordering::Relaxed)
    }

    /// `POST`s answered `429` by `rate_limit` so far.
    pub fn rate_limited(&self) -> u64 {
        self.inner.limited.load(Ordering::Relaxed)
    }

    /// `POST`s answered `429` by the per-account limit (`SandboxModes::per_key_limit`).
    pub fn rate_limited_per_key(&self) -> u64 {
        self.inner.key_buckets.refused()
    }
}

impl Inner {
    /// Takes one token of the rate limit's bucket (refilled at `rate_limit` a second, holding
    /// at most one second's worth); `false` when it is empty. Always `true` without a limit.
    fn take_token(&self) -> bool {
        let Some(rate) = self.options.rate_limit.filter(|r| *r > 0) else {
            return true;
        };
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        limits::take_token(&mut b, f64::from(rate))
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<String, Slot>> {
        let index = (self.hasher.hash_one(key) % SHARDS as u64) as usize;
        // A panic while holding the lock cannot leave a map half-updated; keep going.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn effects(&self) -> Vec<EffectRecord> {
        let mut all = Vec::new();
        for shard in &self.shards {
            let map = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            all.extend(map.values().filter_map(|slot| match slot {
                Slot::Done(stored) => Some(stored.record.clone()),
                Slot::InFlight { .. } => None,
            }));
        }
        all.sort_by(|a, b| a.key.cmp(&b.key));
        all
    }

    fn effect(&self, key: &str) -> Option<EffectRecord> {
        match self.shard(key).get(key) {
            Some(Slot::Done(stored)) => Some(stored.record.clone()),
            _ => None,
        }
    }

    fn roll(rate: f64) -> bool {
        rate > 0.0 && fastrand::f64() < rate
    }

    fn aftermath(&self) -> Aftermath {
        if Self::roll(self.options.ambiguous_rate) {
            if fastrand::bool() {
                Aftermath::Error500
            } else {
                Aftermath::Drop
            }
        } else {
            Aftermath::Respond
        }
    }

    /// Build the stored response for a newly applied effect (`request`: its body); one a
    /// message asked to stay `processing` is scheduled to succeed ([`pending`]).
    fn new_stored(
        self: &Arc<Self>,
        key: String,
        path: String,
        body_sha256: String,
        request: &[u8],
    ) -> Stored {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let processing = directive(request) == Some(pending::PROCESSING);
        let response = effect_object(id, &key, &path, request, processing);
        if processing {
            pending::succeed_later(Arc::clone(self), key.clone());
        }
        let body = Bytes::from(response.to_string());
        Stored {
            record: EffectRecord {
                key,
                applied: 1,
                path,
                body_sha256,
                first_applied_utc: Utc::now(),
                response,
            },
            status: StatusCode::OK,
            body,
        }
    }

    /// Apply an idempotent effect whose key was just marked in flight: wait out the latency,
    /// record it, and decide what the client gets.
    async fn apply_keyed(
        self: Arc<Self>,
        key: String,
        path: String,
        body_sha256: String,
        request: Bytes,
        directed: Option<Aftermath>,
    ) -> (StatusCode, Bytes, Aftermath) {
        tokio::time::sleep(self.options.latency).await;
        let stored = self.new_stored(key.clone(), path, body_sha256, &request);
        let (status, body) = (stored.status, stored.body.clone());
        self.keep(&stored.record);
        self.shard(&key).insert(key, Slot::Done(Box::new(stored)));
        (status, body, directed.unwrap_or_else(|| self.aftermath()))
    }

    /// Apply an effect with idempotency ignored: every call counts.
    async fn apply_unkeyed(
        self: Arc<Self>,
        key: Option<String>,
        path: String,
        body_sha256: String,
        request: Bytes,
    ) -> (StatusCode, Bytes, Aftermath) {
        if !self.options.latency.is_zero() {
            tokio::time::sleep(self.options.latency).await;
        }
        let key = key.unwrap_or_else(|| {
            let n = self.unkeyed.fetch_add(1, Ordering::Relaxed);
            format!("unkeyed-{n:012}")
        });
        let fresh = self.new_stored(key.clone(), path, body_sha256, &request);
        let (status, body) = (fresh.status, fresh.body.clone());
        {
            let mut map = self.shard(&key);
            match map.get_mut(&key) {
                Some(Slot::Done(stored)) => {
                    stored.record.applied += 1;
                    self.keep(&stored.record);
                }
                _ => {
                    self.keep(&fresh.record);
                    map.insert(key, Slot::Done(Box::new(fresh)));
                }
            }
        }
        (status, body, self.aftermath())
    }
}

async fn handle(inner: Arc<Inner>, request: Request<Incoming>) -> Reply {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if path == "/healthz" {
        return Ok(json_response(StatusCode::OK, &json!({"status": "ok"})));
    }
    if path == "/v1/effects" || path == "/v1/effects/" {
        return Ok(match method {
            Method::GET | Method::HEAD => {
                json_response(StatusCode::OK, &json!({ "effects": inner.effects() }))
            }
            _ => method_not_allowed("GET"),
        });
    }
    let lookup = path == "/v1/search" || path.starts_with("/v1/effects/");
    if lookup && inner.modes.lookup_missing {
        return Ok(modes::no_route(&path));
    }
    if path == "/v1/search" {
        return Ok(match method {
            Method::GET | Method::HEAD => modes::search(&inner, request.uri().query()),
            _ => method_not_allowed("GET"),
        });
    }
    if let Some(raw_key) = path.strip_prefix("/v1/effects/") {
        return Ok(match method {
            Method::GET | Method::HEAD => {
                let decoded = percent_decode(raw_key);
                let found = decoded
                    .as_deref()
                    .and_then(|key| inner.effect(key))
                    .or_else(|| inner.effect(raw_key))
                    .filter(|r| inner.modes.visible(r));
                match found {
                    Some(record) => json_response(StatusCode::OK, &record),
                    None => json_response(StatusCode::NOT_FOUND, &json!({"error": "not found"})),
                }
            }
            _ => method_not_allowed("GET"),
        });
    }
    // An SMS-shaped lookup: the messages sent with a `reference` (the key, with `ignore_keys`
    // the `Idempotency-Key` header the message came with).
    if path == "/v1/messages" && matches!(method, Method::GET | Method::HEAD) {
        return Ok(modes::messages(&inner, request.uri().query()));
    }
    // A Stripe-shaped search (`GET /v1/payment_intents/search?query=metadata['k']:'KEY'`).
    if path.starts_with("/v1/") && path.ends_with("/search") && method == Method::GET {
        return Ok(modes::search_query(&inner, request.uri().query()));
    }
    // `/v1/...` and `/v2/...` (Square's `POST /v2/payments`).
    let api = ["/v1/", "/v2/"]
        .iter()
        .any(|p| path.len() > p.len() && path.starts_with(p));
    if api {
        if method == Method::GET {
            return Ok(ledger::list(&inner, &path, request.uri().query()));
        }
        if method != Method::POST {
            return Ok(method_not_allowed("GET, POST"));
        }
        return apply(inner, path, request).await;
    }
    Ok(problem(
        StatusCode::NOT_FOUND,
        "Not Found",
        format!("no sandbox route for {path}"),
    ))
}

/// The `POST /v1/...` path.
async fn apply(inner: Arc<Inner>, path: String, request: Request<Incoming>) -> Reply {
    inner.requests.fetch_add(1, Ordering::Relaxed);
    let key = request
        .headers()
        .get(KEY_HEADER)
        .map(|value| valid_key(value).ok_or(()));

    // Always read the body, so the connection stays usable for keep-alive.
    let body = match Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return Ok(problem(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Payload Too Large",
                    format!("the sandbox accepts bodies up to {MAX_BODY_BYTES} bytes"),
                ));
            }
            tracing::debug!(%error, "sandbox could not read a request body");
            return Err(DropConnection);
        }
    };
    let body_sha256 = hex::encode(Sha256::digest(&body));

    let options = &inner.options;
    let key = match inner.modes.key_from_body(&body) {
        Some(Ok(key)) => Some(Ok(key)),
        Some(Err(why)) if !options.ignore_keys => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "Missing idempotency key",
                why,
            ));
        }
        Some(Err(_)) => None,
        None => key,
    };
    let key = match key {
        Some(Ok(key)) => Some(key),
        Some(Err(())) if options.ignore_keys => None,
        None if options.ignore_keys => None,
        Some(Err(())) => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "Invalid Idempotency-Key",
                "Idempotency-Key must be 1-255 visible ASCII characters".into(),
            ));
        }
        None => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "Missing Idempotency-Key",
                "this provider requires an Idempotency-Key header on every POST".into(),
            ));
        }
    };

    let per_key = inner.key_buckets.take(inner.modes.limited_key(&body));
    if !per_key || !inner.take_token() {
        if per_key {
            inner.limited.fetch_add(1, Ordering::Relaxed);
        }
        let mut r = problem(
            StatusCode::TOO_MANY_REQUESTS,
            "Too Many Requests",
            "rate limit exceeded; nothing was applied, retry after 1 s".into(),
        );
        r.headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
        return Ok(r);
    }

    // A message can ask for an outcome (README's walk-through): `"sandbox": "decline"` is
    // refused with 402, nothing applied; `"sandbox": "unknown"` is applied, then answered 500.
    let directed = match directive(&body) {
        Some("decline") => {
            return Ok(problem(
                StatusCode::PAYMENT_REQUIRED,
                "Card Declined",
                "the card was declined (asked for by the message: \"sandbox\": \"decline\"); nothing was applied".into(),
            ));
        }
        Some("unknown") => Some(Aftermath::Error500),
        _ => None,
    };

    if Inner::roll(options.fail_rate) {
        tracing::debug!(?key, "sandbox simulating 503 (nothing applied)");
        return Ok(problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Service Unavailable",
            "simulated outage; nothing was applied, retry later".into(),
        ));
    }

    let work = if options.ignore_keys {
        tokio::spawn(Arc::clone(&inner).apply_unkeyed(key, path, body_sha256, body))
    } else {
        let key = key.expect("keys are required unless ignore_keys");
        {
            let mut map = inner.shard(&key);
            match map.get(&key) {
                Some(Slot::Done(stored)) if stored.record.body_sha256 == body_sha256 => {
                    tracing::debug!(%key, "sandbox replaying stored response");
                    let mut response = bytes_response(stored.status, stored.body.clone());
                    drop(map);
                    response
                        .headers_mut()
                        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
                    return Ok(response);
                }
                Some(Slot::Done(_)) => {
                    drop(map);
                    return Ok(key_reused(&key));
                }
                Some(Slot::InFlight { body_sha256: first }) => {
                    let same = *first == body_sha256;
                    drop(map);
                    if !same {
                        return Ok(key_reused(&key));
                    }
                    return Ok(problem(
                        StatusCode::CONFLICT,
                        "Request In Progress",
                        format!("a request with Idempotency-Key {key:?} is still being processed"),
                    ));
                }
                None if options.latency.is_zero() => {
                    // Fast path: nothing to wait for, so apply under the lock.
                    let stored = inner.new_stored(key.clone(), path, body_sha256, &body);
                    let (status, body) = (stored.status, stored.body.clone());
                    inner.keep(&stored.record);
                    map.insert(key, Slot::Done(Box::new(stored)));
                    drop(map);
                    return finish(status, body, directed.unwrap_or_else(|| inner.aftermath()));
                }
                None => {
                    map.insert(
                        key.clone(),
                        Slot::InFlight {
                            body_sha256: body_sha256.clone(),
                        },
                    );
                }
            }
        }
        // Applied in its own task: a client that gives up mid-flight does not undo it.
        tokio::spawn(Arc::clone(&inner).apply_keyed(key, path, body_sha256, body, directed))
    };
    match work.await {
        Ok((status, body, aftermath)) => finish(status, body, aftermath),
        Err(error) => {
            tracing::debug!(%error, "sandbox apply task failed");
            Ok(problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal Server Error",
                "the sandbox failed while applying".into(),
            ))
        }
    }
}

/// The outcome a JSON body asks for in its top-level `"sandbox"` field, if any.
fn directive(body: &[u8]) -> Option<&'static str> {
    if !body.windows(9).any(|w| w == b"\"sandbox\"") {
        return None; // the common case: no parse
    }
    let v: Value = serde_json::from_slice(body).ok()?;
    match v.get("sandbox")?.as_str()? {
        "decline" => Some("decline"),
        "unknown" => Some("unknown"),
        pending::PROCESSING => Some(pending::PROCESSING),
        _ => None,
    }
}

fn finish(status: StatusCode, body: Bytes, aftermath: Aftermath) -> Reply {
    match aftermath {
        Aftermath::Respond => Ok(bytes_response(status, body)),
        Aftermath::Error500 => {
            tracing::debug!("sandbox simulating 500 after applying");
            Ok(problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal Server Error",
                "simulated failure after the effect was applied".into(),
            ))
        }
        Aftermath::Drop => {
            tracing::debug!("sandbox simulating a dropped connection after applying");
            Err(DropConnection)
        }
    }
}
