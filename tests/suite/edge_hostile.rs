//! Hostile input stays inert (issue 24, the HTTP items), each against a real worker over
//! loopback: DNS rebinding and cross-site changes on the token-less default, idle connections
//! holding the connection cap, trickling bodies holding the body budget, sign-in guessing, the
//! request head limit, the HTML answers' headers and sign-out's CSRF token, and readiness while
//! every store write fails.

use crate::common;

use common::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A hand-written HTTP/1.1 request (any `Host`, any header) on a connection of its own:
/// status, head and body of the answer.
async fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_ascii_lowercase(), body.to_string())
}

async fn post(addr: SocketAddr, key: &str) -> (u16, Duration) {
    let t = Instant::now();
    let r = client()
        .post(format!("http://{addr}/v1/messages/payments"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body("{\"amount\":1}")
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), t.elapsed())
}

const EVIL: &str = "rebind.evil.example";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_only_local_names_reach_the_routes_and_foreign_origins_change_nothing() {
    let (_store, _sb, running) = payments_worker("").await;
    let addr = running.http_addr;
    let store = running.app().store.clone();
    parked_claim(&store, "payments", "parked-1", "unknown outcome").await;
    let evil_host = format!("{EVIL}:{}", addr.port());
    let evil_origin = format!("http://{evil_host}");
    let json = ("Content-Type", "application/json");

    // A page on another name resolved to 127.0.0.1 (DNS rebinding): its own name as Host and
    // as Origin. Refused on every route a token would guard, nothing recorded or moved.
    let rebound = [
        ("Host", evil_host.as_str()),
        ("Origin", evil_origin.as_str()),
    ];
    for (method, path, body) in [
        ("GET", "/", ""),
        ("GET", "/v1/claims", ""),
        ("GET", "/v1/report", ""),
        ("POST", "/v1/messages/payments", "{\"amount\":100}"),
        ("GET", "/v1/messages/payments/evil", ""),
        (
            "POST",
            "/v1/claims/payments/parked-1/redrive",
            "{\"actor\":\"evil\"}",
        ),
    ] {
        let mut headers = rebound.to_vec();
        headers.push(("Idempotency-Key", "evil"));
        headers.push(json);
        let (status, _, text) = raw(addr, method, path, &headers, body).await;
        assert_eq!(status, 421, "{method} {path} with Host {EVIL}: {text}");
        assert!(text.contains("allowed_hosts"), "{text}");
    }
    assert!(store.get("payments", "", "evil").await.unwrap().is_none());
    let parked = store
        .get("payments", "", "parked-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parked.state.as_str(), "needs_attention", "not redriven");

    // A cross-site form or fetch to 127.0.0.1 itself: a local Host, a foreign Origin.
    for (method, path, body) in [
        ("POST", "/v1/messages/payments", "{\"amount\":100}"),
        (
            "POST",
            "/v1/claims/payments/parked-1/redrive",
            "{\"actor\":\"evil\"}",
        ),
    ] {
        for origin in [evil_origin.as_str(), "null"] {
            let headers = [
                ("Host", "127.0.0.1"),
                ("Origin", origin),
                ("Idempotency-Key", "cross-site"),
                json,
            ];
            let (status, _, text) = raw(addr, method, path, &headers, body).await;
            assert_eq!(status, 403, "{method} {path} from Origin {origin}: {text}");
        }
    }
    assert!(
        store
            .get("payments", "", "cross-site")
            .await
            .unwrap()
            .is_none()
    );

    // Local names, a listed name, a same-origin page, and probes with any Host keep working.
    let port = addr.port().to_string();
    for (i, host) in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ]
    .iter()
    .enumerate()
    {
        let origin = format!("http://{host}");
        let key = format!("local-{i}");
        let headers = [
            ("Host", host.as_str()),
            ("Origin", origin.as_str()),
            ("Idempotency-Key", key.as_str()),
            json,
        ];
        let (status, _, text) = raw(addr, "POST", "/v1/messages/payments", &headers, "{}").await;
        assert_eq!(status, 202, "Host {host}: {text}");
    }
    let (status, _, _) = raw(addr, "GET", "/v1/claims", &[("Host", "localhost")], "").await;
    assert_eq!(status, 200);
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, _, _) = raw(addr, "GET", path, &[("Host", EVIL)], "").await;
        assert_eq!(status, 200, "{path} stays open to probes");
    }
    assert_eq!(post(addr, "reqwest").await.0, 202);
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_in_allowed_hosts_is_served_without_tokens() {
    let (_store, _sb, running) = payments_worker("allowed_hosts = [\"claimd.internal\"]").await;
    let addr = running.http_addr;
    for (host, want) in [("claimd.internal:8080", 202), ("other.internal", 421)] {
        let origin = format!("http://{host}");
        let headers = [
            ("Host", host),
            ("Origin", origin.as_str()),
            ("Idempotency-Key", host),
            ("Content-Type", "application/json"),
        ];
        let (status, _, text) = raw(addr, "POST", "/v1/messages/payments", &headers, "{}").await;
        assert_eq!(status, want, "Host {host}: {text}");
    }
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_set_any_host_is_served() {
    let (_store, _sb, running) = payments_worker("intake_token = \"intake-secret-token\"").await;
    let addr = running.http_addr;
    let headers = [
        ("Host", "claimd.example.com"),
        ("Authorization", "Bearer intake-secret-token"),
        ("Idempotency-Key", "behind-a-balancer"),
        ("Content-Type", "application/json"),
    ];
    let (status, _, text) = raw(addr, "POST", "/v1/messages/payments", &headers, "{}").await;
    assert_eq!(status, 202, "{text}");
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_silent_connections_make_room_for_a_new_client_at_the_cap() {
    let (_store, _sb, running) = payments_worker("max_connections = 64").await;
    let addr = running.http_addr;
    let mut held = Vec::new();
    // 32 that sent one /healthz and went idle (keep-alive), then 32 that send nothing.
    for _ in 0..32 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        held.push(s);
    }
    for _ in 0..32 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut worst = Duration::ZERO;
    for i in 0..5 {
        let (status, took) = post(addr, &format!("past-the-cap-{i}")).await;
        assert_eq!(status, 202);
        worst = worst.max(took);
    }
    eprintln!("slowest of 5 posts with 64 idle or silent connections at the cap of 64: {worst:?}");
    assert!(
        worst < Duration::from_secs(2),
        "a post waited {worst:?} behind idle connections (the head timeout is 10 s)"
    );
    // The oldest idle ones were closed to make room.
    let mut closed = 0;
    for s in &mut held[..8] {
        let mut buf = [0u8; 16];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert!(closed >= 1, "an idle connection was shed");
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_bodies_do_not_hold_the_body_budget() {
    // The defaults: a 16 MiB budget, 1 MiB bodies; 16 clients declaring 1 MiB each.
    let (_store, _sb, running) = payments_worker("").await;
    let addr = running.http_addr;
    let mut tricklers = Vec::new();
    for i in 0..16 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/messages/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: trickle-{i}\r\nContent-Type: application/octet-stream\r\nContent-Length: 1048576\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        tricklers.push(tokio::spawn(async move {
            for _ in 0..30 {
                if s.write_all(&[b'x'; 64]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut statuses = Vec::new();
    let mut worst = Duration::ZERO;
    for i in 0..10 {
        let (status, took) = post(addr, &format!("beside-tricklers-{i}")).await;
        statuses.push(status);
        worst = worst.max(took);
    }
    eprintln!("10 posts beside 16 trickling 1 MiB bodies: {statuses:?}, slowest {worst:?}");
    assert!(statuses.iter().all(|s| *s == 202), "{statuses:?}");
    for t in tricklers {
        t.abort();
    }
    running.shutdown(Duration::from_secs(2)).await;
}

fn form_field<'a>(html: &'a str, name: &str) -> Option<&'a str> {
    let at = html.find(&format!("name=\"{name}\" value=\""))?;
    let rest = &html[at + name.len() + 15..];
    rest.split('"').next()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_guesses_are_throttled_per_client() {
    let (_store, _sb, running) = payments_worker("admin_token = \"s3cret-admin-token\"").await;
    let addr = running.http_addr;
    let form = [
        ("Host", "127.0.0.1"),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    let t = Instant::now();
    let mut statuses = Vec::new();
    for i in 0..40 {
        let (status, head, _) = raw(
            addr,
            "POST",
            "/signin",
            &form,
            &format!("name=mallory&token=guess-{i}"),
        )
        .await;
        if status == 429 {
            assert!(head.contains("retry-after: "), "{head}");
        }
        statuses.push(status);
    }
    let elapsed = t.elapsed();
    let tested = statuses.iter().filter(|s| **s == 401).count();
    eprintln!(
        "40 guesses in {elapsed:?} ({:.0}/s): {tested} checked (401), {} throttled (429)",
        40.0 / elapsed.as_secs_f64(),
        statuses.iter().filter(|s| **s == 429).count()
    );
    assert!(
        tested <= 5 + (elapsed.as_secs() as usize / 2) + 1,
        "{statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    // While throttled even the right token is not looked at.
    let (status, _, _) = raw(
        addr,
        "POST",
        "/signin",
        &form,
        "name=ann&token=s3cret-admin-token",
    )
    .await;
    assert_eq!(status, 429);
    // A wrong bearer token is answered as before (scripts are not locked out by guessers).
    let (status, _, _) = raw(
        addr,
        "GET",
        "/v1/claims",
        &[("Host", "127.0.0.1"), ("Authorization", "Bearer wrong")],
        "",
    )
    .await;
    assert_eq!(status, 401);
    // After the refill a person gets in.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (status, head, _) = raw(
        addr,
        "POST",
        "/signin",
        &form,
        "name=ann&token=s3cret-admin-token",
    )
    .await;
    assert_eq!(status, 303, "{head}");
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_heads_over_64_kib_are_refused_with_431() {
    let (_store, _sb, running) = payments_worker("").await;
    let addr = running.http_addr;
    for (pad, want) in [(60 * 1024, 202), (65 * 1024, 431), (100 * 1024, 431)] {
        let padding = "a".repeat(pad);
        let key = format!("head-{pad}");
        let headers = [
            ("Host", "127.0.0.1"),
            ("Idempotency-Key", key.as_str()),
            ("Content-Type", "application/json"),
            ("X-Padding", padding.as_str()),
        ];
        let (status, _, _) = raw(addr, "POST", "/v1/messages/payments", &headers, "{}").await;
        assert_eq!(status, want, "a head with {pad} bytes of padding");
    }
    running.shutdown(Duration::from_secs(2)).await;
}

fn assert_page_headers(what: &str, head: &str) {
    for h in [
        "content-security-policy: default-src 'none'",
        "frame-ancestors 'none'",
        "x-frame-options: deny",
        "cache-control: no-store",
        "x-content-type-options: nosniff",
    ] {
        assert!(head.contains(h), "{what}: {h} missing in\n{head}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_html_answer_has_the_page_headers_and_sign_out_needs_the_csrf_token() {
    let (_store, _sb, running) = payments_worker("admin_token = \"s3cret-admin-token\"").await;
    let addr = running.http_addr;
    let host = ("Host", "127.0.0.1");
    let form = ("Content-Type", "application/x-www-form-urlencoded");
    let (status, head, _) = raw(addr, "GET", "/signin", &[host], "").await;
    assert_eq!(status, 200);
    assert_page_headers("GET /signin", &head);
    let (status, head, _) = raw(addr, "POST", "/signin", &[host, form], "name=ann&token=no").await;
    assert_eq!(status, 401);
    assert_page_headers("a refused sign-in", &head);

    let (status, head, _) = raw(
        addr,
        "POST",
        "/signin",
        &[host, form],
        "name=ann&token=s3cret-admin-token",
    )
    .await;
    assert_eq!(status, 303);
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_string();
    let cookie = ("Cookie", cookie.as_str());
    let (status, _, page) = raw(addr, "GET", "/", &[host, cookie], "").await;
    assert_eq!(status, 200);
    let csrf = form_field(&page, "csrf").expect("the page's forms carry the CSRF token");
    let signout = &page[page.find("action=\"/signout\"").expect("a sign-out form")..];
    assert!(
        signout[..signout.find("</form>").unwrap()].contains(&format!("value=\"{csrf}\"")),
        "the sign-out form carries the CSRF token"
    );
    let preview = format!("csrf={csrf}&action=redrive&consumer=payments&reason=x");
    let (status, head, _) = raw(
        addr,
        "POST",
        "/actions/preview",
        &[host, cookie, form],
        &preview,
    )
    .await;
    assert!(status == 200 || status == 400, "{status}");
    assert_page_headers("POST /actions/preview", &head);

    // Sign-out from another site (no token): refused, the cookie kept.
    let (status, head, _) = raw(addr, "POST", "/signout", &[host, cookie], "").await;
    assert_eq!(status, 403, "{head}");
    assert!(!head.contains("set-cookie"), "{head}");
    let (status, head, _) = raw(
        addr,
        "POST",
        "/signout",
        &[host, cookie, form],
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 303);
    assert!(head.contains("set-cookie: claimd_session=;"), "{head}");
    running.shutdown(Duration::from_secs(2)).await;
}

async fn readyz(addr: SocketAddr) -> (u16, serde_json::Value) {
    let r = client()
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unready_while_every_store_write_fails_and_ready_again_when_one_succeeds() {
    use sqlx::Connection;
    let (store, _sb, running) = payments_worker("").await;
    let addr = running.http_addr;
    assert_eq!(readyz(addr).await.0, 200);
    // The database refuses every write, as SQLite on a full disk does; reads still work.
    let mut db = sqlx::SqliteConnection::connect(&store.url()).await.unwrap();
    for table in ["claims", "claimd_heartbeats"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TRIGGER full_{table}_insert BEFORE INSERT ON {table} BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;"
        )))
        .execute(&mut db)
        .await
        .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TRIGGER full_{table}_update BEFORE UPDATE ON {table} BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;"
        )))
        .execute(&mut db)
        .await
        .unwrap();
    }
    let mut refused = 0;
    for i in 0..20 {
        if post(addr, &format!("full-{i}")).await.0 == 503 {
            refused += 1;
        }
    }
    assert_eq!(refused, 20, "every post answered 503 (nothing committed)");
    let (status, body) = readyz(addr).await;
    eprintln!("/readyz with every write failing: {status} {body}");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["ready"], false);
    assert_eq!(body["store"], "ok", "reads still work: {body}");
    assert!(
        body["writes"].as_str().unwrap().contains("disk is full"),
        "{body}"
    );
    // Room again: the next probe or write succeeds and the instance is ready.
    for table in ["claims", "claimd_heartbeats"] {
        for what in ["insert", "update"] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP TRIGGER full_{table}_{what}"
            )))
            .execute(&mut db)
            .await
            .unwrap();
        }
    }
    let t = Instant::now();
    let ready = eventually(Duration::from_secs(5), || async move {
        readyz(addr).await.0 == 200
    })
    .await;
    assert!(ready, "ready again once writes succeed");
    eprintln!("ready again {:?} after writes were possible", t.elapsed());
    assert_eq!(post(addr, "after-full").await.0, 202);
    running.shutdown(Duration::from_secs(2)).await;
}
