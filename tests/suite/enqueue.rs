//! Transactional enqueue (docs/producers.md), on PostgreSQL and SQLite: a claim written in a
//! producer's transaction exists if and only if the transaction commits, and the worker
//! performs it once; refusals are HTTP intake's; a thousand producers' transactions, some
//! rolled back and some killed, and a worker that died right after taking claims, end with
//! claims = commits = effects.

use crate::common;

use claimd::domain::claim::{ClaimState, KeyTemplate};
use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use claimd::service::run::Running;
use claimd::{Enqueue, EnqueueError, Enqueued, enqueue};
use common::*;
use sqlx::Connection;
use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// A producer's own connection pool on the worker's database.
#[derive(Clone)]
enum Producer {
    Pg(sqlx::PgPool),
    Lite(sqlx::SqlitePool),
}

/// How a producer's transaction ends.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    Commit,
    Rollback,
    /// The connection is closed without a commit (the producer process died).
    DropConnection,
    /// PostgreSQL: the backend is terminated mid-transaction.
    TerminateBackend,
}

impl Producer {
    async fn open(store: &TestStore) -> Producer {
        match store {
            TestStore::Pg(db) => Producer::Pg(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(40)
                    .connect(&db.url)
                    .await
                    .unwrap(),
            ),
            TestStore::Sqlite(_) => {
                let options = sqlx::sqlite::SqliteConnectOptions::from_str(&store.url())
                    .unwrap()
                    .busy_timeout(Duration::from_secs(30));
                Producer::Lite(
                    sqlx::sqlite::SqlitePoolOptions::new()
                        .max_connections(8)
                        .connect_with(options)
                        .await
                        .unwrap(),
                )
            }
        }
    }

