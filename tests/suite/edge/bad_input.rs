//! Input no store can be asked with is refused before the store is asked, the same on SQLite
//! and PostgreSQL: a NUL in any text that reaches a query (search text, tenant, consumer,
//! message id, cursor, note), a time outside years 1-9999, a window back from now over 100
//! years: `400` naming the parameter, nothing changed, and the same request without the bad
//! part `200`. PostgreSQL's own refusals of data (SQLSTATE class 22) are bad input, not an
//! outage. And claim search on SQLite is bounded: 32 clients repeating one-character
//! searches at 100,000 claims do not hold up intake.

use crate::common::*;
use claimd::service::run::Running;
use claimd::store::{ClaimFilter, Store};
use std::time::{Duration, Instant};

/// A worker whose sweeper does not fire during the test (once a year): the parked claim stays
/// as the test leaves it.
async fn quiet_worker(store: &TestStore) -> Running {
    let consumers = consumer_toml("payments", "http://127.0.0.1:9", "");
    let toml = config_toml(&store.url(), &consumers).replacen(
        "schedule = \"* * * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
        1,
    );
    start(&toml).await
}

/// Every claim in the store, oldest last, as `message_id state version`.
async fn everything(store: &Store) -> Vec<String> {
    let all = store
        .list(&ClaimFilter {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    all.iter()
        .map(|c| format!("{} {} v{}", c.message_id, c.state, c.version))
        .collect()
}

/// What is sent: method, path, JSON body (for a POST); what a `400` must say; and the same
/// request without the bad part.
struct Case {
    method: &'static str,
    bad: &'static str,
    body: &'static str,
    says: &'static str,
    good: &'static str,
    good_body: &'static str,
}

const fn get(bad: &'static str, says: &'static str, good: &'static str) -> Case {
    Case {
        method: "GET",
        bad,
        body: "",
        says,
        good,
        good_body: "",
    }
}

/// Reads are checked first; the writes come last, the good ones changing the parked claim.
const CASES: &[Case] = &[
    get(
        "/v1/claims?q=order%00",
        "q contains a NUL byte",
        "/v1/claims?q=order",
    ),
    get(
        "/v1/claims?tenant=acme%00",
        "tenant contains a NUL byte",
        "/v1/claims?tenant=acme",
    ),
    get(
        "/v1/claims?consumer=payments%00",
        "consumer contains a NUL byte",
        "/v1/claims?consumer=payments",
    ),
    // 5002 BC: before PostgreSQL's first day (4713 BC).
    get(
        "/v1/claims?cursor=-220000000000000000.1",
        "cursor \\\"-220000000000000000.1\\\" is outside the times claimd stores",
        "/v1/claims?cursor=1777636800000000.7",
    ),
    get(
        "/v1/claims?since=99999999d",
        "since \\\"99999999d\\\" reaches further back than 36500d (100 years)",
        "/v1/claims?since=36500d",
    ),
    get(
        "/v1/claims?until=9999999d",
        "until \\\"9999999d\\\" reaches further back than 36500d",
        "/v1/claims?until=2099-01-01",
    ),
    get(
        "/v1/claims/payments/order-1%00",
        "message_id contains a NUL byte",
        "/v1/claims/payments/order-1",
    ),
    get(
        "/v1/claims/pay%00ments/order-1",
        "consumer contains a NUL byte",
        "/v1/claims/payments/order-1",
    ),
    get(
        "/v1/claims/payments/order-1?tenant=%00",
        "tenant contains a NUL byte",
        "/v1/claims/payments/order-1?tenant=",
    ),
    get(
        "/v1/messages/payments/order-1%00",
        "message_id contains a NUL byte",
        "/v1/messages/payments/order-1",
    ),
    get(
        "/v1/report?since=99999999d",
        "since \\\"99999999d\\\" reaches further back",
        "/v1/report?since=7d",
    ),
    get(
        "/v1/report?since=9999999d",
        "since \\\"9999999d\\\" reaches further back",
        "/v1/report?since=all",
    ),
    get(
        "/v1/report?consumer=payments%00",
        "consumer contains a NUL byte",
        "/v1/report?consumer=payments",
    ),
    get(
        "/?since=9999999d",
        "since \\\"9999999d\\\" reaches further back",
        "/?since=7d",
    ),
    get(
        "/claims?q=order-1%00",
        "q contains a NUL byte",
        "/claims?q=order-1",
    ),
    get(
        "/claims?since=9999999d&consumer=payments",
        "since \\\"9999999d\\\" reaches further back",
        "/claims?since=9d&consumer=payments",
    ),
    get(
        "/claims/payments/order-1?tenant=a%00",
        "tenant contains a NUL byte",
        "/claims/payments/order-1",
    ),
    Case {
        method: "POST",
        bad: "/v1/claims/payments/order-1%00/redrive",
        body: r#"{"actor":"ann"}"#,
        says: "message_id contains a NUL byte",
        good: "",
        good_body: "",
    },
    Case {
        method: "POST",
        bad: "/v1/claims/payments/order-1/redrive",
        body: r#"{"actor":"ann","tenant":"\u0000"}"#,
        says: "tenant contains a NUL byte",
        good: "",
        good_body: "",
    },
    Case {
        method: "POST",
        bad: "/v1/claims/payments/order-1/resolve",
        body: r#"{"to":"failed","note":"refunded\u0000","actor":"ann"}"#,
        says: "note contains a NUL byte",
        good: "/v1/claims/payments/order-1/resolve",
        good_body: r#"{"to":"failed","note":"refunded","actor":"ann"}"#,
    },
];

async fn send(base: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let url = format!("{base}{path}");
    let req = if method == "POST" {
        client()
            .post(url)
            .header("Content-Type", "application/json")
            .body(body.to_string())
    } else {
        client().get(url)
    };
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Every case on `store`: `400` naming the parameter and nothing changed, then `200` without
/// the bad part.
async fn bad_input_is_refused_by_name(store: TestStore) {
    let running = quiet_worker(&store).await;
    let db = running.app().store.clone();
    parked_claim(&db, "payments", "order-1", "provider answered 500").await;
    let before = everything(&db).await;
    let base = format!("http://{}", running.http_addr);

    let mut table = vec![format!("{:<48} {:>4} {:>4}", "bad request", "bad", "good")];
    for case in CASES {
        let (status, body) = send(&base, case.method, case.bad, case.body).await;
        assert_eq!(
            status, 400,
            "{} {}: {status} {body} (expected 400 naming the mistake)",
            case.method, case.bad
        );
        assert!(
            body.contains(case.says),
            "{} {}: {body:?} should say {:?}",
            case.method,
            case.bad,
            case.says
        );
        assert_eq!(
            everything(&db).await,
            before,
            "{} changed a claim",
            case.bad
        );
        let good = if case.good.is_empty() {
            "-".to_string()
        } else {
            let (good, body) = send(&base, case.method, case.good, case.good_body).await;
            assert_eq!(good, 200, "{} {}: {body}", case.method, case.good);
            good.to_string()
        };
        table.push(format!("{:<48} {status:>4} {good:>4}", case.bad));
    }

    // Intake's own ids: a NUL in a header never reaches a route (refused by the HTTP parser).
    for (name, value) in [
        ("Idempotency-Key", &b"order-\x002"[..]),
        ("Tenant-Id", &b"acme\x00"[..]),
    ] {
        let mut headers = vec![("Content-Type", &b"application/json"[..])];
        if name == "Tenant-Id" {
            headers.push(("Idempotency-Key", b"order-2"));
        }
        headers.push((name, value));
        let (status, _) = raw_request(
            running.http_addr,
            "/v1/messages/payments",
            &headers,
            br#"{"amount":1}"#,
        )
        .await;
        assert_eq!(status, 400, "intake with a NUL in {name}");
        table.push(format!(
            "{:<48} {status:>4}",
            format!("POST /v1/messages ({name} NUL)")
        ));
    }
    let after = everything(&db).await;
    assert_eq!(after.len(), 1, "nothing created: {after:?}");
    assert!(after[0].starts_with("order-1 failed"), "{after:?}");
    eprintln!("{}", table.join("\n"));
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn bad_input_answers_400_naming_the_parameter_on_sqlite() {
    bad_input_is_refused_by_name(TestStore::sqlite()).await;
}

#[tokio::test]
async fn bad_input_answers_400_naming_the_parameter_on_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    bad_input_is_refused_by_name(store).await;
}

/// `claimd claims list`, `claimd report` and `claimd reconcile` refuse what no store can be
/// asked with: exit 2 naming the option, as for any other mistake in a command line.
#[tokio::test]
async fn the_cli_refuses_windows_over_a_hundred_years_with_exit_2() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let running = quiet_worker(&store).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("claimd.toml");
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", "http://127.0.0.1:9", ""),
    );
    std::fs::write(&cfg, toml).unwrap();
    let cfg = cfg.to_string_lossy().to_string();
    for (args, says) in [
        (
            &["claims", "list", "--since", "99999999d"][..],
            "since \"99999999d\" reaches further back than 36500d",
        ),
        (
            &["claims", "list", "--cursor=-220000000000000000.1"][..],
            "cursor \"-220000000000000000.1\" is outside",
        ),
        (
            &["report", "--since", "9999999d"][..],
            "--since \"9999999d\" reaches further back than 36500d",
        ),
        (
            &["reconcile", "--since", "9999999d"][..],
            "--since \"9999999d\" reaches further back than 36500d",
        ),
    ] {
        let mut all = vec!["--config", cfg.as_str()];
        all.extend_from_slice(args);
        let (code, _, err) = cli(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let (code, _, err) = cli(&["--config", &cfg, "report", "--since", "36500d"]);
    assert_eq!(code, 0, "{err}");
    running.shutdown(Duration::from_secs(2)).await;
}

/// What the routes' checks keep from PostgreSQL, asked anyway (the last line): its refusal of
/// the data is bad input, never "store unavailable; retry".
#[tokio::test]
async fn postgres_refusing_data_is_bad_input_not_an_outage() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let db = claimd::store::open(&store.url(), 2).await.unwrap();
    db.migrate().await.unwrap();
    let e = db.get("payments", "", "order-\0").await.unwrap_err();
    assert!(e.is_bad_input() && !e.is_unavailable(), "{e}");
    let e = db
        .list(&ClaimFilter {
            since: Some(chrono::DateTime::<chrono::Utc>::MIN_UTC),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.is_bad_input() && !e.is_unavailable(), "{e}");
}

/// Latencies in milliseconds: (p50, p99, max).
fn percentiles(mut ms: Vec<f64>) -> (f64, f64, f64) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    (at(0.5), at(0.99), ms[ms.len() - 1])
}

/// Posts `n` messages one after another, each timed; panics on any answer but `202`.
async fn timed_posts(base: &str, from: usize, n: usize) -> Vec<f64> {
    let c = client();
    let mut ms = Vec::with_capacity(n);
    for i in from..from + n {
        let t = Instant::now();
        let r = c
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", format!("live-{i}"))
            .header("Content-Type", "application/json")
            .body(r#"{"amount":1}"#)
            .send()
            .await
            .unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(r.status().as_u16(), 202, "intake post {i}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_character_searches_on_sqlite_do_not_hold_up_intake() {
    const CLAIMS: usize = 100_000;
    const SEARCHERS: usize = 32;
    const POSTS: usize = 150;
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(Default::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &consumer_toml("payments", &provider, ""),
    ))
    .await;
    let db = running.app().store.clone();
    let base = format!("http://{}", running.http_addr);

    // Seeded under a consumer no worker serves, with a long lease: the sweeper leaves them.
    let seeding = Instant::now();
    for chunk in 0..CLAIMS / 1000 {
        let batch: Vec<_> = (chunk * 1000..(chunk + 1) * 1000)
            .map(|i| {
                let id = format!("order-{i:06}");
                let mut n = orphan_claim("archive", "", &id, &format!("archive::{id}"));
                n.lease = Duration::from_secs(3600);
                n
            })
            .collect();
        db.claim_many(&batch).await.unwrap();
    }
    let seeded_in = seeding.elapsed();

    let quiet = percentiles(timed_posts(&base, 0, POSTS / 3).await);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut searchers = Vec::new();
    for _ in 0..SEARCHERS {
        let (stop, base) = (stop.clone(), base.clone());
        searchers.push(tokio::spawn(async move {
            let c = client();
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                let r = c.get(format!("{base}/v1/claims?q=o")).send().await.unwrap();
                let status = r.status().as_u16();
                let retry_after = r.headers().contains_key("retry-after");
                let _ = r.bytes().await;
                seen.push((status, retry_after, t.elapsed().as_secs_f64() * 1000.0));
            }
            seen
        }));
    }
    // Let the searches pile up before intake is measured.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let loaded = timed_posts(&base, POSTS, POSTS).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut searches = Vec::new();
    for s in searchers {
        searches.extend(s.await.unwrap());
    }
    let answered = searches.iter().filter(|s| s.0 == 200).count();
    let busy = searches.iter().filter(|s| s.0 == 503 && s.1).count();
    let other: Vec<_> = searches
        .iter()
        .filter(|s| s.0 != 200 && !(s.0 == 503 && s.1))
        .collect();
    let search_ms = percentiles(searches.iter().map(|s| s.2).collect());
    let under = percentiles(loaded.clone());
    eprintln!(
        "SQLite, {CLAIMS} claims (seeded in {:.1} s), {SEARCHERS} clients repeating GET /v1/claims?q=o\n\
         | intake POST | n | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n\
         | no searches | {} | {:.1} | {:.1} | {:.1} |\n\
         | during searches | {} | {:.1} | {:.1} | {:.1} |\n\
         searches: {} answered 200, {} answered 503 + Retry-After, {} other; p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        seeded_in.as_secs_f64(),
        POSTS / 3,
        quiet.0,
        quiet.1,
        quiet.2,
        loaded.len(),
        under.0,
        under.1,
        under.2,
        answered,
        busy,
        other.len(),
        search_ms.0,
        search_ms.1,
        search_ms.2,
    );
    assert!(
        other.is_empty(),
        "searches answered neither 200 nor 503: {other:?}"
    );
    assert!(answered > 0, "no search was answered");
    assert!(
        under.1 < 2000.0,
        "intake p99 {:.0} ms during the searches (bound 2 s)",
        under.1
    );
    running.shutdown(Duration::from_secs(2)).await;
}
