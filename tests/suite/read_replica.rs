//! Read replicas for operators (issue 54, item 5): with `[store] read_url` naming a standby,
//! operators' claim searches run on it and never on the primary (pg_stat_statements on both
//! servers says which statements ran where), with the replica's lag on the page, in the JSON
//! and in `/metrics`. A replica that cannot be read sends a search to the primary with a
//! notice (`read_fallback = "primary"`, the default) or answers busy (`"refuse"`); SQLite
//! refuses the option.

use crate::common;

use common::pg_pair::{PgPair, Standby};
use common::*;
use std::time::Duration;

const ADMIN: &str = "operator-token-for-the-replica-tests";

/// A fragment only the claim search's statement has (`store::postgres::sql`'s
/// `search_claims`).
const SEARCH_SQL: &str = "%AS by_key%";

/// `[store]` with `read_url` (and `extra` lines) added, and the admin token set.
fn with_replica(store_url: &str, read_url: &str, extra: &str, consumers: &str) -> String {
    config_toml_with(store_url, &format!("admin_token = \"{ADMIN}\""), consumers).replacen(
        "max_connections = 8",
        &format!("max_connections = 8\nread_url = \"{read_url}\"\n{extra}"),
        1,
    )
}

/// Calls of the claim search statement on the server at `url`, per pg_stat_statements.
async fn search_calls(url: &str) -> i64 {
    calls(url, SEARCH_SQL).await
}

/// Calls of the statements whose text is `like` on the server at `url`, per
/// pg_stat_statements.
async fn calls(url: &str, like: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar::<_, Option<i64>>(
        "SELECT sum(calls)::bigint FROM pg_stat_statements WHERE query LIKE $1",
    )
    .bind(like)
    .fetch_one(&mut c)
    .await
    .unwrap()
    .unwrap_or(0)
}

/// Loads pg_stat_statements' view on the primary (the standby gets it by replication).
async fn create_pg_stat_statements(pair: &PgPair) {
    use sqlx::Connection;
    let mut p = sqlx::PgConnection::connect(&pair.url()).await.unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut p)
        .await
        .unwrap();
}

/// Empties pg_stat_statements on the primary.
async fn reset_primary_statements(pair: &PgPair) {
    use sqlx::Connection;
    let mut p = sqlx::PgConnection::connect(&pair.url()).await.unwrap();
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&mut p)
        .await
        .unwrap();
}

