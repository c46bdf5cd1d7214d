//! Database effects at their limits: a connection cut mid-transaction (57P01, what every
//! connection gets on a fast restart or failover) runs the transaction again; a transaction
//! past `effect.timeout` is rolled back where it runs; a payload without a field the
//! statement takes fails at once naming it; `processed_utc` is the commit's time; the
//! database's texts carry no "at line N" of PostgreSQL's source; a pool too small for a SQL
//! consumer's concurrency is warned about at start.

use super::{Db, INSERT, INVOICES, base, claim, post};
use crate::common::*;
use claimd::domain::claim::ClaimState;
use std::time::Duration;

fn consumer(statement: &str, timeout: &str, lease: &str, extra: &str) -> String {
    format!(
        r#"
[[consumers]]
name = "ledger"
source = "http"
key = "{{message_id}}"
lease = "{lease}"
redrive_within = "1h"
concurrency = 4
{extra}
[consumers.effect]
kind = "sql"
timeout = "{timeout}"
statement = "{statement}"
"#
    )
}

/// Backends of this test's database (other tests share the server) matching `like`.
async fn backends(pool: &sqlx::PgPool, like: &str) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid() AND state = 'active' AND query LIKE $1",
    )
    .bind(like)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// I13: the effect's backend is terminated inside its transaction (SQLSTATE 57P01). The
