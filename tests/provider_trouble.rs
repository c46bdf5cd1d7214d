//! The provider has a bad minute: it refuses connections, accepts and never answers, answers
//! `503`, or rate-limits with `429` for ten leases and more, under load, on both stores. Nothing
//! may be parked, failed or left started for it, every acknowledged payment is applied exactly
//! once, and only a trickle of requests reaches the provider while it is down. Then the four
//! review findings: a long `Retry-After`, a lagging status search, `claimd sweep` exiting early,
//! and a NUL byte in an answer.

mod common;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use claimd::domain::claim::ClaimState;
use claimd::store::ClaimFilter;
use common::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// How the provider behaves now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    Up = 0,
    /// Accepts and never answers (for half the keys it applied the effect first).
    Hang = 1,
    /// `503` without applying.
    Unavailable = 2,
    /// `429` with `Retry-After: 2`, without applying.
    Limited = 3,
}

#[derive(Default)]
struct Books {
    applied: HashMap<String, u32>,
    /// Requests (calls and lookups) while the mode was not `Up`.
    while_down: u64,
    /// Calls answered 429 by the rate limiter.
    limited: u64,
    /// Token bucket of the rate limiter: (tokens, last refill).
    bucket: Option<(f64, Instant)>,
    /// Answer of a call, when scripted (`(status, body, Retry-After)`), for the first calls.
    script: Vec<(u16, Vec<u8>, Option<String>)>,
    calls: Vec<Instant>,
}

#[derive(Clone)]
struct Provider {
    mode: Arc<AtomicU8>,
    books: Arc<Mutex<Books>>,
    /// POSTs per second the provider takes (a token bucket, burst of one second); 0: no limit.
    limit_per_s: u32,
}

impl Provider {
    fn mode(&self) -> Mode {
        match self.mode.load(Ordering::SeqCst) {
            1 => Mode::Hang,
            2 => Mode::Unavailable,
            3 => Mode::Limited,
            _ => Mode::Up,
        }
    }
    fn set(&self, m: Mode) {
        self.mode.store(m as u8, Ordering::SeqCst);
    }
    fn applied(&self, key: &str) -> u32 {
        self.books
            .lock()
            .unwrap()
            .applied
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

async fn call(State(p): State<Provider>, headers: HeaderMap, _body: Bytes) -> Response {
    let key = headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mode = p.mode();
    {
        let mut b = p.books.lock().unwrap();
        b.calls.push(Instant::now());
        if !b.script.is_empty() {
            let (status, body, retry_after) = b.script.remove(0);
            let mut r = (StatusCode::from_u16(status).unwrap(), body).into_response();
            if let Some(v) = retry_after {
                r.headers_mut().insert("Retry-After", v.parse().unwrap());
            }
            if status < 300 {
                *b.applied.entry(key).or_default() += 1;
            }
            return r;
        }
        if mode != Mode::Up {
            b.while_down += 1;
        }
        if p.limit_per_s > 0 {
            let rate = f64::from(p.limit_per_s);
            let now = Instant::now();
            let (tokens, at) = b.bucket.unwrap_or((rate, now));
            let tokens = (tokens + (now - at).as_secs_f64() * rate).min(rate);
            if tokens < 1.0 {
                b.bucket = Some((tokens, now));
                b.limited += 1;
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("Retry-After", "1")],
                    "slow down",
                )
                    .into_response();
            }
            b.bucket = Some((tokens - 1.0, now));
        }
    }
    match mode {
        Mode::Up => {}
        Mode::Hang => {
            if key.bytes().map(u32::from).sum::<u32>() % 2 == 0 {
                // Applied, and the answer never comes.
                let mut b = p.books.lock().unwrap();
                let n = b.applied.entry(key.clone()).or_default();
                if *n == 0 {
                    *n = 1;
                }
            }
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Mode::Unavailable => {
            return (StatusCode::SERVICE_UNAVAILABLE, "maintenance").into_response();
        }
        Mode::Limited => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [("Retry-After", "2")],
                "slow down",
            )
                .into_response();
        }
    }
    let mut b = p.books.lock().unwrap();
    let n = b.applied.entry(key.clone()).or_default();
    // Keys are honoured: a repeat replays, never applies again.
    if *n == 0 {
        *n = 1;
    }
    (StatusCode::OK, format!("{{\"key\":\"{key}\"}}")).into_response()
}

