//! `Prefer: wait` cannot take every connection, probes always answer, JSON bodies are parsed:
//! a thousand clients waiting on one claim leave `/readyz` and intake answered (the waiters
//! are capped at `[http] max_waiters`, at most half of `max_connections`); a settle wakes its
//! waiters at once, without them reading the store over and over; `/healthz`, `/readyz` and
//! `/metrics` answer while every connection is in a request; a body sent as JSON that is not
//! JSON is refused `400` and nothing is claimed.

use super::common::*;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// A provider that holds every call until its gate opens, then applies it: a claim stays
/// `started` (not settled) for as long as the test wants.
struct HeldProvider {
    url: String,
    gate: watch::Sender<bool>,
}

impl HeldProvider {
    async fn start() -> HeldProvider {
        let (gate, open) = watch::channel(false);
        let app = Router::new()
            .route(
                "/v1/effects/{key}",
                get(|| async { (StatusCode::NOT_FOUND, "{}") }),
            )
            .route(
                "/v1/{*path}",
                post(move || {
                    let mut open = open.clone();
                    async move {
                        let _ = open.wait_for(|o| *o).await;
                        (StatusCode::OK, "{\"id\":\"ch_1\"}")
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        HeldProvider { url, gate }
    }

    fn release(&self) {
        self.gate.send_replace(true);
    }
}

/// A `payments` consumer whose calls may be held for up to 45 s (the lease outlasts them, so
/// the sweeper leaves the claim alone).
fn held_consumer(provider: &str) -> String {
    format!(
        r#"
[[consumers]]
name = "payments"
source = "http"
concurrency = 32
lease = "60s"
max_attempts = 5
redrive_within = "1h"
on_unknown = "reconcile"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "45s"
status_url = "{provider}/v1/effects/{{key}}"
"#
    )
}

/// One answer read off a raw connection.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Sends one request on a new connection (`Connection: close`) and reads the whole answer;
/// `None` when it does not come within `within`.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
    within: Duration,
) -> Option<Answer> {
    let exchange = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n{headers}\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        Some(Answer {
            status: head.get(9..12)?.parse().ok()?,
            head: head.to_string(),
            body: body.to_string(),
        })
    };
    tokio::time::timeout(within, exchange).await.ok().flatten()
}

async fn post_json(addr: SocketAddr, key: &str, within: Duration) -> Option<Answer> {
    let headers = format!("Idempotency-Key: {key}\r\nContent-Type: application/json\r\n");
    request(
        addr,
        "POST",
        "/v1/messages/payments",
        &headers,
        r#"{"amount": 100}"#,
        within,
    )
    .await
}

/// Transactions committed in database `name` (every store read is one), as PostgreSQL counts
/// them.
async fn commits(name: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&pg_admin_url()).await.unwrap();
    let n: i64 =
        sqlx::query_scalar("SELECT xact_commit::bigint FROM pg_stat_database WHERE datname = $1")
            .bind(name)
            .fetch_one(&mut c)
            .await
            .unwrap();
    n
}

/// Store reads per second in database `name` over `window` (PostgreSQL publishes a backend's
/// counts within about a second, so windows are a few seconds long).
async fn reads_per_second(name: &str, window: Duration) -> f64 {
    let before = commits(name).await;
    tokio::time::sleep(window).await;
    // Let the last second's counts land.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let after = commits(name).await;
    (after - before) as f64 / (window.as_secs_f64() + 1.1)
}

fn db_name(store: &TestStore) -> String {
    store.url().rsplit('/').next().unwrap().to_string()
}

/// CPU seconds the process `pid` has used (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are the 14th and 15th fields; 12th and 13th after "(name)".
    (ticks(11) + ticks(12)) / 100.0
}

