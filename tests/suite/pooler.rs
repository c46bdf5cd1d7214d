//! claimd through PgBouncer in transaction mode (`[store] pooler = "transaction"`,
//! docs/postgresql.md, "Poolers"): Debian's PgBouncer 1.18, started by each test with a few
//! server connections that every client shares. Intake to settle with duplicates, enqueued
//! claims found by polling, retention one instance at a time, migrations refused through the
//! pooler, workers restarted while another process uses the same server connections (claimd
//! run used to exit at start: "prepared statement sqlx_s_1 already exists"), and a run with
//! workers killed mid-load that loses and doubles nothing.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use claimd::store::RetentionWindows;
use claimd::store::pooler::Pooler;
use claimd::{Enqueue, enqueue};
use common::pgbouncer::Bouncer;
use common::*;
use sqlx::Connection;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A fresh database, migrated directly (migrations never go through the pooler), a PgBouncer
/// with `pool_size` server connections in front of it, and the database's URL through it.
async fn setup(pool_size: u32) -> Option<(PgDb, Bouncer, String)> {
    let db = PgDb::create().await?;
    let bouncer = Bouncer::start(pool_size)?;
    let direct = claimd::store::open(&db.url, 2).await.unwrap();
    direct.migrate().await.unwrap();
    let url = bouncer.url(&db.url);
    Some((db, bouncer, url))
}

/// A configuration on `url` through the pooler.
fn pooled_toml(url: &str, consumers: &str) -> String {
    config_toml(url, consumers).replace(
        "max_connections = 8\n",
        "max_connections = 8\npooler = \"transaction\"\n",
    )
}

/// The store through the pooler, as an operator command opens it.
async fn pooled_store(url: &str) -> claimd::store::Store {
    claimd::store::open_through(url, 4, true, Pooler::Transaction)
        .await
        .unwrap()
}