/// transaction runs again on a fresh connection within the same attempt; the claim completes
/// with its row written once, never `failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_backend_mid_transaction_runs_again_and_writes_once_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    // The write, then a wait on a lock the test holds: the backend is terminated there.
    let statement = "WITH w AS (INSERT INTO invoices (order_id, amount_cents) \
        VALUES (:order_id, :amount_cents) RETURNING 1) \
        SELECT pg_advisory_xact_lock_shared(4243) FROM w";
    let running = start(&config_toml(
        &store.url(),
        &consumer(statement, "5s", "12s", ""),
    ))
    .await;
    let db = Db::open(&store).await;
    let Db::Pg(pool) = &db else { unreachable!() };
    db.run(INVOICES).await;
    let mut gate = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(4243)")
        .execute(&mut *gate)
        .await
        .unwrap();
    let b = base(&running);
    assert_eq!(
        post(&b, "cut-1", r#"{"order_id":"o-1","amount_cents":10}"#)
            .await
            .0,
        202
    );
    let gated = "%pg_advisory_xact_lock_shared(4243)%";
    assert!(
        eventually(Duration::from_secs(10), || async {
            !backends(pool, gated).await.is_empty()
        })
        .await,
        "the effect reached the gate after its write"
    );
    let waiting = backends(pool, gated).await;
    let cut: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(waiting[0])
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(cut, "terminated the effect's backend");
    // Give the worker the moment to meet the cut before the gate opens.
    tokio::time::sleep(Duration::from_millis(500)).await;
    sqlx::query("SELECT pg_advisory_unlock(4243)")
        .execute(&mut *gate)
        .await
        .unwrap();
    drop(gate);
    assert!(
        eventually(Duration::from_secs(10), || async {
            claim(&running, "cut-1").await.unwrap().state != ClaimState::Started
        })
        .await,
        "the claim is decided"
    );
    let c = claim(&running, "cut-1").await.unwrap();
    assert_eq!(
        c.state,
        ClaimState::Completed,
        "a lost connection is not an answer: {:?}",
        c.last_error
    );
    assert_eq!(c.attempt, 1, "run again within the attempt, not taken over");
    let history = running.app().store.events(c.id).await.unwrap();
    println!("history: {:?}", lines(&history));
    assert_eq!(
        db.count("SELECT count(*) FROM invoices").await,
        1,
        "written once"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// `effect.timeout` bounds the effect's transaction where it runs: a statement that would
/// run 30 s is cut at 1 s and rolled back; the attempts run out and the claim parks, with
/// nothing of it still running in the database, nothing applied, and a reason that names
/// the timeout and no provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_past_the_effect_timeout_is_cut_and_parks_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let statement = "WITH w AS (INSERT INTO invoices (order_id, amount_cents) \
        VALUES (:order_id, :amount_cents) RETURNING 1) SELECT pg_sleep(30) FROM w";
    let running = start(&config_toml(
        &store.url(),
        &consumer(statement, "1s", "3s", "max_attempts = 2"),
    ))
    .await;
    let db = Db::open(&store).await;
    let Db::Pg(pool) = &db else { unreachable!() };
    db.run(INVOICES).await;
    let b = base(&running);
    let posted = std::time::Instant::now();
    assert_eq!(
        post(&b, "slow-1", r#"{"order_id":"o-1","amount_cents":10}"#)
            .await
            .0,
        202
    );
    assert!(
        eventually(Duration::from_secs(30), || async {
            claim(&running, "slow-1").await.unwrap().state == ClaimState::NeedsAttention
        })
        .await,
        "parked once its attempts ran out"
    );
    let still = eventually(Duration::from_secs(2), || async {
        backends(pool, "%pg_sleep(30)%").await.is_empty()
    })
    .await;
    assert!(
        still,
        "nothing of a parked claim still runs in the database: {:?}",
        backends(pool, "%pg_sleep(30)%").await
    );
    assert_eq!(db.count("SELECT count(*) FROM invoices").await, 0);
    let c = claim(&running, "slow-1").await.unwrap();
    let why = c.last_error.clone().unwrap_or_default();
    println!(
        "parked after {:.1} s at attempt {}: {why}",
        posted.elapsed().as_secs_f64(),
        c.attempt
    );
    assert!(!why.contains("provider"), "no provider here: {why}");
    let history = running.app().store.events(c.id).await.unwrap();
    let details: Vec<String> = history.iter().filter_map(|e| e.detail.clone()).collect();
    assert!(
        details.iter().any(|d| d.contains("effect.timeout")),
        "the history says the timeout cut it: {details:?}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// A claim whose payload lacks a field the statement takes (stored without intake's check)
/// fails at once naming the field; a write the database refuses fails with its message,
/// without PostgreSQL's source line.
async fn refusals_fail_at_once(store: TestStore) {
    let running = start(&config_toml(
        &store.url(),
        &consumer(INSERT, "2s", "4s", ""),
    ))
    .await;
    let db = Db::open(&store).await;
    db.run(INVOICES).await;
    // `{}`: no order_id, no amount_cents.
    running
        .app()
        .store
        .claim(&orphan_claim("ledger", "", "no-field", "no-field"))
        .await
        .unwrap();
    let b = base(&running);
    assert_eq!(
        post(&b, "negative", r#"{"order_id":"o-n","amount_cents":-5}"#)
            .await
            .0,
        202
    );
    let decided = eventually(Duration::from_secs(6), || async {
        claim(&running, "no-field").await.unwrap().state == ClaimState::Failed
    })
    .await;
    let c = claim(&running, "no-field").await.unwrap();
    assert!(
        decided,
        "a missing field fails at once: {:?} at attempt {}, {:?}",
        c.state, c.attempt, c.last_error
    );
    let why = c.last_error.unwrap_or_default();
    println!("missing field, attempt {}: {why}", c.attempt);
    assert!(why.contains("\"order_id\""), "names the field: {why}");
    assert!(
        eventually(Duration::from_secs(6), || async {
            claim(&running, "negative").await.unwrap().state == ClaimState::Failed
        })
        .await
    );
    let why = claim(&running, "negative")
        .await
        .unwrap()
        .last_error
        .unwrap_or_default();
    println!("refused: {why}");
    assert!(why.contains("refused the effect's write"), "{why}");
    assert!(
        !why.contains(" at line "),
        "no line of PostgreSQL's source: {why}"
    );
    assert_eq!(db.count("SELECT count(*) FROM invoices").await, 0);
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_field_or_a_refused_write_fails_at_once_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    refusals_fail_at_once(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_field_or_a_refused_write_fails_at_once_sqlite() {
    refusals_fail_at_once(TestStore::sqlite()).await;
}

/// `processed_utc` is when the write committed, not when its transaction began: 1.5 s of
/// work after the row was written come before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processed_utc_is_the_commit_not_the_transaction_start_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let statement = "WITH w AS (INSERT INTO stamped (order_id) VALUES (:order_id) \
        RETURNING 1) SELECT pg_sleep(1.5) FROM w";
    let running = start(&config_toml(
        &store.url(),
        &consumer(statement, "5s", "10s", ""),
    ))
    .await;
    let db = Db::open(&store).await;
    let Db::Pg(pool) = &db else { unreachable!() };
    db.run(
        "CREATE TABLE stamped (order_id TEXT NOT NULL, \
         written TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
    )
    .await;
    assert_eq!(
        post(&base(&running), "t-1", r#"{"order_id":"o-1"}"#)
            .await
            .0,
        202
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            claim(&running, "t-1").await.unwrap().state == ClaimState::Completed
        })
        .await
    );
    let after: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM c.processed_utc - s.written)::float8 \
         FROM claims c, stamped s WHERE c.message_id = 't-1'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    println!("processed_utc - written = {after:.3} s");
    assert!(
        after >= 1.4,
        "processed_utc is {after:.3} s after the row was written (1.5 s of work followed)"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// A SQL consumer holds a store connection for each transaction in flight: a concurrency
/// the pool cannot serve beside claimd's own work is warned about at start.
#[test]
fn a_pool_smaller_than_a_sql_consumers_concurrency_is_warned_about() {
    let toml = config_toml("sqlite::memory:", &consumer(INSERT, "2s", "4s", ""))
        .replace("concurrency = 4", "concurrency = 64");
    let loaded = claimd::config::Config::from_toml(
        &toml,
        std::path::Path::new("test.toml"),
        std::iter::empty(),
    )
    .unwrap();
    assert!(
        loaded
            .warnings
            .iter()
            .any(|w| w.contains("max_connections") && w.contains("concurrency")),
        "{:?}",
        loaded.warnings
    );
    let fits = config_toml("sqlite::memory:", &consumer(INSERT, "2s", "4s", ""));
    let loaded = claimd::config::Config::from_toml(
        &fits,
        std::path::Path::new("test.toml"),
        std::iter::empty(),
    )
    .unwrap();
    assert!(
        !loaded
            .warnings
            .iter()
            .any(|w| w.contains("max_connections")),
        "{:?}",
        loaded.warnings
    );
}

/// A pool far smaller than a SQL consumer's concurrency (the start-up warning ignored):
/// transactions queue for connections past the pool's 5 s wait. A transaction that never got
/// a connection never began: it waits and is taken again, never spending an attempt, so every
/// claim completes, once, and none is parked. (Effects leave one connection free, so each
/// wait's hand-back is written; without that, busy runs parked some.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_too_small_slows_a_sql_consumer_but_parks_nothing_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let statement = "WITH w AS (INSERT INTO invoices (order_id, amount_cents) \
        VALUES (:order_id, :amount_cents) RETURNING 1) SELECT pg_sleep(1.5) FROM w";
    let toml = config_toml(
        &store.url(),
        // One attempt: a wait for a connection must not spend it.
        &consumer(statement, "3s", "6s", "max_attempts = 1"),
    )
    .replace("concurrency = 4", "concurrency = 16")
    .replace("max_connections = 8", "max_connections = 3");
    let running = start(&toml).await;
    let db = Db::open(&store).await;
    db.run(INVOICES).await;
    let b = base(&running);
    const N: usize = 24;
    let started = std::time::Instant::now();
    // All at once, so the transactions queue for the pool together.
    let mut posts = Vec::new();
    for i in 0..N {
        let b = b.clone();
        posts.push(tokio::spawn(async move {
            let body = format!(r#"{{"order_id":"p-{i}","amount_cents":5}}"#);
            // Intake's own claim may find no connection either: a 503 is retried.
            loop {
                let (s, text) = post(&b, &format!("p-{i}"), &body).await;
                if s == 202 || s == 200 {
                    break;
                }
                assert_eq!(s, 503, "{text}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    for p in posts {
        p.await.unwrap();
    }
    let done = eventually(Duration::from_secs(120), || async {
        db.count("SELECT count(*) FROM claims WHERE state <> 'started'")
            .await
            == N as i64
    })
    .await;
    let Db::Pg(pool) = &db else { unreachable!() };
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM claims GROUP BY state ORDER BY state")
            .fetch_all(pool)
            .await
            .unwrap();
    let max_attempt: i32 = sqlx::query_scalar("SELECT max(attempt) FROM claims")
        .fetch_one(pool)
        .await
        .unwrap();
    // What happened to any claim that did not complete: its history, one line per event.
    let histories: Vec<String> = sqlx::query_scalar(
        "SELECT c.id || ' ' || c.state || ': ' || string_agg(e.attempt || ' ' || e.actor || ' ' \
         || e.action || ' ' || e.outcome || ' ' || COALESCE(e.detail, ''), ' | ' ORDER BY e.id) \
         FROM claims c JOIN claim_events e ON e.claim_id = c.id \
         WHERE c.state <> 'completed' GROUP BY c.id, c.state",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    println!(
        "{N} claims, pool of 3, concurrency 16: {states:?} after {:.1} s, highest attempt {max_attempt}",
        started.elapsed().as_secs_f64()
    );
    assert!(done, "every claim decided: {states:?}");
    assert_eq!(
        states,
        [("completed".to_string(), N as i64)],
        "all completed, none parked: {histories:#?}"
    );
    assert_eq!(db.count("SELECT count(*) FROM invoices").await, N as i64);
    running.shutdown(Duration::from_secs(5)).await;
}

/// I13 through whole attempts: every run of the transaction loses its connection for 8 s
/// (each backend terminated as soon as it waits), past the lease's room for retries, with
/// `max_attempts = 1`. Those attempts decided nothing: each is a wait, so the claim is never
/// parked and completes, once, when the cuts stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_lost_for_several_attempts_park_nothing_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let statement = "WITH w AS (INSERT INTO invoices (order_id, amount_cents) \
        VALUES (:order_id, :amount_cents) RETURNING 1) \
        SELECT pg_advisory_xact_lock_shared(4244) FROM w";
    let running = start(&config_toml(
        &store.url(),
        &consumer(statement, "4s", "5s", "max_attempts = 1"),
    ))
    .await;
    let db = Db::open(&store).await;
    let Db::Pg(pool) = &db else { unreachable!() };
    db.run(INVOICES).await;
    let mut gate = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(4244)")
        .execute(&mut *gate)
        .await
        .unwrap();
    assert_eq!(
        post(
            &base(&running),
            "cuts-1",
            r#"{"order_id":"o-1","amount_cents":10}"#
        )
        .await
        .0,
        202
    );
    let until = std::time::Instant::now() + Duration::from_secs(8);
    let mut cuts = 0;
    while std::time::Instant::now() < until {
        for pid in backends(pool, "%pg_advisory_xact_lock_shared(4244)%").await {
            let _: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(pool)
                .await
                .unwrap();
            cuts += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let during = claim(&running, "cuts-1").await.unwrap();
    sqlx::query("SELECT pg_advisory_unlock(4244)")
        .execute(&mut *gate)
        .await
        .unwrap();
    drop(gate);
    assert!(
        eventually(Duration::from_secs(20), || async {
            claim(&running, "cuts-1").await.unwrap().state != ClaimState::Started
        })
        .await
    );
    let c = claim(&running, "cuts-1").await.unwrap();
    println!(
        "{cuts} connections cut over 8 s; then attempt {} {:?} (waits {}); during the cuts: attempt {} {:?}",
        c.attempt, c.state, c.waits, during.attempt, during.last_error
    );
    assert!(cuts >= 3, "the runs were cut again and again: {cuts}");
    assert!(
        during.attempt >= 2,
        "the cuts outlasted an attempt: {}",
        during.attempt
    );
    assert_eq!(
        c.state,
        ClaimState::Completed,
        "lost connections park nothing: {:?}",
        c.last_error
    );
    assert_eq!(db.count("SELECT count(*) FROM invoices").await, 1);
    running.shutdown(Duration::from_secs(5)).await;
}
