//! Fair taking across tenants: a backlog of 50,000 claims of one tenant, then one claim each
//! of ten others: with `fairness = "tenant"` each of the ten settles within 2 s. And the
//! sweeper's takeovers interleave tenants the same way.

use crate::common::*;
use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use claimd::{Enqueue, enqueue};
use sqlx::Connection;
use std::str::FromStr;
use std::time::{Duration, Instant};

const BACKLOG: usize = 50_000;
const OTHERS: usize = 10;

/// Enqueues `BACKLOG` claims of tenant `big` in one producer transaction.
async fn enqueue_backlog(store: &TestStore) {
    match store {
        TestStore::Pg(db) => {
            let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM generate_series(1, $1) AS g, \
                 LATERAL claimd.enqueue('payments', 'big-' || g, '{\"n\": 1}'::jsonb, 'big') AS e",
            )
            .bind(BACKLOG as i64)
            .fetch_one(&mut conn)
            .await
            .unwrap();
            assert_eq!(n as usize, BACKLOG);
        }
        TestStore::Sqlite(_) => {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(&store.url())
                .unwrap()
                .busy_timeout(Duration::from_secs(30));
            let mut conn = sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap();
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
            for i in 0..BACKLOG {
                let id = format!("big-{i}");
                let e = Enqueue::new("payments", &id, br#"{"n": 1}"#).tenant("big");
                enqueue(&mut *tx, &e).await.unwrap();
            }
            tx.commit().await.unwrap();
        }
    }
}

/// Enqueues one claim of `tenant`, committed alone.
async fn enqueue_one(store: &TestStore, tenant: &str) {
    let e = Enqueue::new("payments", "one", br#"{"n": 1}"#).tenant(tenant);
    match store {
        TestStore::Pg(db) => {
            let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
            enqueue(&mut conn, &e).await.unwrap();
        }
        TestStore::Sqlite(_) => {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(&store.url())
                .unwrap()
                .busy_timeout(Duration::from_secs(30));
            let mut conn = sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap();
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
            enqueue(&mut *tx, &e).await.unwrap();
            tx.commit().await.unwrap();
        }
    }
}

async fn ten_tenants_pass_a_backlog(store: TestStore) {
    let (_sandbox, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(5),
        ..Default::default()
    })
    .await;
    let running = start(&config_toml(
        &store.url(),
        &consumer_toml(
            "payments",
            &provider,
            "fairness = \"tenant\"\nconcurrency = 32",
        ),
    ))
    .await;
    let db = claimd::store::open(&store.url(), 4).await.unwrap();
    let loaded = Instant::now();
    enqueue_backlog(&store).await;
    let loaded = loaded.elapsed();
    let tenants: Vec<String> = (0..OTHERS).map(|t| format!("t{t}")).collect();
    let mut waits = Vec::new();
    let started = Instant::now();
    for t in &tenants {
        enqueue_one(&store, t).await;
    }
    let mut pending: Vec<&String> = tenants.iter().collect();
    while !pending.is_empty() && started.elapsed() < Duration::from_secs(30) {
        let mut still = Vec::new();
        for t in pending {
            let c = db.get("payments", t, "one").await.unwrap().unwrap();
            if c.state == ClaimState::Completed {
                waits.push(started.elapsed());
            } else {
                still.push(t);
            }
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let behind: i64 = db
        .counts(None)
        .await
        .unwrap()
        .iter()
        .map(|c| c.started)
        .sum();
    running.shutdown(Duration::from_secs(5)).await;
    assert!(pending.is_empty(), "tenants never settled: {pending:?}");
    let worst = waits.iter().max().copied().unwrap_or_default();
    println!(
        "fairness ({}): backlog of {BACKLOG} claims of one tenant (enqueued in {:.1} s); each of \
         {OTHERS} other tenants' claims settled within {} ms (worst), with {behind} claims still open",
        if matches!(store, TestStore::Pg(_)) {
            "postgres"
        } else {
            "sqlite"
        },
        loaded.as_secs_f64(),
        worst.as_millis()
    );
    assert!(
        worst < Duration::from_secs(2),
        "a tenant waited {worst:?} behind the backlog"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_tenants_pass_a_backlog_sqlite() {
    ten_tenants_pass_a_backlog(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_tenants_pass_a_backlog_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    ten_tenants_pass_a_backlog(store).await;
}