async fn post(base: &str, id: &str, body: &str) -> reqwest::Response {
    client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", id)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// Whether every message `ids` names is `completed` (read through the pooler).
async fn all_completed(store: &claimd::store::Store, ids: &[String]) -> bool {
    for id in ids {
        match store.get("payments", "", id).await {
            Ok(Some(c)) if c.state == ClaimState::Completed => {}
            _ => return false,
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intake_duplicates_and_settles_through_pgbouncer() {
    let Some((_db, bouncer, url)) = setup(3).await else {
        return;
    };
    let (sb, provider) = sandbox(SandboxOptions::default()).await;
    let consumer = consumer_toml("payments", &provider, "key = \"{message_id}\"");
    let running = start(&pooled_toml(&url, &consumer)).await;
    let base = format!("http://{}", running.http_addr);
    let ids: Vec<String> = (0..200).map(|i| format!("p{i}")).collect();
    // Concurrent posts: the group commit's multi-row statements run through the pooler too.
    let posts = ids.iter().map(|id| {
        let (base, id) = (base.clone(), id.clone());
        tokio::spawn(async move { post(&base, &id, r#"{"amount": 100}"#).await.status() })
    });
    for p in posts {
        assert_eq!(p.await.unwrap().as_u16(), 202);
    }
    for id in ids.iter().take(20) {
        let r = post(&base, id, r#"{"amount": 100}"#).await;
        assert_eq!(r.status().as_u16(), 200);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["duplicate"], true);
    }
    let r = post(&base, "p0", r#"{"amount": 999}"#).await;
    assert_eq!(
        r.status().as_u16(),
        422,
        "a changed body under the same key"
    );
    let store = pooled_store(&url).await;
    assert!(
        eventually(Duration::from_secs(20), || all_completed(&store, &ids)).await,
        "not every claim completed through the pooler"
    );
    let effects = sb.effects();
    assert_eq!(effects.len(), ids.len());
    assert!(effects.iter().all(|e| e.applied == 1));
    let readyz = get_json(&format!("{base}/readyz")).await;
    assert_eq!(readyz["ready"], true, "{readyz}");
    running.shutdown(Duration::from_secs(2)).await;
    assert!(
        !bouncer.log().contains("prepared statement"),
        "{}",
        bouncer.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueued_claims_are_found_by_polling_through_pgbouncer() {
    let Some((db, _bouncer, url)) = setup(3).await else {
        return;
    };
    let (sb, provider) = sandbox(SandboxOptions::default()).await;
    let consumer = consumer_toml("payments", &provider, "key = \"{message_id}\"");
    let running = start(&pooled_toml(&url, &consumer)).await;
    // The producer goes through the pooler too, one transaction per enqueue.
    let mut producer = sqlx::PgConnection::connect(&url).await.unwrap();
    let ids: Vec<String> = (0..50).map(|i| format!("e{i}")).collect();
    for id in &ids {
        let mut tx = producer.begin().await.unwrap();
        enqueue(&mut *tx, &Enqueue::new("payments", id, br#"{"amount": 5}"#))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let store = pooled_store(&url).await;
    assert!(
        eventually(Duration::from_secs(15), || all_completed(&store, &ids)).await,
        "enqueued claims were not taken through the pooler"
    );
    assert_eq!(sb.effects().len(), ids.len());
    // Poll-only: no session of the database listens.
    let mut direct = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let listening: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(&mut direct)
    .await
    .unwrap();
    assert_eq!(listening, 0);
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_one_instance_at_a_time_through_pgbouncer() {
    let Some((db, _bouncer, url)) = setup(3).await else {
        return;
    };
    let mut direct = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query(
        "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
         state, updated_utc) \
         SELECT 'payments', '', 'm' || g, 'm' || g, 'f', '\\x00', 'completed', \
                now() - interval '30 days' FROM generate_series(1, 100000) g",
    )
    .execute(&mut direct)
    .await
    .unwrap();
    let (a, b) = (pooled_store(&url).await, pooled_store(&url).await);
    let keep = Duration::from_secs(86_400);
    // A prune in small batches holds the lock for a while; meanwhile the other instance skips.
    let pruner = a.clone();
    let long = tokio::spawn(async move {
        pruner
            .prune(&RetentionWindows::uniform(keep), 10, false)
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let skipped = b
        .prune(&RetentionWindows::uniform(keep), 1000, false)
        .await
        .unwrap();
    assert!(skipped.skipped_locked, "two instances pruned at once");
    // Cut off mid-prune (its task dropped): the lock goes with its transaction.
    long.abort();
    let _ = long.await;
    let mut done = None;
    for _ in 0..50 {
        let r = b
            .prune(&RetentionWindows::uniform(keep), 50_000, false)
            .await
            .unwrap();
        if !r.skipped_locked {
            done = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let done = done.expect("the retention lock outlived the prune that was cut off");
    assert!(done.deleted > 0);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM claims")
        .fetch_one(&mut direct)
        .await
        .unwrap();
    assert_eq!(left, 0);
    // No session advisory lock is left behind on any server connection.
    let advisory: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(&mut direct)
    .await
    .unwrap();
    assert_eq!(advisory, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_migrations_are_not_applied_through_pgbouncer() {
    let Some(db) = PgDb::create().await else {
        return;
    };
    let Some(bouncer) = Bouncer::start(2) else {
        return;
    };
    let url = bouncer.url(&db.url);
    let store = pooled_store(&url).await;
    let e = store.migrate().await.unwrap_err();
    assert!(matches!(e, claimd::StoreError::PendingBehindPooler), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("claimd.toml");
    std::fs::write(&config, pooled_toml(&url, "")).unwrap();
    let (code, _, err) = cli(&["migrate", "--config", config.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(
        err.contains("run `claimd migrate` against PostgreSQL itself"),
        "{err}"
    );
    // Directly, and the pooled store then finds nothing to do.
    let (code, _, err) = cli_with_env(
        &["migrate", "--config", config.to_str().unwrap()],
        &[
            ("CLAIMD__STORE__URL", &db.url),
            ("CLAIMD__STORE__POOLER", "none"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    store.migrate().await.unwrap();
}

/// A `claimd run` process through the pooler, on its own port, logging to `dir`.
async fn spawn_worker(dir: &Path, name: &str, toml: &str) -> (Worker, std::path::PathBuf, u16) {
    let port = free_port();
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        toml.replace("127.0.0.1:0", &format!("127.0.0.1:{port}")),
    )
    .unwrap();
    let log = dir.join(format!("{name}.log"));
    let w = Worker::spawn(&config, port, &log).await;
    (w, config, port)
}

/// The regression of the issue: with two server connections shared by every client, a
/// second worker started (and restarted) while the first one runs must start, take
/// messages and settle them; each restart meets server connections on which the other
/// process's statements ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_restart_while_another_uses_the_same_pgbouncer() {
    let Some((_db, bouncer, url)) = setup(2).await else {
        return;
    };
    let (sb, provider) = sandbox(SandboxOptions::default()).await;
    let consumer = consumer_toml("payments", &provider, "key = \"{message_id}\"");
    let toml = pooled_toml(&url, &consumer);
    let dir = tempfile::tempdir().unwrap();
    let (a, _, _) = spawn_worker(dir.path(), "a", &toml).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let id = format!("a{i}");
        assert_eq!(post(&a.base, &id, "{}").await.status().as_u16(), 202);
        ids.push(id);
    }
    let (mut b, config, port) = spawn_worker(dir.path(), "b", &toml).await;
    for round in 0..4 {
        for i in 0..20 {
            let id = format!("b{round}-{i}");
            let r = post(&b.base, &id, "{}").await;
            assert_eq!(r.status().as_u16(), 202, "round {round}");
            ids.push(id);
            let id = format!("a{round}-{i}");
            assert_eq!(post(&a.base, &id, "{}").await.status().as_u16(), 202);
            ids.push(id);
        }
        b.kill();
        b = Worker::spawn(&config, port, &dir.path().join("b.log")).await;
        let ready = eventually(Duration::from_secs(10), || {
            let url = format!("{}/readyz", b.base);
            async move {
                client()
                    .get(url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
            }
        })
        .await;
        let log = std::fs::read_to_string(dir.path().join("b.log")).unwrap_or_default();
        assert!(
            ready,
            "worker b did not become ready after restart {round}: {log}"
        );
    }
    let store = pooled_store(&url).await;
    assert!(
        eventually(Duration::from_secs(30), || all_completed(&store, &ids)).await,
        "not every claim completed"
    );
    assert_eq!(sb.effects().len(), ids.len());
    for name in ["a.log", "b.log"] {
        let log = std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
        assert!(!log.contains("prepared statement"), "{name}: {log}");
    }
    assert!(
        !bouncer.log().contains("prepared statement"),
        "{}",
        bouncer.log()
    );
}

/// `n` messages posted by 16 clients to two workers through the pooler, each worker killed
/// (SIGKILL) and restarted once mid-run; a post that finds its worker gone goes to the other
/// (the message comes again, as a client's retry). Every message ends `completed`, applied
/// once at a provider that ignores idempotency keys.
async fn run_with_kills(n: usize) {
    let Some((db, _bouncer, url)) = setup(4).await else {
        return;
    };
    let (sb, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(10),
        ignore_keys: true,
        ..Default::default()
    })
    .await;
    let consumer = consumer_toml(
        "payments",
        &provider,
        "key = \"{message_id}\"\nlease = \"4s\"\nconcurrency = 64",
    )
    .replace("timeout = \"1s\"", "timeout = \"3s\"");
    let toml = pooled_toml(&url, &consumer);
    let dir = tempfile::tempdir().unwrap();
    let (a, config_a, port_a) = spawn_worker(dir.path(), "a", &toml).await;
    let (b, config_b, port_b) = spawn_worker(dir.path(), "b", &toml).await;
    let bases = Arc::new([a.base.clone(), b.base.clone()]);
    let workers = Arc::new(tokio::sync::Mutex::new([Some(a), Some(b)]));
    let next = Arc::new(AtomicUsize::new(0));
    let started = std::time::Instant::now();
    let clients: Vec<_> = (0..16)
        .map(|c| {
            let (bases, next) = (bases.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let id = format!("m{i}");
                    let mut to = (c + i) % 2;
                    loop {
                        let sent = client()
                            .post(format!("{}/v1/messages/payments", bases[to]))
                            .header("Idempotency-Key", &id)
                            .body(format!("{{\"n\":{i}}}"))
                            .send()
                            .await;
                        match sent.map(|r| r.status().as_u16()) {
                            Ok(202 | 200) => break,
                            // Gone, or refusing while it starts: the other worker.
                            _ => {
                                to = 1 - to;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    // Kill each worker once, a third and two thirds of the way, and start it again.
    for (k, (config, port)) in [(config_a, port_a), (config_b, port_b)].iter().enumerate() {
        while next.load(Ordering::Relaxed) < n * (k + 1) / 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let w = workers.lock().await[k].take().unwrap();
        w.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let name = if k == 0 { "a.log" } else { "b.log" };
        let w = Worker::spawn(config, *port, &dir.path().join(name)).await;
        workers.lock().await[k] = Some(w);
    }
    for c in clients {
        c.await.unwrap();
    }
    let posted = started.elapsed();
    let mut direct = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let done = eventually(Duration::from_secs(60), || {
        let url = db.url.clone();
        async move {
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            let open: i64 =
                sqlx::query_scalar("SELECT count(*) FROM claims WHERE state <> 'completed'")
                    .fetch_one(&mut c)
                    .await
                    .unwrap();
            open == 0
        }
    })
    .await;
    let (claims, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT message_id) FROM claims")
            .fetch_one(&mut direct)
            .await
            .unwrap();
    assert!(done, "claims left unfinished");
    assert_eq!(
        (claims, distinct),
        (n as i64, n as i64),
        "lost or doubled claims"
    );
    let effects = sb.effects();
    let doubled: Vec<_> = effects.iter().filter(|e| e.applied != 1).collect();
    assert!(doubled.is_empty(), "applied more than once: {doubled:?}");
    assert_eq!(effects.len(), n, "effects missing");
    eprintln!(
        "pooler run: {n} messages posted in {:.1} s through PgBouncer with two kills; \
         0 lost, 0 doubled",
        posted.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_kills_through_pgbouncer_loses_and_doubles_nothing() {
    run_with_kills(2_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: 10,000 messages through PgBouncer with two workers killed"]
async fn ten_thousand_messages_with_kills_through_pgbouncer() {
    run_with_kills(10_000).await;
}
