//! Limits per account (`effect.rate_limit_key`): 50 accounts, each limited by the provider to
//! 5 calls a second, 1,500 payouts enqueued in random order: with `rate_limit = "5/s"` per
//! `{account}`, the provider answers no `429`, every payout is applied once, and the whole
//! runs at 90 % or more of the 250 a second the accounts allow together. The same load paced
//! only per consumer (`rate_limit = "250/s"`) is shown for comparison.

use crate::common::*;
use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::{Sandbox, SandboxModes, SandboxOptions};
use claimd::{Enqueue, enqueue};
use sqlx::Connection;
use std::str::FromStr;
use std::time::{Duration, Instant};

const ACCOUNTS: usize = 50;
const PER_ACCOUNT: usize = 30;
const LIMIT: u32 = 5;

/// The provider: each account limited to `LIMIT` a second.
async fn provider() -> (Sandbox, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let modes = SandboxModes {
        per_key_limit: Some(("account".into(), LIMIT)),
        ..Default::default()
    };
    let sb = Sandbox::with_modes(SandboxOptions::default(), modes);
    let served = sb.clone();
    tokio::spawn(async move {
        let _ = served.serve(listener, std::future::pending()).await;
    });
    (sb, url)
}

/// Enqueues every payout (shuffled) in one transaction, then waits until all completed:
/// (calls a second the provider applied, from its first to its last; its 429s).
async fn run(store: &TestStore, effect_limits: &str) -> (f64, u64, Sandbox) {
    let (sandbox, url) = provider().await;
    // The effect's keys go last, into the consumer's `[consumers.effect]` table.
    let consumer = format!(
        "{}{effect_limits}\n",
        consumer_toml("payouts", &url, "concurrency = 512\nlease = \"30s\"")
    );
    let running = start(&config_toml(&store.url(), &consumer)).await;
    let s = running.app().store.clone();
    let mut ids: Vec<(usize, usize)> = (0..ACCOUNTS)
        .flat_map(|a| (0..PER_ACCOUNT).map(move |n| (a, n)))
        .collect();
    fastrand::shuffle(&mut ids);
    // All at once, in one producer transaction: the provider's pace is what is measured, not
    // how fast a test client can post.
    let started = Instant::now();
    enqueue_all(store, &ids).await;
    let total = ACCOUNTS * PER_ACCOUNT;
    let done = eventually(Duration::from_secs(60), || {
        let sandbox = sandbox.clone();
        async move { sandbox.effects().len() == total }
    })
    .await;
    assert!(done, "applied {} of {total}", sandbox.effects().len());
    // The provider's view: from its first applied call to its last.
    let times: Vec<_> = sandbox
        .effects()
        .iter()
        .map(|e| e.first_applied_utc)
        .collect();
    let (first, last) = (times.iter().min().unwrap(), times.iter().max().unwrap());
    let elapsed = (*last - *first).to_std().unwrap_or_default();
    println!(
        "  enqueued and applied in {:.1} s; from the first call to the last {:.1} s",
        started.elapsed().as_secs_f64(),
        elapsed.as_secs_f64()
    );
    let settled = eventually(Duration::from_secs(10), || async {
        let c = s.get("payouts", "", "p-0-0").await.unwrap().unwrap();
        c.state == ClaimState::Completed
    })
    .await;
    assert!(settled);
    assert!(
        sandbox.effects().iter().all(|e| e.applied == 1),
        "each applied once"
    );
    running.shutdown(Duration::from_secs(5)).await;
    (
        total as f64 / elapsed.as_secs_f64(),
        sandbox.rate_limited_per_key(),
        sandbox,
    )
}

/// Enqueues `(account, n)` payouts in one producer transaction, in that order.
async fn enqueue_all(store: &TestStore, ids: &[(usize, usize)]) {
    let bodies: Vec<(String, String)> = ids
        .iter()
        .map(|(a, n)| {
            (
                format!("p-{a}-{n}"),
                format!(r#"{{"account":"acct_{a}","amount_cents":{n}}}"#),
            )
        })
        .collect();
    let each = bodies
        .iter()
        .map(|(id, body)| Enqueue::new("payouts", id, body.as_bytes()));
    match store {
        TestStore::Pg(db) => {
            let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            for e in each {
                enqueue(&mut *tx, &e).await.unwrap();
            }
            tx.commit().await.unwrap();
        }
        TestStore::Sqlite(_) => {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(&store.url())
                .unwrap()
                .busy_timeout(Duration::from_secs(30));
            let mut conn = sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap();
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
            for e in each {
                enqueue(&mut *tx, &e).await.unwrap();
            }
            tx.commit().await.unwrap();
        }
    }
}

async fn keyed_limits_meet_each_account(store: TestStore, compare: bool) {
    let name = if matches!(store, TestStore::Pg(_)) {
        "postgres"
    } else {
        "sqlite"
    };
    let keyed = "rate_limit = \"5/s\"\nrate_limit_key = \"{account}\"";
    let (rate, refused, _) = run(&store, keyed).await;
    let allowed = (ACCOUNTS as f64) * f64::from(LIMIT);
    println!(
        "limits per account ({name}): {ACCOUNTS} accounts at {LIMIT}/s, {} payouts: {rate:.0}/s \
         ({:.0} % of {allowed:.0}/s), {refused} answered 429",
        ACCOUNTS * PER_ACCOUNT,
        100.0 * rate / allowed
    );
    assert_eq!(refused, 0, "no call met an account's limit");
    assert!(
        rate >= 0.9 * allowed,
        "{rate:.0}/s is under 90 % of {allowed}/s"
    );
    if compare {
        let other = TestStore::sqlite();
        let (rate, refused, _) = run(&other, "rate_limit = \"250/s\"").await;
        println!(
            "the same load paced per consumer only (rate_limit = \"250/s\"): {rate:.0}/s, {refused} answered 429"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyed_limits_meet_each_account_sqlite() {
    keyed_limits_meet_each_account(TestStore::sqlite(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyed_limits_meet_each_account_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    keyed_limits_meet_each_account(store, false).await;
}
