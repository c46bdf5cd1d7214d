//! Finding a claim (issue 28): one search text matches a message id, idempotency key or
//! provider id (exact or its beginning) or a tenant; filters by consumer, state, tenant and
//! time; pages by a keyset cursor that neither skips nor repeats a claim. The same through the
//! store (SQLite and PostgreSQL), `GET /v1/claims`, `GET /v1/claims/{consumer}/{id}`, the
//! console's `/claims` pages and `claimd claims list`; and an operator action nobody can be
//! named for is refused.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::ops::claim_query::ClaimQuery;
use claimd::store::{ClaimCursor, ClaimFilter, ClaimOutcome, NewEvent, Settlement, Store};
use common::*;
use std::collections::BTreeSet;
use std::time::Duration;

/// A configuration whose sweeper does not fire during the test (once a year), so claims stay
/// as the test leaves them.
fn quiet_config(store: &TestStore) -> String {
    let consumers = consumer_toml("payments", "http://127.0.0.1:9", "")
        + &consumer_toml("refunds", "http://127.0.0.1:9", "");
    config_toml(&store.url(), &consumers).replacen(
        "schedule = \"* * * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
        1,
    )
}

async fn add(s: &Store, consumer: &str, tenant: &str, id: &str, key: &str) -> i64 {
    match s
        .claim(&orphan_claim(consumer, tenant, id, key))
        .await
        .unwrap()
    {
        ClaimOutcome::Created(c) => c.id,
        other => panic!("new claim expected: {other:?}"),
    }
}

