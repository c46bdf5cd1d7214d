//! A provider of the user's own (not the sandbox): outages, permanent rejections, and proof
//! that the provider is never called before the claim is committed (I1). A claim that
//! completes after transient errors shows no last error; its history keeps them.

mod common;

use claimd::domain::claim::ClaimState;
use common::provider::{Script, TestProvider};
use common::*;
use std::time::Duration;

async fn post(base: &str, key: &str, body: &str) -> u16 {
    client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", key)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn outage_then_recovery(store: TestStore) {
    // Down (503) for 8 s: more than two leases, and a breaker that opens and probes.
    let provider = TestProvider::start(Script {
        fail_for_ms: 8_000,
        ..Default::default()
    })
    .await;
    let toml = config_toml(
        &store.url(),
        // Keys equal to the message ids, so the provider's records read plainly.
        &consumer_toml("payments", &provider.url, "key = \"{message_id}\""),
    );
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    for i in 0..5 {
        assert_eq!(post(&base, &format!("m{i}"), "{}").await, 202);
    }
    let s = running.app().store.clone();
    let done = eventually(Duration::from_secs(40), || async {
        let mut all = true;
        for i in 0..5 {
            let c = s
                .get("payments", "", &format!("m{i}"))
                .await
                .unwrap()
                .unwrap();
            all &= c.state == ClaimState::Completed;
        }
        all
    })
    .await;
    assert!(done, "claims must complete after the provider recovers");
    for i in 0..5 {
        let key = format!("m{i}");
        assert_eq!(provider.applied(&key), 1, "{key} applied once");
        // Every request the provider saw for this claim carried the same key: it counts
        // requests per key, and 12 refusals + 1 success all landed on this one key.
        // The provider counts requests per key: the 503s and the success all landed on
        // this one key.
        assert!(
            provider.requests(&key) >= 2,
            "{key}: all attempts used the same key"
        );
        let c = s.get("payments", "", &key).await.unwrap().unwrap();
        assert_eq!(c.idem_key, key);
        assert!(c.processed_utc.is_some());
        let history = s.events(c.id).await.unwrap();
        assert!(
            history.iter().any(|e| e.outcome == "not_applied"),
            "history shows the 503s"
        );
        // The 503s did not decide the outcome: a completed claim shows no last error (the
        // history keeps them), in the store and over HTTP.
        assert_eq!(c.last_error, None, "{key}");
        let seen = get_json(&format!("{base}/v1/messages/payments/{key}")).await;
        assert_eq!(seen["state"], "completed", "{seen}");
        assert!(seen["last_error"].is_null(), "{seen}");
        let listed = get_json(&format!("{base}/v1/claims?consumer=payments")).await;
        let row = listed["claims"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["message_id"] == key.as_str()))
            .unwrap_or_else(|| panic!("{listed}"));
        assert!(row["last_error"].is_null(), "{row}");
        assert!(
            history
                .iter()
                .any(|e| e.detail.as_deref().is_some_and(|d| d.contains("503"))),
            "{key}: the history keeps the error: {history:?}"
        );
    }
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_then_recovery_completes_with_the_same_key_sqlite() {
    outage_then_recovery(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_then_recovery_completes_with_the_same_key_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    outage_then_recovery(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_rejection_fails_the_claim_and_is_not_retried() {
    let store = TestStore::sqlite();
    let provider = TestProvider::start(Script {
        always: Some(400),
        ..Default::default()
    })
    .await;
    let toml = config_toml(
        &store.url(),
        // Keys equal to the message ids, so the provider's records read plainly.
        &consumer_toml("payments", &provider.url, "key = \"{message_id}\""),
    );
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post(&base, "bad-1", "{}").await, 202);
    let s = running.app().store.clone();
    assert!(
        eventually(Duration::from_secs(10), || async {
            s.get("payments", "", "bad-1").await.unwrap().unwrap().state == ClaimState::Failed
        })
        .await
    );
    // Several sweeper passes later it is still failed and was called exactly once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let c = s.get("payments", "", "bad-1").await.unwrap().unwrap();
    assert_eq!(c.state, ClaimState::Failed);
    assert_eq!(c.provider_status, Some(400));
    assert!(
        c.last_error
            .unwrap()
            .contains("rejected the request with 400")
    );
    assert_eq!(provider.requests("bad-1"), 1);
    running.shutdown(Duration::from_secs(5)).await;
}

async fn never_called_before_commit(store: TestStore) {
    // A second, independent connection pool: it sees only committed rows.
    let observer = claimd::store::open(&store.url(), 2).await.unwrap();
    observer.migrate().await.unwrap();
    let provider = TestProvider::start(Script {
        check_committed_in: Some(observer),
        ..Default::default()
    })
    .await;
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", &provider.url, "key = \"{message_id}\""),
    );
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let mut handles = Vec::new();
    for i in 0..100 {
        let base = base.clone();
        handles.push(tokio::spawn(async move {
            post(&base, &format!("c{i}"), "{}").await
        }));
    }
    for h in handles {
        assert_eq!(h.await.unwrap(), 202);
    }
    let s = running.app().store.clone();
    assert!(
        eventually(Duration::from_secs(20), || async {
            (0..100).all(|i| provider.applied(&format!("c{i}")) == 1)
        })
        .await
    );
    assert!(
        provider.ledger.lock().unwrap().uncommitted_calls.is_empty(),
        "provider was called for a claim not yet committed"
    );
    let _ = s;
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_is_never_called_before_the_claim_commits_sqlite() {
    never_called_before_commit(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_is_never_called_before_the_claim_commits_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    never_called_before_commit(store).await;
}

/// A provider of the test's own that answers every POST to `/v1/payments` with `status` and
/// records when each request arrived.
async fn recording_provider(
    status: u16,
) -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<chrono::DateTime<chrono::Utc>>>>,
) {
    let calls: std::sync::Arc<std::sync::Mutex<Vec<chrono::DateTime<chrono::Utc>>>> =
        Default::default();
    let seen = calls.clone();
    let status = axum::http::StatusCode::from_u16(status).unwrap();
    let app = axum::Router::new().route(
        "/v1/payments",
        axum::routing::post(move || {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(chrono::Utc::now());
                (status, "scripted answer")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, calls)
}

/// Issue 11.5: a provider whose every answer leaves the outcome unknown (`500`), under
/// `on_unknown = "redrive"`. Re-sending with the same key is safe only while the provider keeps
/// the key (`redrive_within`); a sweeper's attempt that starts inside that window must not go
/// on re-sending past it, but park the claim for a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_resend_leaves_after_the_key_window_even_inside_an_attempt() {
    let (provider, calls) = recording_provider(500).await;
    let store = TestStore::sqlite();
    let consumer = consumer_toml(
        "payments",
        &provider,
        // max_sends out of the way: this is about the key window.
        "on_unknown = \"redrive\"\nlease = \"6s\"\nredrive_within = \"6s\"\nmax_attempts = 8\nmax_sends = 100",
    )
    .replace("status_url = ", "# status_url = ");
    // No intake attempt: the claim is committed 4.5 s old with its lease already over, as a
    // crashed worker leaves it, so a sweeper's attempt starts inside the 6 s key window.
    let running = start(&config_toml(&store.url(), &consumer)).await;
    let claimed = running
        .app()
        .store
        .claim(&orphan_claim("payments", "", "w-1", "payments::w-1"))
        .await
        .unwrap();
    assert!(matches!(claimed, claimd::store::ClaimOutcome::Created(_)));
    let lite = claimd::store::sqlite::SqliteStore::connect(&store.url(), 1)
        .await
        .unwrap();
    sqlx::query("UPDATE claims SET received_utc = received_utc - 4500")
        .execute(lite.pool())
        .await
        .unwrap();
    let st = running.app().store.clone();
    assert!(
        eventually(Duration::from_secs(30), || async {
            st.get("payments", "", "w-1").await.unwrap().unwrap().state
                == ClaimState::NeedsAttention
        })
        .await,
        "the claim is parked once the key window has passed"
    );
    let claim = st.get("payments", "", "w-1").await.unwrap().unwrap();
    let window_end = claim.received_utc + chrono::Duration::seconds(6);
    let calls = calls.lock().unwrap().clone();
    assert!(
        calls.len() >= 2,
        "it was re-sent within the window: {calls:?}"
    );
    let late: Vec<_> = calls
        .iter()
        .filter(|t| **t > window_end + chrono::Duration::milliseconds(200))
        .collect();
    assert!(
        late.is_empty(),
        "{} sends after the key window ended at {window_end}: {late:?}",
        late.len()
    );
    let reason = claim.last_error.unwrap_or_default();
    assert!(reason.contains("redrive_within"), "{reason}");
    running.shutdown(Duration::from_secs(2)).await;
}

/// Issue 11.5: the lease the database records starts when the claim statement starts; a claim
/// statement that waits (here on another session's uncommitted insert of the same message)
/// must not push the worker's own deadline past it. Every call starts early enough to end
/// before the database lease does, or a sweeper could take the claim over while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_claim_statement_does_not_stretch_the_lease_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (provider, calls) = recording_provider(503).await;
    let consumer = consumer_toml(
        "payments",
        &provider,
        "lease = \"3s\"\nkey = \"{message_id}\"",
    );
    // No sweeper pass during the test: every call the provider sees is attempt 1's.
    let toml = config_toml(&store.url(), &consumer)
        .replace("schedule = \"* * * * * *\"", "schedule = \"0 0 3 * * *\"");
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);

    // Another session inserts the same message and holds its transaction open for 2 s.
    let pg = claimd::store::postgres::PgStore::connect(&store.url(), 1)
        .await
        .unwrap();
    let mut other = pg.pool().begin().await.unwrap();
    sqlx::query(
        "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload) \
         VALUES ('payments', '', 'slow-1', 'slow-1', 'f', '\\x00')",
    )
    .execute(&mut *other)
    .await
    .unwrap();
    let posting = tokio::spawn(async move { post(&base, "slow-1", "{}").await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    other.rollback().await.unwrap();
    assert_eq!(posting.await.unwrap(), 202);

    let st = running.app().store.clone();
    let claim = st.get("payments", "", "slow-1").await.unwrap().unwrap();
    // received_utc is the statement's start (its transaction's now()), as is the lease.
    let lease_end = claim.received_utc + chrono::Duration::seconds(3);
    let last_start = lease_end - chrono::Duration::seconds(1); // effect timeout 1 s
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calls = calls.lock().unwrap().clone();
    let late: Vec<_> = calls
        .iter()
        .filter(|t| **t > last_start + chrono::Duration::milliseconds(100))
        .collect();
    assert!(
        late.is_empty(),
        "calls started after {last_start}, too late to end before the lease ({lease_end}): {late:?}"
    );
    let claim = st.get("payments", "", "slow-1").await.unwrap().unwrap();
    assert_eq!(claim.state, ClaimState::Started, "left for the sweeper");
    running.shutdown(Duration::from_secs(2)).await;
}

/// Issue 11 ("0 parked that were never sent"): a `park` consumer's claim whose worker died —
/// or lost its claim statement's reply in a database outage — between the commit and the first
/// call still carries its "not called yet" marker. The sweeper performs it (a first send) instead
/// of parking it as an unknown outcome; a claim whose call did start is still parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_claim_that_was_never_called_is_performed_not_parked() {
    let (sb, provider) = sandbox(claimd::provider::sandbox::SandboxOptions::default()).await;
    let store = TestStore::sqlite();
    let consumer = consumer_toml("payments", &provider, "on_unknown = \"park\"");
    let running = start(&config_toml(&store.url(), &consumer)).await;
    let st = running.app().store.clone();
    for (id, never_called) in [("never-called", true), ("maybe-called", false)] {
        let n = claimd::domain::claim::NewClaim {
            mark_not_called: never_called,
            order_key: None,
            not_before: None,
            trace_parent: None,
            ..orphan_claim("payments", "", id, &format!("payments::{id}"))
        };
        assert!(matches!(
            st.claim(&n).await.unwrap(),
            claimd::store::ClaimOutcome::Created(_)
        ));
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            let a = st
                .get("payments", "", "never-called")
                .await
                .unwrap()
                .unwrap();
            let b = st
                .get("payments", "", "maybe-called")
                .await
                .unwrap()
                .unwrap();
            a.state != ClaimState::Started && b.state != ClaimState::Started
        })
        .await,
        "the sweeper settles both"
    );
    let a = st
        .get("payments", "", "never-called")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.state, ClaimState::Completed, "{:?}", a.last_error);
    let b = st
        .get("payments", "", "maybe-called")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        b.state,
        ClaimState::NeedsAttention,
        "an unknown outcome is never guessed"
    );
    let applied: Vec<_> = sb
        .effects()
        .into_iter()
        .map(|e| (e.key, e.applied))
        .collect();
    assert_eq!(applied, vec![("payments::never-called".to_string(), 1)]);
    running.shutdown(Duration::from_secs(2)).await;
}