async fn status(State(p): State<Provider>, Path(key): Path<String>) -> Response {
    let mode = p.mode();
    if mode != Mode::Up {
        p.books.lock().unwrap().while_down += 1;
    }
    match mode {
        Mode::Up => {}
        Mode::Hang => tokio::time::sleep(Duration::from_secs(3600)).await,
        Mode::Unavailable => return (StatusCode::SERVICE_UNAVAILABLE, "").into_response(),
        Mode::Limited => {
            return (StatusCode::TOO_MANY_REQUESTS, [("Retry-After", "2")], "").into_response();
        }
    }
    if p.applied(&key) > 0 {
        (StatusCode::OK, "{}").into_response()
    } else {
        (StatusCode::NOT_FOUND, "{}").into_response()
    }
}

/// The provider behind a port that can refuse connections: `down` closes the listening socket
/// and every open connection (new ones are refused by the kernel), `up` listens again on the
/// same port.
struct Front {
    port: u16,
    target: String,
    tasks: Mutex<Option<JoinSet<()>>>,
}

impl Front {
    async fn start(provider: Provider) -> Arc<Front> {
        let app = Router::new()
            .route("/v1/effects/{key}", get(status))
            .route("/v1/{*path}", post(call))
            .with_state(provider);
        let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = inner.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let _ = axum::serve(inner, app).await;
        });
        let port = free_port();
        let front = Arc::new(Front {
            port,
            target,
            tasks: Mutex::new(None),
        });
        front.up().await;
        front
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn up(&self) {
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let mut set = JoinSet::new();
        let target = self.target.clone();
        set.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let target = target.clone();
                conns.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        *self.tasks.lock().unwrap() = Some(set);
    }

    fn down(&self) {
        // Dropping the set aborts the accept loop (closing the socket) and, with it, the
        // connection tasks it owns.
        if let Some(mut set) = self.tasks.lock().unwrap().take() {
            set.abort_all();
        }
    }
}

const LEASE_S: u64 = 2;

fn trouble_config(store: &TestStore, url: &str, extra: &str) -> String {
    let consumer = consumer_toml(
        "payments",
        url,
        &format!(
            "key = \"{{message_id}}\"\nlease = \"{LEASE_S}s\"\nmax_attempts = 8\nconcurrency = 16\n{extra}"
        ),
    )
    .replace("timeout = \"1s\"", "timeout = \"600ms\"");
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

/// Posts `n` payments named `prefix-i`, `per_s` a second; every answer must be 202.
async fn post_steadily(base: &str, prefix: &str, n: usize, per_s: u64) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        let status = post_payment(base, &key).await;
        assert_eq!(
            status, 202,
            "{key}: intake keeps accepting while the provider is down"
        );
        keys.push(key);
        tokio::time::sleep(Duration::from_millis(1000 / per_s)).await;
    }
    keys
}

/// Waits until no claim of `keys` is open; then every one must be completed, applied once.
async fn all_completed_once(
    running: &claimd::service::run::Running,
    provider: &Provider,
    keys: &[String],
    within: Duration,
) {
    let store = running.app().store.clone();
    let start = Instant::now();
    let settled = eventually(within, || async {
        let open = store
            .list(&ClaimFilter {
                state: Some(ClaimState::Started),
                consumer: None,
                stuck: false,
                since: None,
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        open.is_empty()
    })
    .await;
    let mut wrong = Vec::new();
    for key in keys {
        let c = store.get("payments", "", key).await.unwrap().unwrap();
        if c.state != ClaimState::Completed || provider.applied(key) != 1 {
            wrong.push(format!(
                "{key}: {} applied {} ({:?})",
                c.state,
                provider.applied(key),
                c.last_error
            ));
        }
    }
    assert!(
        settled && wrong.is_empty(),
        "after {:?}: {} of {} wrong, e.g. {:?}",
        start.elapsed(),
        wrong.len(),
        keys.len(),
        &wrong[..wrong.len().min(5)]
    );
}

/// The outage scenario: payments before, during and after ten leases of `mode` (or of refused
/// connections when `mode` is `None`).
async fn outage(store: TestStore, mode: Option<Mode>) {
    let provider = Provider {
        mode: Arc::new(AtomicU8::new(0)),
        books: Arc::default(),
        limit_per_s: 0,
    };
    let front = Front::start(provider.clone()).await;
    let running = start(&trouble_config(&store, &front.url(), "")).await;
    let base = format!("http://{}", running.http_addr);
    let mut keys = post_steadily(&base, "before", 20, 20).await;
    match mode {
        Some(m) => provider.set(m),
        None => front.down(),
    }
    let down_for = Duration::from_secs(10 * LEASE_S + 2);
    let down_since = Instant::now();
    let counted_from = provider.books.lock().unwrap().while_down;
    // Payments keep arriving through the outage, 10 a second.
    let during = {
        let base = base.clone();
        tokio::spawn(async move { post_steadily(&base, "during", 100, 10).await })
    };
    tokio::time::sleep(down_for / 2).await;
    // claimd is healthy; its provider is not: the instance stays ready.
    let ready = client().get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(
        ready.status().as_u16(),
        200,
        "ready while the provider is down"
    );
    tokio::time::sleep(down_for.saturating_sub(down_since.elapsed())).await;
    let while_down = provider.books.lock().unwrap().while_down - counted_from;
    provider.set(Mode::Up);
    if mode.is_none() {
        front.up().await;
    }
    let recovered = Instant::now();
    keys.extend(during.await.unwrap());
    keys.extend(post_steadily(&base, "after", 20, 20).await);
    all_completed_once(&running, &provider, &keys, Duration::from_secs(60)).await;
    let recovery = recovered.elapsed();
    // At most 2 requests a second reach a provider that is down, plus one burst of at most
    // `concurrency` (16) when it goes down.
    let allowed = 2 * down_for.as_secs() + 16;
    assert!(
        while_down <= allowed,
        "{while_down} requests reached the provider in {down_for:?} down (at most {allowed})"
    );
    let counts = running.app().store.counts(None).await.unwrap();
    let c = counts.iter().find(|c| c.consumer == "payments").unwrap();
    assert_eq!(
        (c.needs_attention, c.failed, c.started),
        (0, 0, 0),
        "nothing parked, failed or left started"
    );
    eprintln!(
        "{mode:?}: {} payments, {while_down} requests while down for {down_for:?}, all completed {recovery:?} after recovery",
        keys.len()
    );
    running.shutdown(Duration::from_secs(2)).await;
}

macro_rules! outage_tests {
    ($($name:ident: $mode:expr,)*) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                outage(TestStore::sqlite(), $mode).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(store) = TestStore::pg().await else { return };
                outage(store, $mode).await;
            }
        }
    )*};
}