/// Signs `name` in on the page; the session cookie.
async fn sign_in(base: &str, name: &str) -> String {
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{base}/signin"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("name={name}&token={ADMIN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "sign-in");
    let set = r.headers()["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_operators_searching_put_no_search_statement_on_the_primary() {
    let Some(pair) = PgPair::start(Standby::Asynchronous) else {
        return;
    };
    create_pg_stat_statements(&pair).await;
    let (_sb, provider) = sandbox(Default::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = with_replica(
        &pair.url(),
        &pair.standby_url(),
        "",
        &consumer_toml("payments", &provider, ""),
    );
    let worker = ready_worker(&toml, dir.path(), "replica").await;
    let base = worker.base.clone();
    let c = client();
    for i in 0..40 {
        let r = c
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", format!("order-{}", 1000 + i))
            .json(&serde_json::json!({"amount": 100 + i}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    pair.wait_caught_up().await;
    // Operators sign in first (the sign-in throttle allows 5 at once per address).
    let mut cookies = Vec::new();
    for name in ["ann", "bob", "cyd", "dee"] {
        cookies.push(sign_in(&base, name).await);
    }
    reset_primary_statements(&pair).await;
    let standby_before = search_calls(&pair.standby_url()).await;

    // 32 operators search at once, as the page's search box does.
    let searches = (0..32).map(|i| {
        let (c, cookie) = (c.clone(), cookies[i % cookies.len()].clone());
        let url = format!("{base}/claims?q=order-10{}", i % 4);
        async move {
            let r = c.get(url).header("Cookie", cookie).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    });
    let pages = futures_util::future::join_all(searches).await;
    for (i, (status, page)) in pages.iter().enumerate() {
        assert_eq!(*status, 200, "search {i}: {page}");
        let id = format!("order-10{}", i % 4);
        assert!(
            page.contains(&format!("{id}0")),
            "search {i} found no {id}0: {page}"
        );
        assert!(
            page.contains("read from the read replica"),
            "search {i} does not say where it read: {page}"
        );
    }
    // The API's search says where it ran, with the replica's lag.
    let v: serde_json::Value = c
        .get(format!("{base}/v1/claims?q=order-10&limit=100"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["claims"].as_array().unwrap().len(), 40, "{v}");
    assert_eq!(v["read_from"]["source"], "replica", "{v}");
    assert_eq!(v["read_from"]["replica"]["in_recovery"], true, "{v}");
    assert!(v["read_from"]["replica"]["lag_s"].is_number(), "{v}");

    let on_primary = search_calls(&pair.url()).await;
    let on_standby = search_calls(&pair.standby_url()).await - standby_before;
    eprintln!("search statements: primary {on_primary}, standby {on_standby}");
    assert_eq!(on_primary, 0, "no search statement on the primary");
    assert!(
        on_standby >= 33,
        "the searches ran on the standby: {on_standby}"
    );

    // The lag on the page, near the search box, and in /metrics.
    let page = c
        .get(format!("{base}/"))
        .header("Cookie", &cookies[0])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("read from the read replica"), "{page}");
    let metrics = get_text(&format!("{base}/metrics")).await;
    for series in [
        "claimd_read_replica_up{replica=",
        "claimd_read_replica_in_recovery{replica=",
        "claimd_read_replica_lag_seconds{replica=",
        "claimd_read_replica_fallback_reads_total{replica=",
    ] {
        assert!(metrics.contains(series), "{series} missing: {metrics}");
    }
    let up = metrics
        .lines()
        .find(|l| l.starts_with("claimd_read_replica_up{"))
        .unwrap();
    assert!(up.ends_with(" 1"), "{up}");
    // The report reads the replica too, and says so on stderr.
    let cfg = dir.path().join("replica.toml").display().to_string();
    let (code, out, err) =
        tokio::task::spawn_blocking(move || cli(&["--config", &cfg, "report", "--format", "json"]))
            .await
            .unwrap();
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["read_from"]["source"], "replica", "{out}");
    assert!(err.contains("read from the read replica"), "{err}");
    // The control: the same search without the replica is counted on the primary.
    let cfg = dir.path().join("replica.toml").display().to_string();
    let (code, _, err) = tokio::task::spawn_blocking(move || {
        cli_with_env(
            &["--config", &cfg, "claims", "list", "--search", "order-10"],
            &[("CLAIMD__STORE__READ_URL", "")],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(
        search_calls(&pair.url()).await >= 1,
        "the control search is seen"
    );

    // A replica behind the primary (its replay paused): the search says how far behind, and
    // a claim received since is not in it yet.
    let mut standby = {
        use sqlx::Connection;
        sqlx::PgConnection::connect(&pair.standby_url())
            .await
            .unwrap()
    };
    sqlx::query("SELECT pg_wal_replay_pause()")
        .execute(&mut standby)
        .await
        .unwrap();
    let r = c
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "late-1")
        .json(&serde_json::json!({"amount": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    // Past the second a reading of the replica is reused for.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let v: serde_json::Value = c
        .get(format!("{base}/v1/claims?q=late-"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let lag = v["read_from"]["replica"]["lag_s"].as_f64().unwrap();
    assert!(lag >= 2.0, "{v}");
    assert_eq!(
        v["claims"].as_array().unwrap().len(),
        0,
        "not replayed yet: {v}"
    );
    let page = c
        .get(format!("{base}/claims?q=late-"))
        .header("Cookie", &cookies[0])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("s behind the primary: claims received since may be missing"),
        "{page}"
    );
    sqlx::query("SELECT pg_wal_replay_resume()")
        .execute(&mut standby)
        .await
        .unwrap();
    pair.wait_caught_up().await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let v: serde_json::Value = c
        .get(format!("{base}/v1/claims?q=late-"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["claims"].as_array().unwrap().len(), 1, "replayed: {v}");
    eprintln!(
        "lag while paused: {lag:.1} s; after: {}",
        v["read_from"]["replica"]["lag_s"]
    );
    drop(worker);
    let log = std::fs::read_to_string(dir.path().join("replica.log")).unwrap();
    assert!(
        log.contains("operators' searches, reports and ledger reads run on the read replica"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_cannot_be_read_sends_the_search_to_the_primary_with_a_notice_or_is_refused()
{
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (_sb, provider) = sandbox(Default::default()).await;
    // Nothing listens there: the replica is down.
    let down = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let consumers = consumer_toml("payments", &provider, "");
    let running = start(&with_replica(&store.url(), &down, "", &consumers)).await;
    let base = format!("http://{}", running.http_addr);
    let c = client();
    let r = c
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "order-1")
        .json(&serde_json::json!({"amount": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let v: serde_json::Value = c
        .get(format!("{base}/v1/claims?q=order-1"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["claims"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["read_from"]["source"], "primary_fallback", "{v}");
    assert!(v["read_from"]["replica_error"].is_string(), "{v}");
    let page = c
        .get(format!("{base}/claims?q=order-1"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("order-1"), "{page}");
    assert!(
        page.contains("the read replica cannot be read") && page.contains("ran on the primary"),
        "{page}"
    );
    let metrics = get_text(&format!("{base}/metrics")).await;
    let up = metrics
        .lines()
        .find(|l| l.starts_with("claimd_read_replica_up{"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(up.ends_with(" 0"), "{up}");
    let fell_back = metrics
        .lines()
        .find(|l| l.starts_with("claimd_read_replica_fallback_reads_total{"))
        .unwrap();
    assert!(fell_back.ends_with(" 2"), "{fell_back}");
    running.shutdown(Duration::from_secs(1)).await;

    // With read_fallback = "refuse", nothing of the search reaches the primary: busy.
    let refusing = with_replica(
        &store.url(),
        &down,
        "read_fallback = \"refuse\"",
        &consumers,
    );
    let running = start(&refusing).await;
    let base = format!("http://{}", running.http_addr);
    let r = c
        .get(format!("{base}/v1/claims?q=order-1"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body = r.text().await.unwrap();
    assert!(body.contains("read_fallback"), "{body}");
    running.shutdown(Duration::from_secs(1)).await;
}

#[test]
fn sqlite_refuses_a_read_replica() {
    let toml = with_replica(
        "sqlite://claims.db",
        "postgres://claimd@replica/claimd",
        "",
        &consumer_toml("payments", "http://127.0.0.1:9", ""),
    );
    let e = claimd::config::Config::from_toml(&toml, "t.toml".as_ref(), std::env::vars())
        .unwrap_err()
        .to_string();
    assert!(e.contains("store.read_url"), "{e}");
    assert!(e.contains("SQLite is a single file with no replica"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_reads_its_claims_from_the_replica_and_keeps_its_summary_on_the_primary() {
    use crate::ledger::{claimd as ledger_cli, completed_claim, env, key, payment_intent};
    use common::localstripe::{CARD_OK, LocalStripe, require_localstripe};
    let Some(bin) = require_localstripe() else {
        return;
    };
    let Some(pair) = PgPair::start(Standby::Asynchronous) else {
        return;
    };
    create_pg_stat_statements(&pair).await;
    let ls = LocalStripe::start(&bin).await;
    let mut env = env(&pair.url(), &ls.url);
    let (code, _, err) = ledger_cli(&["migrate"], &env);
    assert_eq!(code, 0, "migrate: {err}");
    let store = claimd::store::open(&pair.url(), 4).await.unwrap();
    let pm = ls.payment_method(CARD_OK).await;
    for i in 0..5 {
        let id = format!("order-{i}");
        completed_claim(&store, &id, 1000 + i).await;
        payment_intent(&ls, &pm, &key(&id), 1000 + i).await;
    }
    pair.wait_caught_up().await;
    reset_primary_statements(&pair).await;
    env.push(("CLAIMD__STORE__READ_URL".into(), pair.standby_url()));
    let (code, out, err) = ledger_cli(
        &["reconcile", "--ledger", "--since", "1h", "--format", "json"],
        &env,
    );
    assert_eq!(code, 0, "the ledgers agree: {err}\n{out}");
    assert!(err.contains("read from the read replica"), "{err}");
    let ledger_sql = "%ORDER BY consumer, idem_key%";
    assert_eq!(
        calls(&pair.url(), ledger_sql).await,
        0,
        "no ledger read on the primary"
    );
    assert!(calls(&pair.standby_url(), ledger_sql).await >= 1);
    // The run's summary is written on the primary (a standby takes no writes).
    let runs = store.ledger_runs().await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
}