    /// One transaction holding one enqueue, ended as `end`. `Ok(Some(_))`: committed.
    async fn run(&self, e: &Enqueue<'_>, end: End) -> Result<Option<Enqueued>, EnqueueError> {
        match self {
            Producer::Pg(pool) => {
                let mut conn = pool.acquire().await.unwrap().detach();
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut conn)
                    .await
                    .unwrap();
                let mut tx = conn.begin().await.unwrap();
                let answer = enqueue(&mut tx, e).await?;
                match end {
                    End::Commit => return Ok(tx.commit().await.is_ok().then_some(answer)),
                    End::Rollback => tx.rollback().await.unwrap(),
                    End::DropConnection => {
                        // Leak the transaction's rollback: the socket closes under it.
                        std::mem::forget(tx);
                        conn.close_hard().await.ok();
                    }
                    End::TerminateBackend => {
                        sqlx::query("SELECT pg_terminate_backend($1)")
                            .bind(pid)
                            .execute(pool)
                            .await
                            .unwrap();
                        // The commit meets a terminated backend (were it to succeed, the
                        // claim would count as committed).
                        return Ok(tx.commit().await.is_ok().then_some(answer));
                    }
                }
                Ok(None)
            }
            Producer::Lite(pool) => {
                let mut conn = pool.acquire().await.unwrap().detach();
                // A write transaction from the start: a deferred one that reads first may be
                // refused its upgrade to a writer (docs/producers.md).
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
                let answer = enqueue(&mut tx, e).await?;
                match end {
                    End::Commit => return Ok(tx.commit().await.is_ok().then_some(answer)),
                    End::Rollback => tx.rollback().await.unwrap(),
                    End::DropConnection | End::TerminateBackend => {
                        // Leak the transaction's rollback: the connection closes under it.
                        std::mem::forget(tx);
                        conn.close_hard().await.ok();
                    }
                }
                Ok(None)
            }
        }
    }

    async fn count(&self, sql: &'static str) -> i64 {
        match self {
            Producer::Pg(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
            Producer::Lite(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
        }
    }
}

/// A worker with the sandbox as its provider; its configuration, to start another like it.
async fn worker(store: &TestStore, extra_consumers: &str) -> (Running, Sandbox, String) {
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let consumers = format!(
        "{}{}",
        consumer_toml("payments", &provider, ""),
        extra_consumers.replace("PROVIDER", &provider)
    );
    let toml = config_toml(&store.url(), &consumers);
    (start(&toml).await, sandbox, toml)
}

async fn completed(running: &Running, id: &str) -> Option<claimd::Claim> {
    let c = running.app().store.get("payments", "", id).await.unwrap()?;
    (c.state == ClaimState::Completed).then_some(c)
}

async fn rolled_back_never_committed_once(store: TestStore) {
    let (running, sandbox, _) = worker(&store, "").await;
    let producer = Producer::open(&store).await;
    let body = br#"{"amount":500}"#;
    let none = producer
        .run(
            &Enqueue::new("payments", "rolled-back", body),
            End::Rollback,
        )
        .await
        .unwrap();
    assert_eq!(none, None);
    let enqueued = std::time::Instant::now();
    let Some(Enqueued::New(id)) = producer
        .run(&Enqueue::new("payments", "committed", body), End::Commit)
        .await
        .unwrap()
    else {
        panic!("the committed enqueue is a new claim")
    };
    assert!(
        eventually(Duration::from_secs(15), || async {
            completed(&running, "committed").await.is_some()
        })
        .await,
        "the committed claim completes"
    );
    println!(
        "{}: enqueued claim completed {:?} after its commit",
        running.app().store.dialect(),
        enqueued.elapsed()
    );
    let claim = completed(&running, "committed").await.unwrap();
    assert_eq!(claim.id, id);
    assert_eq!(claim.attempt, 1, "performed by the pickup, not the sweeper");
    assert!(claim.processed_utc.is_some());
    // Longer than SQLite's poll: the rolled-back message never became a claim or a call.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        running
            .app()
            .store
            .get("payments", "", "rolled-back")
            .await
            .unwrap()
            .is_none()
    );
    let effects = sandbox.effects();
    assert_eq!(effects.len(), 1, "one call: the committed message's");
    assert_eq!(effects[0].key, "payments::committed");
    assert_eq!(effects[0].applied, 1);
    // The "not called yet" marker was cleared before the call: a crash during it could not
    // have let the sweeper send it again as never sent.
    assert_eq!(
        producer
            .count("SELECT count(*) FROM claims WHERE handoff IS NOT NULL")
            .await,
        0
    );
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_is_never_performed_committed_is_performed_once_sqlite() {
    rolled_back_never_committed_once(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_is_never_performed_committed_is_performed_once_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    rolled_back_never_committed_once(store).await;
}

/// Two more consumers: `plain` keys on the message id only, with a 40-character key limit;
/// `tenanted` keys on the tenant.
const MORE: &str = r#"
[[consumers]]
name = "plain"
source = "http"
key = "{message_id}"
redrive_within = "1h"
[consumers.effect]
kind = "http"
url = "PROVIDER/v1/plain"
max_key_length = 40

[[consumers]]
name = "tenanted"
source = "http"
key = "{consumer}:{tenant}:{message_id}"
redrive_within = "1h"
[consumers.effect]
kind = "http"
url = "PROVIDER/v1/tenanted"
"#;

async fn refusals_as_http_intake(store: TestStore) {
    let (running, _sandbox, _) = worker(&store, MORE).await;
    let producer = Producer::open(&store).await;
    let first = producer
        .run(
            &Enqueue::new("payments", "m-1", br#"{"a": 1}"#),
            End::Commit,
        )
        .await
        .unwrap()
        .unwrap();
    let again = producer
        .run(
            &Enqueue::new("payments", "m-1", br#"{"a": 1}"#),
            End::Commit,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again, Enqueued::Duplicate(first.id()));
    let err = producer
        .run(
            &Enqueue::new("payments", "m-1", br#"{"a": 2}"#),
            End::Commit,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, EnqueueError::Conflict { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("\"m-1\"") && text.contains("payments::m-1"),
        "names the message and its key: {text}"
    );
    let claim = running
        .app()
        .store
        .get("payments", "", "m-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claim.duplicate_count, 1);

    let refused = |e: Enqueue<'static>| {
        let producer = producer.clone();
        async move { producer.run(&e, End::Commit).await.unwrap_err() }
    };
    let e = refused(Enqueue::new("nobody", "m-1", b"{}")).await;
    assert!(
        matches!(&e, EnqueueError::UnknownConsumer(c) if c == "nobody"),
        "{e}"
    );
    let e = refused(Enqueue::new("payments", "has space", b"{}")).await;
    assert!(matches!(e, EnqueueError::BadId(_)), "{e}");
    assert!(
        e.to_string().contains("not visible ASCII at position 3"),
        "{e}"
    );
    let e = refused(Enqueue::new("plain", "m-2", b"{}").tenant("acme")).await;
    assert!(matches!(e, EnqueueError::TenantNotKeyed { .. }), "{e}");
    assert!(e.to_string().contains("\"plain\""), "{e}");
    let long = "x".repeat(41);
    let long: &'static str = Box::leak(long.into_boxed_str());
    let e = refused(Enqueue::new("plain", long, b"{}")).await;
    assert!(
        matches!(&e, EnqueueError::KeyTooLong(k) if k.len == 41 && k.max == 40),
        "{e}"
    );
    let e = refused(Enqueue::new("payments", "m-3", b"{not json")).await;
    assert!(matches!(e, EnqueueError::NotJson(_)), "{e}");
    // A tenant in the key, encoded as intake encodes it.
    let t = producer
        .run(
            &Enqueue::new("tenanted", "m-4", b"{}").tenant("acme:eu"),
            End::Commit,
        )
        .await
        .unwrap()
        .unwrap();
    let stored = running
        .app()
        .store
        .get("tenanted", "acme:eu", "m-4")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.id, t.id());
    let template: KeyTemplate = "{consumer}:{tenant}:{message_id}".parse().unwrap();
    assert_eq!(
        stored.idem_key,
        template.render("tenanted", "acme:eu", "m-4")
    );
    assert_eq!(stored.idem_key, "tenanted:acme%3Aeu:m-4");
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_conflicts_and_refusals_are_http_intakes_sqlite() {
    refusals_as_http_intake(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_conflicts_and_refusals_are_http_intakes_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    refusals_as_http_intake(store).await;
}

/// The SQL function, called with plain SQL as a producer in any language would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_function_claims_refuses_and_names_the_key_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (running, sandbox, _) = worker(&store, MORE).await;
    let Producer::Pg(pool) = Producer::open(&store).await else {
        unreachable!()
    };
    let call = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let row: Result<(i64, bool), _> = sqlx::query_as(sql).fetch_one(&mut *tx).await;
            match row {
                Ok(row) => {
                    tx.commit().await.unwrap();
                    Ok(row)
                }
                Err(e) => {
                    let db = e.as_database_error().expect("a database refusal");
                    Err((db.code().unwrap().to_string(), db.message().to_string()))
                }
            }
        }
    };
    let (id, created) = call("SELECT * FROM claimd.enqueue('payments', 'sql-1', '{\"a\":1}')")
        .await
        .unwrap();
    assert!(created);
    // jsonb's text of {"a":1} is {"a": 1}: the Rust enqueue of those bytes is a duplicate.
    let producer = Producer::Pg(pool.clone());
    let dup = producer
        .run(
            &Enqueue::new("payments", "sql-1", br#"{"a": 1}"#),
            End::Commit,
        )
        .await
        .unwrap();
    assert_eq!(dup, Some(Enqueued::Duplicate(id)));
    let (again, created) = call("SELECT * FROM claimd.enqueue('payments', 'sql-1', '{\"a\": 1}')")
        .await
        .unwrap();
    assert_eq!((again, created), (id, false));
    let (code, message) = call("SELECT * FROM claimd.enqueue('payments', 'sql-1', '{\"a\":2}')")
        .await
        .unwrap_err();
    assert_eq!(code, "CD009");
    assert!(
        message.contains("'sql-1'") && message.contains("'payments::sql-1'"),
        "{message}"
    );
    for (sql, want) in [
        ("SELECT * FROM claimd.enqueue('nobody', 'm', '{}')", "CD001"),
        (
            "SELECT * FROM claimd.enqueue('payments', 'a b', '{}')",
            "CD002",
        ),
        (
            "SELECT * FROM claimd.enqueue('payments', '', '{}')",
            "CD002",
        ),
        (
            "SELECT * FROM claimd.enqueue('plain', 'm', '{}', tenant => 'acme')",
            "CD003",
        ),
        (
            "SELECT * FROM claimd.enqueue('plain', repeat('x', 41), '{}')",
            "CD004",
        ),
        (
            "SELECT * FROM claimd.enqueue_bytes('payments', 'm', 'not json'::bytea)",
            "CD006",
        ),
    ] {
        let (code, message) = call(sql).await.unwrap_err();
        assert_eq!(code, want, "{sql}: {message}");
    }
    // The tenant's encoding is KeyTemplate::render's, and the claim is performed.
    call("SELECT * FROM claimd.enqueue('tenanted', 'sql-2', '{}', tenant => 'acme:eu/1')")
        .await
        .unwrap();
    let template: KeyTemplate = "{consumer}:{tenant}:{message_id}".parse().unwrap();
    assert!(
        eventually(Duration::from_secs(15), || async {
            sandbox.effects().len() == 2
        })
        .await
    );
    let keys: BTreeSet<String> = sandbox.effects().into_iter().map(|e| e.key).collect();
    assert!(
        keys.contains(&template.render("tenanted", "acme:eu/1", "sql-2")),
        "{keys:?}"
    );
    assert!(keys.contains("payments::sql-1"), "{keys:?}");
    running.shutdown(Duration::from_secs(5)).await;
}

const PRODUCERS: usize = 1000;

/// How transaction `i` ends: one in ten rolled back, one in ten killed.
fn end_of(i: usize, pg: bool) -> End {
    match i % 20 {
        0 | 10 => End::Rollback,
        1 => End::DropConnection,
        11 if pg => End::TerminateBackend,
        11 => End::DropConnection,
        _ => End::Commit,
    }
}

async fn thousand_producers(store: TestStore) {
    let (first, sandbox, toml) = worker(&store, "").await;
    let producer = Producer::open(&store).await;
    let pg = matches!(producer, Producer::Pg(_));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let committed = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (producer, next, committed) = (producer.clone(), next.clone(), committed.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= PRODUCERS {
                    return;
                }
                let id = format!("order-{i}");
                let body = format!("{{\"order\":{i}}}");
                let e = Enqueue::new("payments", &id, body.as_bytes());
                if let Some(Enqueued::New(_)) = producer.run(&e, end_of(i, pg)).await.unwrap() {
                    committed.lock().unwrap().insert(format!("payments::{id}"));
                }
            }
        }));
    }
    // Meanwhile a worker takes batches of enqueued claims and dies before calling. Every other
    // take keeps the "not called yet" marker: the sweeper finds those claims when their lease
    // ends and sends them, knowing they were never sent. The others clear it, as this
    // consumer's worker does (it reconciles): the sweeper asks the provider, which has not
    // seen them, and sends them.
    let store_of = first.app().store.clone();
    let dead = tokio::spawn(async move {
        let mut taken = 0;
        for round in 0..50 {
            // A busy SQLite file on a loaded machine may refuse a take: this worker only
            // needs to take some claims before it dies.
            match store_of
                .take_enqueued(
                    "payments",
                    20,
                    "dead-worker",
                    Duration::from_millis(500),
                    (round % 2 == 1).then_some(Duration::from_secs(3600)),
                    0,
                )
                .await
            {
                Ok(claims) => taken += claims.len(),
                Err(e) => eprintln!("the dead worker's take failed: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        taken
    });
    // Halfway through, another instance starts and the first stops at once (no grace): the
    // claims it left and those enqueued after are the second's.
    while next.load(std::sync::atomic::Ordering::SeqCst) < PRODUCERS / 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let running = start(&toml).await;
    first.shutdown(Duration::ZERO).await;
    for t in tasks {
        t.await.unwrap();
    }
    let taken_by_dead = dead.await.unwrap();
    let committed = committed.lock().unwrap().clone();
    let commits = committed.len() as i64;
    assert!((750..=800).contains(&commits), "{commits} commits");
    assert_eq!(producer.count("SELECT count(*) FROM claims").await, commits);
    assert!(
        eventually(Duration::from_secs(60), || async {
            producer
                .count("SELECT count(*) FROM claims WHERE state = 'completed'")
                .await
                == commits
        })
        .await,
        "every committed claim completes"
    );
    let effects = sandbox.effects();
    let keys: BTreeSet<String> = effects.iter().map(|e| e.key.clone()).collect();
    assert_eq!(
        keys, committed,
        "the provider saw exactly the committed keys"
    );
    assert!(effects.iter().all(|e| e.applied == 1), "each applied once");
    println!(
        "{}: {commits} commits of {PRODUCERS}; {taken_by_dead} taken by a worker that died",
        running.app().store.dialect()
    );
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_producers_with_rollbacks_and_kills_claim_exactly_the_commits_sqlite() {
    thousand_producers(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_producers_with_rollbacks_and_kills_claim_exactly_the_commits_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    thousand_producers(store).await;
}

/// Whether the doorbell rings within `ms` milliseconds.
async fn rings(bell: &mut sqlx::postgres::PgListener, ms: u64) -> bool {
    tokio::time::timeout(Duration::from_millis(ms), bell.recv())
        .await
        .is_ok()
}

/// Whether one connection to the database listens (within 10 s).
async fn listens(producer: &Producer) -> bool {
    const LISTENING: &str = "SELECT count(*) FROM pg_stat_activity \
        WHERE datname = current_database() AND query LIKE 'LISTEN%'";
    eventually(Duration::from_secs(10), || async {
        producer.count(LISTENING).await == 1
    })
    .await
}

/// The worker's listening connection is cut: it listens again, and a claim enqueued meanwhile
/// is still performed (the poll after the reconnect, or the slow poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_listening_connection_delays_no_claim_for_long_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (running, sandbox, _) = worker(&store, "").await;
    let producer = Producer::open(&store).await;
    assert!(listens(&producer).await, "the worker listens");
    let Producer::Pg(pool) = &producer else {
        unreachable!()
    };
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .execute(pool)
    .await
    .unwrap();
    let enqueued = std::time::Instant::now();
    producer
        .run(&Enqueue::new("payments", "while-cut", b"{}"), End::Commit)
        .await
        .unwrap()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(15), || async {
            completed(&running, "while-cut").await.is_some()
        })
        .await,
        "the claim enqueued while the listener was cut completes"
    );
    println!(
        "postgres: completed {:?} after its commit with the listener cut",
        enqueued.elapsed()
    );
    assert_eq!(sandbox.effects().len(), 1);
    assert!(listens(&producer).await, "the worker listens again");
    running.shutdown(Duration::from_secs(5)).await;
}

/// The doorbell rings as a producer commits, unless an earlier claim of the consumer waits for
/// the pickup then (the worker taking that one keeps looking for a while): a producer that
/// commits long after the claims ahead of it were taken rings it and is taken at once, not by
/// the poll; an operator's redrive, which waits for the sweeper, silences nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doorbell_rings_at_commit_unless_an_earlier_claim_waits_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    // A worker registers the consumer, then stops: what is enqueued now waits.
    let (running, _sandbox, toml) = worker(&store, "").await;
    running.shutdown(Duration::from_secs(5)).await;
    let producer = Producer::open(&store).await;
    let Producer::Pg(pool) = &producer else {
        unreachable!()
    };
    let mut bell = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .unwrap();
    bell.listen("claimd_enqueued").await.unwrap();
    let body = br#"{"amount":700}"#;
    let commit = |id: &'static str| {
        let producer = producer.clone();
        async move {
            producer
                .run(&Enqueue::new("payments", id, body), End::Commit)
                .await
                .unwrap()
                .unwrap();
        }
    };
    commit("first").await;
    assert!(
        rings(&mut bell, 500).await,
        "the first enqueue rings the bell"
    );
    commit("second").await;
    assert!(
        !rings(&mut bell, 500).await,
        "an enqueue committed while an earlier claim waits rings none"
    );
    // A producer enqueues while those wait, and commits late.
    let mut conn = pool.acquire().await.unwrap().detach();
    let mut tx = sqlx::Connection::begin(&mut conn).await.unwrap();
    enqueue(&mut tx, &Enqueue::new("payments", "late", body))
        .await
        .unwrap();
    let running = start(&toml).await;
    for id in ["first", "second"] {
        assert!(
            eventually(Duration::from_secs(15), || async {
                completed(&running, id).await.is_some()
            })
            .await,
            "{id} is taken when a worker starts"
        );
    }
    // Past the pickup's busy tail, with nothing ahead of it: it rings.
    tokio::time::sleep(Duration::from_secs(2)).await;
    while rings(&mut bell, 50).await {}
    tx.commit().await.unwrap();
    let committed = std::time::Instant::now();
    assert!(
        rings(&mut bell, 500).await,
        "a commit with no claim ahead of it rings the bell, though the enqueue saw one waiting"
    );
    assert!(
        eventually(Duration::from_secs(15), || async {
            completed(&running, "late").await.is_some()
        })
        .await,
        "the late claim is taken"
    );
    println!(
        "an enqueue committed after the claims ahead of it were taken completed {:?} after its commit",
        committed.elapsed()
    );
    let late = completed(&running, "late").await.unwrap();
    assert_eq!(late.attempt, 1, "taken by the pickup, not the sweeper");
    // An operator redrives a claim while no worker runs: it waits for the sweeper, and an
    // enqueue behind it still rings.
    running.shutdown(Duration::from_secs(5)).await;
    // As `claimd claims redrive` leaves a parked claim (attempt + 1, no lease owner, lease
    // ended), which the sweeper takes.
    let Producer::Pg(pool) = &producer else {
        unreachable!()
    };
    sqlx::query(
        "UPDATE claims SET state = 'started', attempt = attempt + 1, lease_owner = NULL, \
         lease_until = now() - interval '1 millisecond', handoff = 'operator_redrive', \
         handoff_attempt = attempt + 1, processed_utc = NULL WHERE message_id = 'first'",
    )
    .execute(pool)
    .await
    .unwrap();
    commit("after-redrive").await;
    assert!(
        rings(&mut bell, 500).await,
        "a redriven claim waiting for the sweeper silences no enqueue"
    );
}

/// A take clears the "not called yet" marker only of claims received recently enough that a
/// takeover after its lease would still re-send or reconcile them; an older claim keeps it,
/// so a worker dying before its call never leaves it to be parked.
async fn the_take_clears_the_marker_only_of_young_claims(store: TestStore) {
    let (running, _sandbox, _) = worker(&store, "").await;
    running.shutdown(Duration::from_secs(5)).await;
    let producer = Producer::open(&store).await;
    for id in ["young", "old"] {
        producer
            .run(&Enqueue::new("payments", id, b"{}"), End::Commit)
            .await
            .unwrap()
            .unwrap();
    }
    let aged = match &producer {
        Producer::Pg(p) => sqlx::query(
            "UPDATE claims SET received_utc = received_utc - interval '2 hours' \
             WHERE message_id = 'old'",
        )
        .execute(p)
        .await
        .unwrap()
        .rows_affected(),
        Producer::Lite(p) => sqlx::query(
            "UPDATE claims SET received_utc = received_utc - 7200000 WHERE message_id = 'old'",
        )
        .execute(p)
        .await
        .unwrap()
        .rows_affected(),
    };
    assert_eq!(aged, 1);
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    let taken = s
        .take_enqueued(
            "payments",
            10,
            "worker",
            Duration::from_secs(60),
            Some(Duration::from_secs(3600)),
            0,
        )
        .await
        .unwrap();
    assert_eq!(taken.len(), 2);
    let marked = producer
        .count("SELECT count(*) FROM claims WHERE handoff = 'not_called' AND message_id = 'old'")
        .await;
    let cleared = producer
        .count("SELECT count(*) FROM claims WHERE handoff IS NULL AND message_id = 'young'")
        .await;
    assert_eq!(
        (marked, cleared),
        (1, 1),
        "old keeps its marker, young loses it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_take_clears_the_marker_only_of_young_claims_sqlite() {
    the_take_clears_the_marker_only_of_young_claims(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_take_clears_the_marker_only_of_young_claims_postgres() {
    if let Some(store) = TestStore::pg().await {
        the_take_clears_the_marker_only_of_young_claims(store).await;
    }
}