outage_tests! {
    refused_for_ten_leases: None,
    hanging_for_ten_leases: Some(Mode::Hang),
    answering_503_for_ten_leases: Some(Mode::Unavailable),
    answering_429_for_ten_leases: Some(Mode::Limited),
}

/// 1,500 payments to a provider that takes 50 POSTs a second: how many 429s they cost.
async fn rate_limited(rate_limit: &str) -> (u64, usize) {
    let store = TestStore::sqlite();
    let provider = Provider {
        mode: Arc::new(AtomicU8::new(0)),
        books: Arc::default(),
        limit_per_s: 50,
    };
    let front = Front::start(provider.clone()).await;
    let mut toml = trouble_config(&store, &front.url(), "lease = \"5s\"");
    if !rate_limit.is_empty() {
        toml = toml.replace(
            "kind = \"http\"\n",
            &format!("kind = \"http\"\nrate_limit = \"{rate_limit}\"\n"),
        );
    }
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let sent = Arc::new(AtomicU64::new(0));
    let mut posts = JoinSet::new();
    for w in 0..8 {
        let base = base.clone();
        let sent = sent.clone();
        posts.spawn(async move {
            let mut keys = Vec::new();
            for i in 0..1500 / 8 + usize::from(w < 1500 % 8) {
                let key = format!("rl-{w}-{i}");
                assert_eq!(post_payment(&base, &key).await, 202);
                sent.fetch_add(1, Ordering::SeqCst);
                keys.push(key);
            }
            keys
        });
    }
    let mut keys = Vec::new();
    while let Some(k) = posts.join_next().await {
        keys.extend(k.unwrap());
    }
    all_completed_once(&running, &provider, &keys, Duration::from_secs(120)).await;
    let limited = provider.books.lock().unwrap().limited;
    running.shutdown(Duration::from_secs(2)).await;
    (limited, keys.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_rate_limit_keeps_429s_under_two_percent() {
    let (limited, n) = rate_limited("50/s").await;
    eprintln!("rate_limit = \"50/s\": {limited} answers 429 for {n} payments");
    assert!(
        limited * 50 <= n as u64,
        "{limited} answers 429 for {n} payments (at most 0.02 a payment)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_rate_limit_429s_slow_the_destination_down() {
    let (limited, n) = rate_limited("").await;
    eprintln!("no rate_limit: {limited} answers 429 for {n} payments");
    assert!(
        limited * 4 <= n as u64,
        "{limited} answers 429 for {n} payments (at most 0.25 a payment)"
    );
}

/// A provider whose first calls are scripted, then up.
async fn scripted(script: Vec<(u16, Vec<u8>, Option<String>)>) -> (Provider, Arc<Front>) {
    let provider = Provider {
        mode: Arc::new(AtomicU8::new(0)),
        books: Arc::new(Mutex::new(Books {
            script,
            ..Default::default()
        })),
        limit_per_s: 0,
    };
    let front = Front::start(provider.clone()).await;
    (provider, front)
}

async fn wait_settled(
    running: &claimd::service::run::Running,
    key: &str,
) -> claimd::domain::claim::Claim {
    let store = running.app().store.clone();
    eventually(Duration::from_secs(40), || async {
        let c = store.get("payments", "", key).await.unwrap().unwrap();
        c.state != ClaimState::Started
    })
    .await;
    store.get("payments", "", key).await.unwrap().unwrap()
}

/// Finding 1: a `429` whose `Retry-After` is longer than the attempt's budget is waited out
/// (the claim's lease set to end then), not re-sent at once and counted until parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_longer_than_the_lease_is_waited_out() {
    let store = TestStore::sqlite();
    let (provider, front) = scripted(vec![(429, b"slow down".to_vec(), Some("6".into()))]).await;
    let toml = trouble_config(&store, &front.url(), "lease = \"2s\"\nmax_attempts = 3");
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post_payment(&base, "ra-1").await, 202);
    let c = wait_settled(&running, "ra-1").await;
    assert_eq!(c.state, ClaimState::Completed, "{:?}", c.last_error);
    let calls = provider.books.lock().unwrap().calls.clone();
    assert_eq!(calls.len(), 2, "one 429, then one call after Retry-After");
    let gap = calls[1] - calls[0];
    assert!(gap >= Duration::from_secs(6), "sent again after {gap:?}");
    assert_eq!(provider.applied("ra-1"), 1);
    running.shutdown(Duration::from_secs(2)).await;
}

/// Finding 2: `not_found_after` longer than lease + sweep period is still reached: the quiet
/// time is carried across takeovers, and an unapplied unknown is re-sent, not parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_status_search_is_trusted_after_not_found_after_across_takeovers() {
    let store = TestStore::sqlite();
    // The first call fails with a 500 (applied nothing); lookups then say "not found".
    let (provider, front) = scripted(vec![(500, b"oops".to_vec(), None)]).await;
    let toml = trouble_config(&store, &front.url(), "lease = \"2s\"\nmax_attempts = 3").replace(
        "kind = \"http\"\n",
        "kind = \"http\"\nnot_found_after = \"6s\"\n",
    );
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post_payment(&base, "nf-1").await, 202);
    let c = wait_settled(&running, "nf-1").await;
    assert_eq!(c.state, ClaimState::Completed, "{:?}", c.last_error);
    assert_eq!(c.resent_count, 1, "re-sent once after the lookups agreed");
    let calls = provider.books.lock().unwrap().calls.clone();
    assert_eq!(calls.len(), 2);
    assert!(calls[1] - calls[0] >= Duration::from_secs(6));
    assert_eq!(provider.applied("nf-1"), 1);
    running.shutdown(Duration::from_secs(2)).await;
}