async fn settle(
    s: &Store,
    id: i64,
    state: ClaimState,
    provider_id: Option<&str>,
    error: Option<&str>,
) {
    let ev = NewEvent {
        actor: "test",
        action: "perform",
        outcome: state.as_str(),
        provider_status: Some(if state == ClaimState::Failed {
            400
        } else {
            200
        }),
        detail: error,
    };
    let set = Settlement {
        state: Some(state),
        provider_status: Some(if state == ClaimState::Failed {
            400
        } else {
            200
        }),
        provider_response: Some(r#"{"error":{"message":"Missing Idempotency-Key"}}"#.into()),
        error: error.map(str::to_string),
        provider_id: provider_id.map(str::to_string),
        ..Default::default()
    };
    assert!(s.settle(id, 1, &set, &ev).await.unwrap());
}

/// 30 `order-10NN` claims of payments, a tenant's claim, a refund the provider knows as
/// `re_123`, and one failed claim.
async fn seed(s: &Store) {
    for i in 0..30 {
        let id = format!("order-10{i:02}");
        add(s, "payments", "", &id, &format!("payments::{id}")).await;
    }
    add(s, "payments", "acme", "inv-1", "acme-key-1").await;
    let r = add(s, "refunds", "", "order-2001", "refunds::order-2001").await;
    settle(s, r, ClaimState::Completed, Some("re_123"), None).await;
    let f = add(s, "payments", "", "card-9", "payments::card-9").await;
    settle(
        s,
        f,
        ClaimState::Failed,
        None,
        Some("provider rejected the request with 400"),
    )
    .await;
}

fn ids(claims: &[claimd::domain::claim::Claim]) -> Vec<String> {
    claims.iter().map(|c| c.message_id.clone()).collect()
}

async fn find(s: &Store, q: ClaimQuery) -> Vec<String> {
    let now = s.now().await.unwrap();
    ids(&s.list(&q.filter(now, 100).unwrap()).await.unwrap())
}

fn search(text: &str) -> ClaimQuery {
    ClaimQuery {
        q: Some(text.into()),
        ..Default::default()
    }
}

async fn search_and_pages(store: TestStore) {
    let app = claimd::service::app::App::open(load(&quiet_config(&store)), true)
        .await
        .unwrap();
    let s = app.store.clone();
    seed(&s).await;

    // Pages of 7 over the 30 orders: each once, newest first, then no cursor.
    let mut seen = Vec::new();
    let mut after: Option<ClaimCursor> = None;
    for _ in 0..10 {
        let page = s
            .list(&ClaimFilter {
                search: Some("order-10".into()),
                after,
                limit: 7,
                ..Default::default()
            })
            .await
            .unwrap();
        seen.extend(ids(&page));
        after = ClaimCursor::next(&page, 7);
        if after.is_none() {
            break;
        }
    }
    let distinct: BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(seen.len(), 30, "{seen:?}");
    assert_eq!(distinct.len(), 30, "no claim twice: {seen:?}");
    assert_eq!(seen[0], "order-1029", "newest first: {seen:?}");

    // Exact id, key prefix, provider id, tenant; `%` and `_` are plain characters.
    assert_eq!(find(&s, search("order-1005")).await, ["order-1005"]);
    assert_eq!(find(&s, search("acme-key")).await, ["inv-1"]);
    assert_eq!(find(&s, search("re_12")).await, ["order-2001"]);
    assert_eq!(find(&s, search("acme")).await, ["inv-1"]);
    assert!(find(&s, search("order%")).await.is_empty());
    assert!(find(&s, search("order-1_05")).await.is_empty());

    // Filters, alone and with a search.
    let q = ClaimQuery {
        consumer: Some("refunds".into()),
        ..Default::default()
    };
    assert_eq!(find(&s, q).await, ["order-2001"]);
    let q = ClaimQuery {
        state: Some("failed".into()),
        ..Default::default()
    };
    assert_eq!(find(&s, q).await, ["card-9"]);
    let q = ClaimQuery {
        tenant: Some("acme".into()),
        ..Default::default()
    };
    assert_eq!(find(&s, q).await, ["inv-1"]);
    let q = ClaimQuery {
        q: Some("order-20".into()),
        consumer: Some("payments".into()),
        ..Default::default()
    };
    assert!(find(&s, q).await.is_empty());
    let q = ClaimQuery {
        q: Some("order".into()),
        state: Some("stuck".into()),
        limit: Some(100),
        ..Default::default()
    };
    assert_eq!(find(&s, q).await.len(), 30, "orphaned orders are stuck");
    // Stuck claims without a search text (their own statement), page by page as the three
    // front ends read them: each once, newest first, nothing settled among them.
    let mut stuck = Vec::new();
    let mut cursor = None;
    for _ in 0..10 {
        let q = ClaimQuery {
            stuck: Some(true),
            consumer: Some("payments".into()),
            limit: Some(7),
            cursor,
            ..Default::default()
        };
        let page = q.page(s.as_ref(), 25).await.unwrap();
        assert!(page.claims.iter().all(|c| c.is_stuck(page.now)));
        stuck.extend(ids(&page.claims));
        cursor = page.next.map(|c| c.encode());
        if cursor.is_none() {
            break;
        }
    }
    let mut expected: Vec<String> = (0..30).map(|i| format!("order-10{i:02}")).collect();
    expected.push("inv-1".into());
    expected.reverse();
    assert_eq!(stuck, expected, "every stuck claim once, newest first");
    let q = ClaimQuery {
        until: Some("1h".into()),
        ..Default::default()
    };
    assert!(find(&s, q).await.is_empty(), "nothing older than an hour");
    let q = ClaimQuery {
        since: Some("1h".into()),
        ..Default::default()
    };
    assert_eq!(find(&s, q).await.len(), 33);

    // A failed claim has the time it failed.
    let failed = s.get("payments", "", "card-9").await.unwrap().unwrap();
    assert!(failed.processed_utc.is_some(), "a failed claim says when");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_filters_and_pages_on_sqlite() {
    search_and_pages(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_filters_and_pages_on_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    search_and_pages(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_the_console_and_the_cli_find_a_claim_and_show_its_history() {
    let store = TestStore::sqlite();
    let toml = quiet_config(&store);
    let running = start(&toml).await;
    let app = claimd::service::app::App::open(load(&toml), false)
        .await
        .unwrap();
    seed(&app.store).await;
    let base = format!("http://{}", running.http_addr);

    // GET /v1/claims: a search, a page and the next one.
    let v = get_json(&format!("{base}/v1/claims?q=order-10&limit=20")).await;
    assert_eq!(v["claims"].as_array().unwrap().len(), 20, "{v}");
    assert_eq!(v["claims"][0]["message_id"], "order-1029");
    assert_eq!(v["claims"][0]["stuck"], true);
    let next = v["next_cursor"].as_str().expect("a next page").to_string();
    let v = get_json(&format!(
        "{base}/v1/claims?q=order-10&limit=20&cursor={next}"
    ))
    .await;
    assert_eq!(v["claims"].as_array().unwrap().len(), 10, "{v}");
    assert!(v["next_cursor"].is_null(), "{v}");
    let v = get_json(&format!("{base}/v1/claims?tenant=acme")).await;
    assert_eq!(v["claims"][0]["message_id"], "inv-1", "{v}");
    let r = client()
        .get(format!("{base}/v1/claims?state=done"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().await.unwrap().contains("state \\\"done\\\""));

    // GET /v1/claims/{consumer}/{id}: the claim, its payload, its history.
    let v = get_json(&format!("{base}/v1/claims/payments/card-9")).await;
    assert_eq!(v["claim"]["state"], "failed", "{v}");
    assert_eq!(v["payload"]["text"], "{}");
    assert_eq!(v["history"][0]["outcome"], "failed", "{v}");
    let v = get_json(&format!("{base}/v1/claims/payments/inv-1?tenant=acme")).await;
    assert_eq!(v["claim"]["idem_key"], "acme-key-1", "{v}");
    let r = client()
        .get(format!("{base}/v1/claims/payments/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // The console: results link to the claim's page, which has the answer and the history.
    let page = client()
        .get(format!("{base}/claims?q=card"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("href=\"/claims/payments/card-9\""), "{page}");
    assert!(page.contains("end of the list"), "{page}");
    let page = client()
        .get(format!("{base}/claims?state=stuck"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("next page »"), "25 of 30 stuck: {page}");
    let page = client()
        .get(format!("{base}/claims/payments/card-9"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "Missing Idempotency-Key",
        "provider rejected the request with 400",
        "claimd claims redrive payments card-9",
        "History (1)",
        "Sign in",
    ] {
        assert!(page.contains(needle), "claim page lacks {needle:?}: {page}");
    }
    let r = client()
        .get(format!("{base}/claims/payments/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // claimd claims list: the same search, a cursor on stderr, JSON with next_cursor.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("claimd.toml");
    std::fs::write(&cfg, &toml).unwrap();
    let cfg = cfg.to_string_lossy().to_string();
    let (code, out, err) = cli(&[
        "--config", &cfg, "claims", "list", "--search", "order-10", "--limit", "25",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("order-1029") && !out.contains("order-1004"),
        "{out}"
    );
    let cursor = err
        .split("--cursor ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("a cursor on stderr: {err}"))
        .to_string();
    let (code, out, _) = cli(&[
        "--config", &cfg, "claims", "list", "-q", "order-10", "--limit", "25", "--cursor", &cursor,
        "--format", "json",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["claims"].as_array().unwrap().len(), 5, "{v}");
    assert!(v["next_cursor"].is_null());
    let (code, _, err) = cli(&["--config", &cfg, "claims", "list", "--since", "soon"]);
    assert_eq!(code, 2);
    assert!(err.contains("since \"soon\""), "{err}");

    running.shutdown(Duration::from_secs(2)).await;
}

/// Runs `claimd` with neither `CLAIMD_OPERATOR` nor `USER` set (cron, a container).
fn claimd_nobody(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(claimd_bin())
        .args(args)
        .env("CLAIMD_LOG", "warn")
        .env_remove("CLAIMD_OPERATOR")
        .env_remove("USER")
        .output()
        .expect("run claimd");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_nobody_can_be_named_for_is_refused() {
    let store = TestStore::sqlite();
    let toml = quiet_config(&store);
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    parked_claim(&app.store, "payments", "p1", "attempts exhausted").await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("claimd.toml");
    std::fs::write(&cfg, &toml).unwrap();
    let cfg = cfg.to_string_lossy().to_string();
    for args in [
        vec!["claims", "redrive", "payments", "p1"],
        vec![
            "claims", "resolve", "payments", "p1", "--as", "failed", "--note", "n",
        ],
        vec!["claims", "redrive", "--consumer", "payments", "--yes"],
    ] {
        let mut all = vec!["--config", cfg.as_str()];
        all.extend(args.iter().copied());
        let (code, err) = claimd_nobody(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("set CLAIMD_OPERATOR"), "{err}");
    }
    let c = app.store.get("payments", "", "p1").await.unwrap().unwrap();
    assert_eq!(c.state, ClaimState::NeedsAttention, "nothing was done");
    assert_eq!(app.store.events(c.id).await.unwrap().len(), 1);
}
