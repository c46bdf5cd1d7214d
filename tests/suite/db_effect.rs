//! Database effects (docs/library.md, "Database effects"): the business write, the settle and
//! its history commit in one transaction. Business rows = messages exactly, under duplicates,
//! two instances racing for one id, deadlocks run again, and a worker SIGKILLed between its
//! write and the commit; a refused write fails the claim with nothing applied.

use crate::common;

use claimd::domain::claim::{Claim, ClaimState};
use claimd::provider::effect::sql::InTransaction;
use claimd::service::app::{App, Supplied};
use claimd::service::run::{self, Running};
use claimd::{DatabaseEffect, DbTx, async_trait};
use common::*;
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The test's own connection to the worker's database.
enum Db {
    Pg(sqlx::PgPool),
    Lite(sqlx::SqlitePool),
}

impl Db {
    async fn open(store: &TestStore) -> Db {
        match store {
            TestStore::Pg(db) => Db::Pg(sqlx::PgPool::connect(&db.url).await.unwrap()),
            TestStore::Sqlite(_) => {
                let o = sqlx::sqlite::SqliteConnectOptions::from_str(&store.url())
                    .unwrap()
                    .create_if_missing(true)
                    .busy_timeout(Duration::from_secs(30));
                Db::Lite(sqlx::SqlitePool::connect_with(o).await.unwrap())
            }
        }
    }

    async fn run(&self, sql: &'static str) {
        match self {
            Db::Pg(p) => drop(sqlx::query(sql).execute(p).await.unwrap()),
            Db::Lite(p) => drop(sqlx::query(sql).execute(p).await.unwrap()),
        }
    }