/// Finding 3: `claimd sweep` waits for the claims it took before it exits (a claim retried
/// within its attempt outlives the pass's wait of one call timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claimd_sweep_finishes_what_it_started_before_it_exits() {
    let store = TestStore::sqlite();
    let unavailable = || (503, b"try later".to_vec(), None);
    let (provider, front) = scripted(vec![unavailable(), unavailable(), unavailable()]).await;
    // Three 503s and their backoffs (100, 200, 400 ms) outlast the pass's wait of one 200 ms
    // call timeout.
    let toml = trouble_config(&store, &front.url(), "lease = \"20s\"")
        .replace("timeout = \"600ms\"", "timeout = \"200ms\"");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sweep.toml");
    std::fs::write(&config, &toml).unwrap();
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    let s = app.store.clone();
    s.claim(&orphan_claim("payments", "", "sw-1", "sw-1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (code, out, err) = cli(&["sweep", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("background"), "{out}");
    let c = s.get("payments", "", "sw-1").await.unwrap().unwrap();
    assert_eq!(c.state, ClaimState::Completed, "{out}");
    assert_eq!(provider.applied("sw-1"), 1);
}

/// Finding 4: a NUL byte in the provider's answer does not keep a claim from settling on
/// PostgreSQL (whose text columns refuse it); the answer is stored with the byte escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_byte_in_the_answer_settles_on_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (provider, front) = scripted(vec![(200, b"ok\0bin".to_vec(), None)]).await;
    let running = start(&trouble_config(&store, &front.url(), "")).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post_payment(&base, "nul-1").await, 202);
    let c = wait_settled(&running, "nul-1").await;
    assert_eq!(c.state, ClaimState::Completed, "{:?}", c.last_error);
    assert_eq!(c.provider_response.as_deref(), Some("ok\\0bin"));
    assert_eq!(provider.applied("nul-1"), 1);
    running.shutdown(Duration::from_secs(2)).await;
}
