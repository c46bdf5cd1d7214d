//! The operator page (`GET /`): behind the admin token, it shows stuck and parked claims with
//! their reasons and the commands that resolve them; headless Chromium renders it (screenshot
//! in `target/dashboard.png`) through a local proxy that adds the bearer token, since a browser
//! started from the command line cannot send one.

use crate::common;

use claimd::domain::claim::{ClaimState, NewClaim, fingerprint};
use claimd::store::{ClaimOutcome, NewEvent, Settlement, Store};
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const TOKEN: &str = "t0ken-0123456789abcdef";
const PARKED_REASON: &str =
    "outcome unknown (timeout after 10s, request sent); on_unknown = \"park\"";
const EXHAUSTED_REASON: &str = "attempts exhausted: attempt 8 of max_attempts 8";
const EVIL_ID: &str = "<script>alert(1)</script>";

/// A worker with an admin token and a sweeper that does not fire during the test (once a
/// year), so stuck claims stay stuck and the page shows that no pass has run: a worker this
/// young is within its start-up grace (three schedule periods), so the sweeper reads
/// "STARTING", not "NOT RUNNING" (issue 12: readiness and health right after a start).
async fn start_worker(store: &TestStore) -> claimd::service::run::Running {
    let consumers = consumer_toml("payments", "http://127.0.0.1:9", "")
        + &consumer_toml("emails", "http://127.0.0.1:9", "");
    let toml = config_toml_with(
        &store.url(),
        &format!("admin_token = \"{TOKEN}\""),
        &consumers,
    )
    .replacen(
        "schedule = \"* * * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
        1,
    );
    start(&toml).await
}

fn new_claim(consumer: &str, tenant: &str, id: &str, lease: Duration) -> NewClaim {
    NewClaim {
        consumer: consumer.into(),
        tenant: tenant.into(),
        message_id: id.into(),
        idem_key: id.into(),
        fingerprint: fingerprint(id.as_bytes()),
        payload: id.as_bytes().to_vec().into(),
        content_type: "application/json".into(),
        worker: "dead-worker".into(),
        lease,
        claim_token: claimd::domain::claim::new_claim_token(),
        mark_not_called: false,
        order_key: None,
        not_before: None,
        trace_parent: None,
        priority: 0,
    }
}

async fn claim(s: &Store, consumer: &str, tenant: &str, id: &str, lease: Duration) -> i64 {
    match s
        .claim(&new_claim(consumer, tenant, id, lease))
        .await
        .unwrap()
    {
        ClaimOutcome::Created(c) => c.id,
        other => panic!("new claim expected: {other:?}"),
    }
}

async fn settle(s: &Store, id: i64, state: ClaimState, error: Option<&str>) {
    let ev = NewEvent {
        actor: "test",
        action: "perform",
        outcome: state.as_str(),
        provider_status: None,
        detail: error,
    };
    let set = Settlement {
        state: Some(state),
        error: error.map(str::to_string),
        ..Default::default()
    };
    assert!(s.settle(id, 1, &set, &ev).await.unwrap());
}

/// Moves a claim's `received_utc` back by `secs`, so ages and times to complete spread over the
/// chart's buckets (test data only: claimd never writes times other than the database's now).
async fn age(url: &str, id: i64, secs: f64) {
    use sqlx::Connection;
    if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query("UPDATE claims SET received_utc = received_utc - ?1 WHERE id = ?2")
            .bind((secs * 1000.0) as i64)
            .bind(id)
            .execute(&mut c)
            .await
            .unwrap();
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query(
            "UPDATE claims SET received_utc = received_utc - make_interval(secs => $1) WHERE id = $2",
        )
        .bind(secs)
        .bind(id)
        .execute(&mut c)
        .await
        .unwrap();
    }
}