/// A provider that answers a payment with a redirect (a balancer moving `http` to `https`, an
/// endpoint that moved) and a status endpoint that redirects to a sign-in page answering
/// `200`. claimd follows neither: the payment's `302` is an unknown outcome (parked under
/// `on_unknown = "park"`, never settled `completed` from the page it points to), and the
/// start-up probe refuses the status endpoint, naming the `302`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_the_providers_answer_never_followed() {
    use axum::routing::{get, post as route_post};
    let landed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = landed.clone();
    let moved = || async { (axum::http::StatusCode::FOUND, [("location", "/signin")], "") };
    let app = axum::Router::new()
        .route("/v1/payments", route_post(moved))
        .route("/v1/effects/{key}", get(moved))
        .route(
            "/v1/found-nothing/{key}",
            get(|| async { axum::http::StatusCode::NOT_FOUND }),
        )
        .route(
            "/signin",
            get(move || {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { "{\"id\": \"welcome\"}" }
            })
            .post(|| async { "{\"id\": \"welcome\"}" }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let store = TestStore::sqlite();
    let consumer = consumer_toml(
        "payments",
        &provider,
        "key = \"{message_id}\"\non_unknown = \"park\"",
    );

    // The status endpoint that redirects: refused at start.
    let toml = config_toml(&store.url(), &consumer);
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    let Err(e) = claimd::service::run::start(app).await else {
        panic!("started with a status endpoint that redirects")
    };
    let e = e.to_string();
    assert!(e.contains("effect.status_url") && e.contains("302"), "{e}");

    // With a status endpoint that answers, the payment's redirect parks the claim.
    let toml = toml.replace("/v1/effects/{key}", "/v1/found-nothing/{key}");
    let running = claimd::service::run::start(
        claimd::service::app::App::open(load(&toml), true)
            .await
            .unwrap(),
    )
    .await
    .expect("start");
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post(&base, "moved-1", "{}").await, 202);
    let s = running.app().store.clone();
    assert!(
        eventually(Duration::from_secs(10), || async {
            s.get("payments", "", "moved-1")
                .await
                .unwrap()
                .unwrap()
                .state
                == ClaimState::NeedsAttention
        })
        .await
    );
    let c = s.get("payments", "", "moved-1").await.unwrap().unwrap();
    assert_eq!(c.provider_status, Some(302));
    assert!(c.processed_utc.is_none());
    assert_eq!(landed.load(std::sync::atomic::Ordering::SeqCst), 0);
    running.shutdown(Duration::from_secs(5)).await;
}