fn percentile(sorted: &[u128], p: f64) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: cargo test --features full --test suite -- --ignored"]
async fn a_thousand_waiters_leave_the_probes_and_intake_answered() {
    const WAITERS: usize = 1000;
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let db = db_name(&store);
    let provider = HeldProvider::start().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Lower than the thousand waiters: every one of them would hold a connection.
    let toml = config_toml_with(
        &store.url(),
        "max_connections = 512",
        &held_consumer(&provider.url),
    )
    .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    let config = dir.path().join("claimd.toml");
    std::fs::write(&config, toml).unwrap();
    let worker = Worker::spawn(&config, port, &dir.path().join("claimd.log")).await;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let pid = worker.child.id();

    let first = post_json(addr, "held-1", Duration::from_secs(5)).await;
    assert_eq!(first.map(|a| a.status), Some(202), "the claim is taken");
    let idle_reads = reads_per_second(&db, Duration::from_secs(3)).await;

    let started = Instant::now();
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        waiters.push(tokio::spawn(async move {
            // In a burst of new connections, at the cap, the listener closes the connection
            // that has waited longest for a request (possibly one whose request it has not
            // read yet: closed without an answer), and a connection taken while every other
            // is in a request serves only the probes (503 + Retry-After). A GET is then sent
            // again, as HTTP clients do.
            let mut again = 0;
            loop {
                let a = request(
                    addr,
                    "GET",
                    "/v1/messages/payments/held-1",
                    "Prefer: wait=30\r\n",
                    "",
                    Duration::from_secs(60),
                )
                .await;
                let busy = a.as_ref().is_some_and(|a| a.status == 503);
                let retry = a.is_none() || busy;
                if !retry || again == 5 || started.elapsed() > Duration::from_secs(8) {
                    return (started.elapsed(), a, again);
                }
                again += 1;
                let pause = if busy { 1000 } else { 200 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A load balancer's probe every 100 ms for 10 s, each on a new connection; one intake post
    // half-way.
    let cpu_before = cpu_seconds(pid);
    let probing = Instant::now();
    let mut readyz_ms = Vec::new();
    let mut readyz_failed = 0;
    let mut probes_shed = 0;
    let mut intake = None;
    while probing.elapsed() < Duration::from_secs(10) {
        let t = Instant::now();
        let mut probe = request(addr, "GET", "/readyz", "", "", Duration::from_secs(5)).await;
        if probe.is_none() && t.elapsed() < Duration::from_millis(500) {
            // Closed unanswered: at the cap, a connection whose request has not been read yet
            // may be the one that waited longest, and is shed. A load balancer counts one
            // such probe as a miss and asks again; so does this one, within the same second.
            probes_shed += 1;
            probe = request(addr, "GET", "/readyz", "", "", Duration::from_secs(5)).await;
        }
        match probe {
            Some(a) if a.status == 200 => readyz_ms.push(t.elapsed().as_millis()),
            _ => {
                readyz_failed += 1;
                readyz_ms.push(t.elapsed().as_millis());
            }
        }
        if intake.is_none() && probing.elapsed() > Duration::from_secs(5) {
            let t = Instant::now();
            let a = post_json(addr, "during-the-wait", Duration::from_secs(5)).await;
            intake = Some((a.map(|a| a.status), t.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(100).saturating_sub(t.elapsed())).await;
    }
    let cpu = (cpu_seconds(pid) - cpu_before) / probing.elapsed().as_secs_f64() * 100.0;
    let still_waiting = waiters.iter().filter(|w| !w.is_finished()).count();
    let waiting_reads = reads_per_second(&db, Duration::from_secs(3)).await;
    let metrics = request(addr, "GET", "/metrics", "", "", Duration::from_secs(5))
        .await
        .map(|a| a.body)
        .unwrap_or_default();

    let released = Instant::now();
    provider.release();
    let mut answers = Vec::new();
    for w in waiters {
        answers.push(w.await.unwrap());
    }
    let settled_after = released.elapsed();
    let resent: usize = answers.iter().map(|(_, _, closed)| closed).sum();

    readyz_ms.sort_unstable();
    let at_once: Vec<u128> = answers
        .iter()
        .filter(|(_, a, _)| a.as_ref().is_some_and(|a| a.json()["state"] == "started"))
        .map(|(took, _, _)| took.as_millis())
        .collect();
    let per_waiter = (waiting_reads - idle_reads).max(0.0) / still_waiting.max(1) as f64;
    eprintln!(
        "| waiters | answered at once (slowest ms) | waited | readyz polls | readyz p50 ms | readyz max ms | intake post | worker CPU % | store reads/s idle | waiting | per waiter |"
    );
    eprintln!(
        "| {WAITERS} | {} ({}) | {still_waiting} | {} | {} | {} | {:?} | {cpu:.0} | {idle_reads:.1} | {waiting_reads:.1} | {per_waiter:.2} |",
        at_once.len(),
        at_once.iter().max().unwrap_or(&0),
        readyz_ms.len(),
        percentile(&readyz_ms, 0.5),
        percentile(&readyz_ms, 1.0),
        intake,
    );
    eprintln!("/readyz probes closed unanswered and asked again: {probes_shed}");
    eprintln!(
        "waiters answered {settled_after:?} after the provider was released; {resent} GETs sent again (connection closed unanswered to make room at the cap, or 503 + Retry-After)"
    );
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("claimd_http_wait"))
    {
        eprintln!("{line}");
    }

    assert_eq!(readyz_failed, 0, "every /readyz answered 200");
    assert!(
        percentile(&readyz_ms, 1.0) < 1000,
        "/readyz answered within 1 s throughout: {readyz_ms:?}"
    );
    let (intake_status, intake_took) = intake.expect("an intake post was sent");
    assert_eq!(
        intake_status,
        Some(202),
        "intake answered beside the waiters"
    );
    assert!(intake_took < Duration::from_secs(2), "{intake_took:?}");
    assert!(
        still_waiting > 0 && still_waiting <= 256,
        "at most half of max_connections wait: {still_waiting}"
    );
    assert!(
        metrics.contains("claimd_http_waiters_limit 256"),
        "{metrics}"
    );
    let mut waited = 0;
    for (took, a, _) in &answers {
        let a = a.as_ref().expect("every waiter was answered");
        assert_eq!(a.status, 200, "{}", a.body);
        if a.json()["state"] == "completed" {
            // Waited for the outcome: the preference was applied, as asked.
            assert_eq!(a.header("Preference-Applied").as_deref(), Some("wait=30"));
            waited += 1;
        } else {
            // Answered at once with the claim as it was: no preference applied.
            assert_eq!(a.json()["state"], "started", "{}", a.body);
            assert_eq!(a.header("Preference-Applied"), None, "{}", a.head);
            assert!(
                *took < Duration::from_secs(10),
                "answered at once: {took:?}"
            );
        }
    }
    assert_eq!(waited, still_waiting, "every waiter got the outcome");
    worker.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_wakes_its_waiters_at_once_without_them_polling_the_store() {
    const WAITERS: usize = 50;
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let db = db_name(&store);
    let provider = HeldProvider::start().await;
    let running = start(&config_toml(&store.url(), &held_consumer(&provider.url))).await;
    let addr = running.http_addr;
    let first = post_json(addr, "wake-1", Duration::from_secs(5)).await;
    assert_eq!(first.map(|a| a.status), Some(202));
    let idle_reads = reads_per_second(&db, Duration::from_secs(3)).await;

    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        waiters.push(tokio::spawn(async move {
            let a = request(
                addr,
                "GET",
                "/v1/messages/payments/wake-1",
                "Prefer: wait=30\r\n",
                "",
                Duration::from_secs(40),
            )
            .await;
            (Instant::now(), a)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting_reads = reads_per_second(&db, Duration::from_secs(4)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "every waiter still waits"
    );
    let released = Instant::now();
    provider.release();
    let mut latest = Duration::ZERO;
    for w in waiters {
        let (at, a) = w.await.unwrap();
        let a = a.expect("answered");
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.json()["state"], "completed", "{}", a.body);
        assert_eq!(a.header("Preference-Applied").as_deref(), Some("wait=30"));
        latest = latest.max(at.duration_since(released));
    }
    let per_waiter = (waiting_reads - idle_reads).max(0.0) / WAITERS as f64;
    eprintln!(
        "| waiters | store reads/s idle | waiting | per waiter per second | last answer after the settle |"
    );
    eprintln!(
        "| {WAITERS} | {idle_reads:.1} | {waiting_reads:.1} | {per_waiter:.2} | {} ms |",
        latest.as_millis()
    );
    assert!(
        latest < Duration::from_millis(500),
        "every waiter answered within 0.5 s of the settle: {latest:?}"
    );
    // Woken by the settle; a slow re-read (every 2 s) only for settles elsewhere.
    assert!(
        per_waiter < 1.0,
        "a waiter reads the store {per_waiter:.2} times a second"
    );
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_while_every_connection_is_in_a_request() {
    let store = TestStore::sqlite();
    let provider = HeldProvider::start().await;
    let running = start(&config_toml_with(
        &store.url(),
        "max_connections = 16\nbody_read_timeout = \"20s\"",
        &held_consumer(&provider.url),
    ))
    .await;
    let addr = running.http_addr;
    // Sixteen posts that declare a body and never send it: every connection is in a request
    // for body_read_timeout.
    let mut slow = Vec::new();
    for i in 0..16 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/messages/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: slow-{i}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        slow.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut took = Vec::new();
    for round in 0..3 {
        for path in ["/healthz", "/readyz", "/metrics"] {
            let t = Instant::now();
            let a = request(addr, "GET", path, "", "", Duration::from_secs(3)).await;
            let ms = t.elapsed().as_millis();
            assert_eq!(
                a.map(|a| a.status),
                Some(200),
                "{path} (round {round}) answered with every connection in a request"
            );
            assert!(ms < 1000, "{path} took {ms} ms");
            took.push((path, ms));
        }
    }
    // Intake on a probes' connection: a clear 503, at once, nothing recorded.
    let t = Instant::now();
    let busy = post_json(addr, "at-the-cap", Duration::from_secs(3))
        .await
        .expect("intake answered at the cap");
    let busy_ms = t.elapsed().as_millis();
    assert_eq!(busy.status, 503, "{}", busy.body);
    assert_eq!(busy.header("Retry-After").as_deref(), Some("1"));
    assert!(
        busy.body.contains("max_connections") && busy.body.contains("/healthz"),
        "{}",
        busy.body
    );
    eprintln!("| probe | ms |");
    for (path, ms) in &took {
        eprintln!("| {path} | {ms} |");
    }
    eprintln!("| intake POST (503) | {busy_ms} |");
    // Once the slow clients go, intake is served as before and nothing was recorded for the
    // refused post.
    drop(slow);
    let served = post_json(addr, "after-the-cap", Duration::from_secs(5)).await;
    assert_eq!(served.map(|a| a.status), Some(202));
    let refused = request(
        addr,
        "GET",
        "/v1/messages/payments/at-the-cap",
        "",
        "",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(refused.map(|a| a.status), Some(404), "nothing was recorded");
    provider.release();
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_as_json_that_is_not_json_is_refused_and_not_claimed() {
    let store = TestStore::sqlite();
    let provider = HeldProvider::start().await;
    let running = start(&config_toml(&store.url(), &held_consumer(&provider.url))).await;
    let addr = running.http_addr;
    let within = Duration::from_secs(5);
    for (key, content_type, body) in [
        ("bad-json-1", "application/json", "{not json"),
        (
            "bad-json-2",
            "application/vnd.api+json; charset=utf-8",
            "nope",
        ),
        ("bad-json-3", "application/json", ""),
    ] {
        let headers = format!("Idempotency-Key: {key}\r\nContent-Type: {content_type}\r\n");
        let a = request(
            addr,
            "POST",
            "/v1/messages/payments",
            &headers,
            body,
            within,
        )
        .await
        .expect("answered");
        assert_eq!(a.status, 400, "{content_type} {body:?}: {}", a.body);
        let detail = a.json()["detail"].as_str().unwrap_or("").to_string();
        assert!(
            detail.contains("not valid JSON") && detail.contains("nothing was recorded"),
            "{detail}"
        );
        if key == "bad-json-1" {
            assert!(detail.contains("line 1 column 2"), "{detail}");
            eprintln!("{content_type} {body:?} -> 400: {detail}");
        }
        let get = request(
            addr,
            "GET",
            &format!("/v1/messages/payments/{key}"),
            "",
            "",
            within,
        )
        .await
        .expect("answered");
        assert_eq!(get.status, 404, "no claim for {key}: {}", get.body);
    }
    // Other content types are passed on as before.
    let headers = "Idempotency-Key: plain-1\r\nContent-Type: text/plain\r\n";
    let a = request(
        addr,
        "POST",
        "/v1/messages/payments",
        headers,
        "{not json",
        within,
    )
    .await
    .expect("answered");
    assert_eq!(a.status, 202, "{}", a.body);
    provider.release();
    running.shutdown(Duration::from_secs(2)).await;
}