/// Completed claims spread over the buckets, duplicates and a mismatch, a failure, claims in
/// flight, stuck claims (lease already expired) and parked claims with their reasons.
async fn seed(s: &Store, url: &str) {
    let long = Duration::from_secs(600);
    let durations = [
        0.05, 0.1, 0.12, 0.2, 0.25, 0.3, 0.3, 0.4, 0.45, 0.6, 0.7, 0.8, 0.9, 1.2, 1.5, 2.0, 2.5,
        3.1, 4.0, 6.0, 9.0, 14.0, 22.0, 45.0, 80.0, 240.0, 900.0, 5400.0,
    ];
    for (i, d) in durations.iter().enumerate() {
        let consumer = if i % 4 == 3 { "emails" } else { "payments" };
        let id = claim(s, consumer, "", &format!("done-{i:03}"), long).await;
        settle(s, id, ClaimState::Completed, None).await;
        age(url, id, *d).await;
    }
    // Redeliveries: two duplicates and one reuse of an id with another payload.
    for _ in 0..2 {
        let dup = new_claim("payments", "", "done-000", long);
        assert!(matches!(
            s.claim(&dup).await.unwrap(),
            ClaimOutcome::Duplicate(_)
        ));
    }
    let mut other = new_claim("payments", "", "done-001", long);
    other.fingerprint = fingerprint(b"another payload");
    other.payload = b"another payload".to_vec().into();
    assert!(matches!(
        s.claim(&other).await.unwrap(),
        ClaimOutcome::Mismatch(_)
    ));
    let id = claim(s, "payments", "", "order-1011", long).await;
    settle(
        s,
        id,
        ClaimState::Failed,
        Some("provider refused: 402 card declined"),
    )
    .await;
    // In flight: a live lease.
    for (i, secs) in [0.5, 2.0, 7.0].iter().enumerate() {
        let id = claim(s, "payments", "", &format!("order-105{i}"), long).await;
        age(url, id, *secs).await;
    }
    // Stuck: started, lease expired, no sweeper to take them.
    let id = claim(s, "payments", "", "order-1042", Duration::ZERO).await;
    age(url, id, 190.0).await;
    let id = claim(s, "payments", "acme", "order-1043", Duration::ZERO).await;
    age(url, id, 840.0).await;
    let id = claim(s, "emails", "", "welcome-77", Duration::ZERO).await;
    age(url, id, 35.0).await;
    // Parked, with reasons.
    let id = claim(s, "payments", "", "order-1007", long).await;
    settle(s, id, ClaimState::NeedsAttention, Some(PARKED_REASON)).await;
    age(url, id, 7300.0).await;
    let id = claim(s, "payments", "acme", "order-0999", long).await;
    settle(s, id, ClaimState::NeedsAttention, Some(EXHAUSTED_REASON)).await;
    age(url, id, 2.0 * 86400.0 + 3600.0).await;
    let id = claim(s, "emails", "", EVIL_ID, long).await;
    settle(
        s,
        id,
        ClaimState::NeedsAttention,
        Some("provider answered <b>500</b> & then dropped the connection"),
    )
    .await;
    age(url, id, 420.0).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// What a page with that data must show, in its HTML source.
fn assert_shows_the_work(page: &str) {
    for needle in [
        "STARTING",
        "Needs a look (6)",
        &claimd::edge::dashboard::escape(PARKED_REASON),
        EXHAUSTED_REASON,
        "lease expired; waiting for the sweeper",
        "claimd claims resolve payments order-1007 --as completed --note &quot;...&quot;",
        "claimd claims redrive payments order-1007",
        "claimd claims resolve payments order-0999 --as completed --note &quot;...&quot; --tenant acme",
        "claimd claims redrive payments order-0999 --tenant acme",
        "claimd claims show payments order-1043 --tenant acme",
        "claimd sweep",
        "&lt;script&gt;alert(1)&lt;/script&gt;",
        "provider answered &lt;b&gt;500&lt;/b&gt; &amp; then dropped the connection",
        "<svg",
    ] {
        assert!(page.contains(needle), "page lacks {needle:?}");
    }
    assert!(!page.contains("<script"), "data must never become markup");
    assert!(!page.contains("<b>500"), "data must never become markup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_page_needs_the_admin_token_and_says_what_to_do() {
    let store = TestStore::sqlite();
    let running = start_worker(&store).await;
    seed(&running.app().store, &store.url()).await;
    let base = format!("http://{}", running.http_addr);
    let c = client();

    let r = c.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401, "no token");
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let r = c
        .get(format!("{base}/"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "wrong token");
    let r = c
        .get(format!("{base}/?token={TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "no token in the query string");

    let r = c
        .get(format!("{base}/"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(r.headers()["cache-control"], "no-store");
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    let page = r.text().await.unwrap();
    assert_shows_the_work(&page);
    // Counts, what needs a person first: payments has 2 parked, 2 stuck, 1 failed; then
    // 31 received (28 claims + 2 duplicates + 1 mismatch), 2 duplicates, 1 mismatch.
    assert!(
        page.contains("<tr class=\"\"><td>payments</td><td class=\"bad\">2</td><td class=\"bad\">2</td><td class=\"warn\">1</td>"),
        "payments counts"
    );
    assert!(
        page.contains("<td class=\"\">31</td><td class=\"\">2</td><td class=\"warn\">1</td>"),
        "payments received, duplicates, mismatches"
    );

    let r = c
        .get(format!("{base}/?since=soon"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let r = c
        .get(format!("{base}/?since=1h"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.text().await.unwrap().contains("over the last 1h"));
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_page_reads_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let running = start_worker(&store).await;
    seed(&running.app().store, &store.url()).await;
    let r = client()
        .get(format!("http://{}/", running.http_addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let page = r.text().await.unwrap();
    assert_shows_the_work(&page);
    assert!(page.contains("store postgres"));
    running.shutdown(Duration::from_secs(2)).await;
}

/// `chromium` on the PATH. Under `CI=true` its absence fails the test; elsewhere it skips.
fn find_chromium() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("chromium"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("chromium is required under CI=true (apt-get install -y chromium)");
        }
        eprintln!("SKIPPED: no chromium on PATH (apt-get install -y chromium)");
    }
    found
}

/// A local HTTP proxy to `upstream` that adds `Authorization: Bearer <token>` to every request,
/// so a browser started from the command line can open a page behind the admin token.
async fn auth_proxy(upstream: String, token: &'static str) -> String {
    use axum::body::Body;
    use axum::extract::Request;
    use axum::response::Response;
    let c = client();
    let app = axum::Router::new().fallback(move |req: Request| {
        let c = c.clone();
        let upstream = upstream.clone();
        async move {
            let path = req
                .uri()
                .path_and_query()
                .map_or("/".to_string(), |p| p.to_string());
            match c
                .get(format!("{upstream}{path}"))
                .bearer_auth(token)
                .send()
                .await
            {
                Ok(r) => {
                    let mut out = Response::builder().status(r.status().as_u16());
                    for (k, v) in r.headers() {
                        if !matches!(
                            k.as_str(),
                            "connection" | "transfer-encoding" | "content-length"
                        ) {
                            out = out.header(k.as_str(), v.as_bytes());
                        }
                    }
                    out.body(Body::from(r.bytes().await.unwrap_or_default()))
                        .unwrap()
                }
                Err(e) => Response::builder()
                    .status(502)
                    .body(Body::from(e.to_string()))
                    .unwrap(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// Runs headless Chromium with `args` and a fresh profile; fails after 90 seconds.
async fn chromium(bin: &Path, args: &[String]) -> std::process::Output {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--window-size=1280,1400",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args)
    .stdin(std::process::Stdio::null())
    .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .expect("chromium did not finish within 90s")
        .expect("run chromium")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_page_renders_in_headless_chromium() {
    let Some(bin) = find_chromium() else {
        return;
    };
    let store = TestStore::sqlite();
    let running = start_worker(&store).await;
    seed(&running.app().store, &store.url()).await;
    let proxy = auth_proxy(format!("http://{}", running.http_addr), TOKEN).await;
    let url = format!("{proxy}/");

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("dashboard.png");
    let _ = std::fs::remove_file(&png);
    let out = chromium(
        &bin,
        &[format!("--screenshot={}", png.display()), url.clone()],
    )
    .await;
    assert!(
        out.status.success(),
        "chromium --screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        bytes.len() > 10 * 1024,
        "a rendered page, not a blank one: {} bytes",
        bytes.len()
    );

    let out = chromium(&bin, &["--dump-dom".to_string(), url]).await;
    assert!(
        out.status.success(),
        "chromium --dump-dom: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    // The DOM serialises text with only &, < and > escaped.
    assert!(
        dom.contains(PARKED_REASON),
        "the parked claim's reason:\n{dom}"
    );
    assert!(dom.contains(EXHAUSTED_REASON));
    assert!(dom.contains("claimd claims redrive payments order-0999 --tenant acme"));
    assert!(
        dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !dom.contains("<script"),
        "the hostile message id stays text in the browser"
    );
    assert!(dom.contains("<svg"), "the chart is in the DOM");
    running.shutdown(Duration::from_secs(2)).await;
}