/// claimd with one consumer, `payments`, calling `provider` over HTTP/2 and parking unknown
/// outcomes; `effect_extra` is appended to its `[consumers.effect]` table.
async fn start_http2_park(
    provider: &str,
    effect_extra: &str,
) -> (claimd::service::run::Running, TestStore) {
    let store = TestStore::sqlite();
    let consumer = format!(
        "{}http_version = \"2\"\n{effect_extra}",
        consumer_toml(
            "payments",
            provider,
            "key = \"{message_id}\"\non_unknown = \"park\""
        )
    );
    (start(&config_toml(&store.url(), &consumer)).await, store)
}

/// The outcomes of a claim's provider calls, in its history's order.
async fn perform_outcomes(store: &claimd::store::Store, id: i64) -> Vec<String> {
    store
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.action == "perform")
        .map(|e| e.outcome)
        .collect()
}

/// An HTTP/2 provider that refuses a payment's stream (`REFUSED_STREAM`: it did not process
/// it) and resets another's after taking it (`INTERNAL_ERROR`: it may have). claimd sends the
/// refused one again with the same key, as a "not applied" answer in its history, and it
/// completes once; the reset one is an unknown outcome, parked under `on_unknown = "park"`,
/// never sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_refused_stream_is_sent_again_a_reset_one_is_unknown() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let calls: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    let seen = calls.clone();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut conn = h2::server::handshake(socket).await.unwrap();
                while let Some(Ok((request, mut respond))) = conn.accept().await {
                    let answer = |status: u16| {
                        axum::http::Response::builder()
                            .status(status)
                            .body(())
                            .unwrap()
                    };
                    if request.method() == axum::http::Method::GET {
                        // The status endpoint knows no key (the start-up probe's included).
                        let _ = respond.send_response(answer(404), true);
                        continue;
                    }
                    let key = request.headers()["idempotency-key"]
                        .to_str()
                        .unwrap()
                        .to_string();
                    let n = {
                        let mut seen = seen.lock().unwrap();
                        let n = seen.entry(key.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    if key.contains("refused") && n == 1 {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                    } else if key.contains("reset") {
                        respond.send_reset(h2::Reason::INTERNAL_ERROR);
                    } else if let Ok(mut body) = respond.send_response(answer(200), false) {
                        let _ = body.send_data(bytes::Bytes::from_static(b"{\"id\":\"p\"}"), true);
                    }
                }
            });
        }
    });
    let (running, _store) = start_http2_park(&provider, "").await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post(&base, "refused-1", "{}").await, 202);
    assert_eq!(post(&base, "reset-1", "{}").await, 202);
    let s = running.app().store.clone();
    for (key, state) in [
        ("refused-1", ClaimState::Completed),
        ("reset-1", ClaimState::NeedsAttention),
    ] {
        assert!(
            eventually(Duration::from_secs(10), || async {
                s.get("payments", "", key).await.unwrap().unwrap().state == state
            })
            .await,
            "{key} never became {state}"
        );
    }
    let refused = s.get("payments", "", "refused-1").await.unwrap().unwrap();
    assert_eq!(
        perform_outcomes(&s, refused.id).await,
        ["not_applied", "applied"],
        "refused-1's history"
    );
    assert_eq!(refused.resent_count, 0, "a refused stream is no re-send");
    let reset = s.get("payments", "", "reset-1").await.unwrap().unwrap();
    assert!(
        reset
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("outcome unknown"),
        "{:?}",
        reset.last_error
    );
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls["refused-1"], 2, "{calls:?}");
    assert_eq!(calls["reset-1"], 1, "{calls:?}");
    running.shutdown(Duration::from_secs(5)).await;
}