    async fn count(&self, sql: &'static str) -> i64 {
        match self {
            Db::Pg(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
            Db::Lite(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
        }
    }
}

const INVOICES: &str = "CREATE TABLE invoices (order_id TEXT NOT NULL, \
    amount_cents BIGINT NOT NULL CHECK (amount_cents > 0))";

fn sql_consumer(statement: &str, extra: &str) -> String {
    format!(
        r#"
[[consumers]]
name = "ledger"
source = "http"
key = "{{message_id}}"
lease = "4s"
redrive_within = "1h"
{extra}
[consumers.effect]
kind = "sql"
timeout = "2s"
statement = "{statement}"
"#
    )
}

const INSERT: &str =
    "INSERT INTO invoices (order_id, amount_cents) VALUES (:order_id, :amount_cents)";

async fn post(base: &str, id: &str, body: &str) -> (u16, String) {
    let r = client()
        .post(format!("{base}/v1/messages/ledger"))
        .header("Idempotency-Key", id)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

fn base(running: &Running) -> String {
    format!("http://{}", running.http_addr)
}

async fn claim(running: &Running, id: &str) -> Option<Claim> {
    running.app().store.get("ledger", "", id).await.unwrap()
}

async fn writes_once(store: TestStore) {
    let toml = config_toml(&store.url(), &sql_consumer(INSERT, ""));
    let running = start(&toml).await;
    let db = Db::open(&store).await;
    db.run(INVOICES).await;
    let b = base(&running);
    for i in 0..100 {
        let body = format!(r#"{{"order_id":"o-{i}","amount_cents":{}}}"#, 100 + i);
        assert_eq!(post(&b, &format!("m-{i}"), &body).await.0, 202);
        if i % 10 == 0 {
            // A repeat delivery: acknowledged as the same claim, never written twice.
            assert_eq!(post(&b, &format!("m-{i}"), &body).await.0, 200);
        }
    }
    let (status, text) = post(&b, "no-amount", r#"{"order_id":"o-x"}"#).await;
    assert_eq!(status, 422, "{text}");
    assert!(
        text.contains("amount_cents"),
        "names the missing field: {text}"
    );
    assert_eq!(
        post(&b, "negative", r#"{"order_id":"o-n","amount_cents":-5}"#)
            .await
            .0,
        202
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            let mut done = 0;
            for i in 0..100 {
                if claim(&running, &format!("m-{i}")).await.unwrap().state == ClaimState::Completed
                {
                    done += 1;
                }
            }
            done == 100
        })
        .await,
        "every claim completes"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM invoices").await,
        100,
        "one row a message"
    );
    assert_eq!(
        db.count("SELECT count(DISTINCT order_id) FROM invoices")
            .await,
        100
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            claim(&running, "negative").await.unwrap().state == ClaimState::Failed
        })
        .await
    );
    let refused = claim(&running, "negative").await.unwrap();
    let why = refused.last_error.clone().unwrap_or_default();
    assert!(why.contains("refused the effect's write"), "{why}");
    assert_eq!(
        db.count("SELECT count(*) FROM invoices WHERE order_id = 'o-n'")
            .await,
        0,
        "a refused write applied nothing"
    );
    let first = claim(&running, "m-0").await.unwrap();
    assert_eq!(first.attempt, 1);
    assert!(first.processed_utc.is_some());
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_effect_writes_once_per_message_and_a_refused_write_fails_sqlite() {
    writes_once(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_effect_writes_once_per_message_and_a_refused_write_fails_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    writes_once(store).await;
}

/// The check-then-act race: two instances, one message id posted to both at once, twenty
/// times: one business row each time, one answer new and one duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_racing_for_one_id_write_one_row_twenty_times_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let toml = config_toml(&store.url(), &sql_consumer(INSERT, ""));
    let (a, b) = (start(&toml).await, start(&toml).await);
    let db = Db::open(&store).await;
    db.run(INVOICES).await;
    let (ba, bb) = (base(&a), base(&b));
    for i in 0..20 {
        let (id, body) = (
            format!("race-{i}"),
            format!(r#"{{"order_id":"r-{i}","amount_cents":7}}"#),
        );
        let (x, y) = tokio::join!(post(&ba, &id, &body), post(&bb, &id, &body));
        let mut statuses = [x.0, y.0];
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 202], "race {i}: one new, one duplicate");
    }
    assert!(
        eventually(Duration::from_secs(20), || async {
            db.count("SELECT count(*) FROM claims WHERE state = 'completed'")
                .await
                == 20
        })
        .await
    );
    assert_eq!(db.count("SELECT count(*) FROM invoices").await, 20);
    assert_eq!(
        db.count("SELECT count(DISTINCT order_id) FROM invoices")
            .await,
        20
    );
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
}

/// A claim still open: message id, state, attempt, lease owner, last error.
type OpenClaim = (String, String, i32, Option<String>, Option<String>);

/// A Rust database effect that moves one unit between two accounts, locking them in the
/// message's order with a pause between: two messages in opposite orders deadlock.
struct Transfer {
    deadlocks: Arc<AtomicUsize>,
}

#[async_trait]
impl DatabaseEffect for Transfer {
    async fn apply(&self, tx: DbTx<'_>, claim: &Claim) -> Result<(), sqlx::Error> {
        let DbTx::Postgres(conn) = tx else {
            unreachable!("the test runs on PostgreSQL")
        };
        let v: serde_json::Value = serde_json::from_slice(&claim.payload).unwrap();
        let (from, to) = (v["from"].as_i64().unwrap(), v["to"].as_i64().unwrap());
        let result = async {
            sqlx::query("UPDATE accounts SET n = n - 1 WHERE id = $1")
                .bind(from)
                .execute(&mut *conn)
                .await?;
            tokio::time::sleep(Duration::from_millis(15)).await;
            sqlx::query("UPDATE accounts SET n = n + 1 WHERE id = $1")
                .bind(to)
                .execute(&mut *conn)
                .await?;
            sqlx::query("INSERT INTO transfers (message_id) VALUES ($1)")
                .bind(&claim.message_id)
                .execute(&mut *conn)
                .await
        }
        .await;
        if let Err(sqlx::Error::Database(e)) = &result
            && e.code().as_deref() == Some("40P01")
        {
            self.deadlocks.fetch_add(1, Ordering::SeqCst);
        }
        result.map(drop)
    }
}

/// Three instances, transfers in opposite orders (real deadlocks, each run again as a whole
/// transaction): transfers = messages exactly, balances add up, nothing parked, nothing
/// waiting for a person. (Kills: the SIGKILL test below.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_and_deadlocks_leave_one_write_per_message_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let consumer = r#"
[[consumers]]
name = "ledger"
source = "http"
key = "{message_id}"
lease = "8s"
redrive_within = "1h"
concurrency = 3
[consumers.effect]
kind = "custom"
timeout = "4s"    # room for lock waits on a loaded machine: past it, cut and run again
"#;
    let toml = config_toml(&store.url(), consumer);
    let deadlocks = Arc::new(AtomicUsize::new(0));
    let instance = || async {
        let effect: Arc<dyn claimd::Effect> = Arc::new(InTransaction(Transfer {
            deadlocks: deadlocks.clone(),
        }));
        let supplied = Supplied {
            store: None,
            effects: HashMap::from([("ledger".to_string(), effect)]),
        };
        let app = App::open_with(load(&toml), true, supplied).await.unwrap();
        run::start(app).await.unwrap()
    };
    let workers = vec![instance().await, instance().await, instance().await];
    let db = Db::open(&store).await;
    db.run("CREATE TABLE accounts (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)")
        .await;
    db.run("INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 20) g")
        .await;
    db.run("CREATE TABLE transfers (message_id TEXT NOT NULL)")
        .await;
    const N: usize = 90;
    let bases: Vec<String> = workers.iter().map(base).collect();
    // Six producers, each posting its share in turn to the three instances: every
    // instance has effects in flight at once, in opposite orders.
    let mut posts = Vec::new();
    for p in 0..6 {
        let bases = bases.clone();
        posts.push(tokio::spawn(async move {
            for i in (p..N).step_by(6) {
                // Messages 2q and 2q+1 move between the same two accounts in opposite
                // orders, posted by two producers at once: they may deadlock.
                let a = 2 * ((i / 2) % 10) + 1;
                let (from, to) = if i % 2 == 0 { (a, a + 1) } else { (a + 1, a) };
                let body = format!(r#"{{"from":{from},"to":{to}}}"#);
                // A busy instance answers 503 (every call slot taken): try the next one.
                let mut k = i;
                loop {
                    let (s, text) = post(&bases[k % 3], &format!("t-{i}"), &body).await;
                    if s == 202 || s == 200 {
                        break;
                    }
                    assert_eq!(s, 503, "t-{i}: {text}");
                    k += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }
    for p in posts {
        tokio::time::timeout(Duration::from_secs(120), p)
            .await
            .expect("every message acknowledged within 2 minutes")
            .unwrap();
    }
    let posted = db.count("SELECT count(*) FROM claims").await;
    assert_eq!(
        posted, N as i64,
        "every message was acknowledged by some instance"
    );
    let all_done = eventually(Duration::from_secs(60), || async {
        db.count("SELECT count(*) FROM claims WHERE state <> 'completed'")
            .await
            == 0
    })
    .await;
    let Db::Pg(pool) = &db else { unreachable!() };
    let open: Vec<OpenClaim> = sqlx::query_as(
        "SELECT message_id, state, attempt, lease_owner, last_error FROM claims \
         WHERE state <> 'completed' ORDER BY id LIMIT 5",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let history: Vec<(i32, String, String, Option<String>)> = sqlx::query_as(
        "SELECT e.attempt, e.action, e.outcome, e.detail FROM claim_events e \
         JOIN claims c ON c.id = e.claim_id WHERE c.state <> 'completed' \
         ORDER BY e.claim_id, e.id LIMIT 20",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        all_done,
        "every claim completes (none parked, none needs attention); open: {open:?}; history: {history:?}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM transfers").await,
        posted,
        "one transfer per claim"
    );
    assert_eq!(
        db.count("SELECT count(DISTINCT message_id) FROM transfers")
            .await,
        posted
    );
    assert_eq!(db.count("SELECT sum(n)::bigint FROM accounts").await, 0);
    let seen = deadlocks.load(Ordering::SeqCst);
    println!("{posted} transfers, {seen} deadlocks run again");
    assert!(seen > 0, "the opposite orders deadlocked at least once");
    for w in workers {
        w.shutdown(Duration::from_secs(5)).await;
    }
}

/// SIGKILL between the business write and the commit: nothing applied; the next worker's
/// sweeper performs it once, with no question for a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_the_write_and_the_commit_applies_nothing_then_once_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    // The write, then a wait on a lock the test holds: the worker is killed in between.
    let statement = "WITH w AS (INSERT INTO invoices (order_id, amount_cents) \
        VALUES (:order_id, :amount_cents) RETURNING 1) \
        SELECT pg_advisory_xact_lock_shared(4242) FROM w";
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let toml = config_toml(&store.url(), &sql_consumer(statement, "")).replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    let config = dir.path().join("claimd.toml");
    std::fs::write(&config, &toml).unwrap();
    let log = dir.path().join("worker.log");
    let db = Db::open(&store).await;
    let Db::Pg(pool) = &db else { unreachable!() };
    let w = Worker::spawn(&config, port, &log).await;
    db.run(INVOICES).await;
    let mut gate = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut *gate)
        .await
        .unwrap();
    assert_eq!(
        post(&w.base, "k-1", r#"{"order_id":"o-1","amount_cents":10}"#)
            .await
            .0,
        202
    );
    // The row is written (uncommitted) and the worker waits on the gate.
    assert!(
        eventually(Duration::from_secs(10), || async {
            db.count("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                .await
                >= 1
        })
        .await,
        "the worker reached the gate after its write"
    );
    w.kill();
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut *gate)
        .await
        .unwrap();
    drop(gate);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        db.count("SELECT count(*) FROM invoices").await,
        0,
        "killed before the commit: nothing applied"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM claims WHERE state = 'started'")
            .await,
        1
    );
    let w2 = Worker::spawn(&config, port, &log).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            db.count("SELECT count(*) FROM claims WHERE state = 'completed'")
                .await
                == 1
        })
        .await,
        "the sweeper performs it after the lease"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM invoices").await,
        1,
        "then once"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM claims WHERE attempt = 2")
            .await,
        1,
        "taken over once"
    );
    drop(w2);
}

mod limits;