/// An HTTP/2 provider closing its connection gracefully: it sends `GOAWAY` (`NO_ERROR`) naming
/// the first of two open payment streams as the last it will process, answers that one, and
/// closes. The other was never processed: claimd sends it again on a new connection, with the
/// same key, as a "not applied" answer in its history, not as a re-send. Each payment is
/// answered (applied) once. Written with raw frames, since a server library decides itself
/// which stream a `GOAWAY` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_after_a_graceful_goaway_is_sent_again_on_a_new_connection() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// One frame: length, type, flags, stream, payload.
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }
    // HEADERS, END_STREAM | END_HEADERS, ":status: 200" (HPACK static index 8).
    let ok = |stream: u32| frame(0x1, 0x5, stream, &[0x88]);
    let answered = Arc::new(AtomicU32::new(0));
    let connections = Arc::new(AtomicU32::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    let (count, opened) = (answered.clone(), connections.clone());
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let first = opened.fetch_add(1, Ordering::SeqCst) == 0;
            let count = count.clone();
            tokio::spawn(async move {
                let mut preface = [0u8; 24];
                socket.read_exact(&mut preface).await.unwrap();
                socket.write_all(&frame(0x4, 0, 0, &[])).await.unwrap();
                let mut streams = Vec::new();
                loop {
                    let mut head = [0u8; 9];
                    if socket.read_exact(&mut head).await.is_err() {
                        return;
                    }
                    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                    let mut payload = vec![0u8; len];
                    socket.read_exact(&mut payload).await.unwrap();
                    let stream =
                        u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                    match head[3] {
                        0x4 if head[4] & 0x1 == 0 => {
                            socket.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap();
                        }
                        0x1 if !first => {
                            socket.write_all(&ok(stream)).await.unwrap();
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        0x1 => {
                            streams.push(stream);
                            if streams.len() == 2 {
                                let last = streams[0].min(streams[1]);
                                let mut goaway = last.to_be_bytes().to_vec();
                                goaway.extend(0u32.to_be_bytes());
                                socket.write_all(&frame(0x7, 0, 0, &goaway)).await.unwrap();
                                socket.write_all(&ok(last)).await.unwrap();
                                count.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(200)).await;
                                return;
                            }
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    // The raw server reads no request: no start-up probe of the status endpoint.
    let (running, _store) =
        start_http2_park(&provider, "[consumers.effect.status]\nprobe = \"off\"\n").await;
    let base = format!("http://{}", running.http_addr);
    let (a, b) = tokio::join!(post(&base, "ga-1", "{}"), post(&base, "ga-2", "{}"));
    assert_eq!((a, b), (202, 202));
    let s = running.app().store.clone();
    let mut histories = Vec::new();
    for key in ["ga-1", "ga-2"] {
        assert!(
            eventually(Duration::from_secs(10), || async {
                s.get("payments", "", key).await.unwrap().unwrap().state == ClaimState::Completed
            })
            .await,
            "{key} never completed"
        );
        let claim = s.get("payments", "", key).await.unwrap().unwrap();
        assert_eq!(claim.resent_count, 0, "{key}: not a re-send");
        histories.push(perform_outcomes(&s, claim.id).await);
    }
    histories.sort();
    assert_eq!(
        histories,
        [vec!["applied"], vec!["not_applied", "applied"]],
        "one payment answered before the GOAWAY, the other sent again"
    );
    assert_eq!(
        answered.load(Ordering::SeqCst),
        2,
        "each payment applied once"
    );
    assert!(connections.load(Ordering::SeqCst) >= 2);
    running.shutdown(Duration::from_secs(5)).await;
}

/// A re-send the provider refuses (`503`, not applied) sent nothing, so it does not count
/// towards `max_sends`: after one unknown outcome (`500`) and an outage of several leases, a
/// claim under `on_unknown = "redrive"` with `max_sends = 2` completes when the provider is
/// back, instead of being parked as "sent 2 time(s)".
async fn refused_resends_are_not_counted(store: TestStore) {
    let first = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let applied = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let up_at = std::time::Instant::now() + Duration::from_secs(8);
    let app = {
        let (first, applied) = (first.clone(), applied.clone());
        axum::Router::new().route(
            "/v1/payments",
            axum::routing::post(move || {
                let (first, applied) = (first.clone(), applied.clone());
                async move {
                    use std::sync::atomic::Ordering;
                    if first.swap(false, Ordering::SeqCst) {
                        (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "lost")
                    } else if std::time::Instant::now() < up_at {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "down")
                    } else {
                        applied.fetch_add(1, Ordering::SeqCst);
                        (axum::http::StatusCode::OK, "ok")
                    }
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let consumer = consumer_toml(
        "payments",
        &provider,
        "on_unknown = \"redrive\"\nlease = \"2s\"\nmax_sends = 2\nmax_attempts = 20\nkey = \"{message_id}\"",
    )
    .replace("status_url = ", "# status_url = ");
    let running = start(&config_toml(&store.url(), &consumer)).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post(&base, "r-1", "{}").await, 202);
    let s = running.app().store.clone();
    let settled = eventually(Duration::from_secs(40), || async {
        s.get("payments", "", "r-1").await.unwrap().unwrap().state != ClaimState::Started
    })
    .await;
    let c = s.get("payments", "", "r-1").await.unwrap().unwrap();
    let history = s.events(c.id).await.unwrap();
    assert!(settled, "still started: {:?}", lines(&history));
    assert_eq!(
        c.state,
        ClaimState::Completed,
        "{:?}: {:?}",
        c.last_error,
        lines(&history)
    );
    assert_eq!(applied.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(c.resent_count <= 1, "{}", c.resent_count);
    assert!(
        history.iter().any(|e| e.outcome == "uncounted"),
        "{:?}",
        lines(&history)
    );
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_resends_do_not_count_towards_max_sends_sqlite() {
    refused_resends_are_not_counted(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_resends_do_not_count_towards_max_sends_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    refused_resends_are_not_counted(store).await;
}
