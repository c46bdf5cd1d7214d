//! Priorities (docs/flow-control.md, "Priorities"): a backlog of low-priority enqueued claims
//! does not hold back the high ones enqueued after it, and the aged share bounds a low claim's
//! wait (the k-th oldest is taken within the pickup's first 8·k claims) even while high ones
//! keep coming; a priority out of range is refused at every way in.

use crate::common;

use claimd::provider::sandbox::SandboxOptions;
use claimd::service::run::Running;
use claimd::{Enqueue, EnqueueError, enqueue};
use common::*;
use sqlx::Connection;
use std::str::FromStr;
use std::time::Duration;

/// A producer's own pool on the worker's database.
enum Producer {
    Pg(sqlx::PgPool),
    Lite(sqlx::SqlitePool),
}

/// A claim's times, in milliseconds on the database's clock.
#[derive(Debug, Clone)]
struct Times {
    id: i64,
    high: bool,
    attempt: i64,
    started: f64,
    processed: f64,
}

impl Producer {
    async fn open(store: &TestStore) -> Producer {
        match store {
            TestStore::Pg(db) => Producer::Pg(sqlx::PgPool::connect(&db.url).await.unwrap()),
            TestStore::Sqlite(_) => {
                let options = sqlx::sqlite::SqliteConnectOptions::from_str(&store.url())
                    .unwrap()
                    .busy_timeout(Duration::from_secs(30));
                Producer::Lite(sqlx::SqlitePool::connect_with(options).await.unwrap())
            }
        }
    }

    /// One committed transaction enqueueing `messages` (id, priority).
    async fn commit(&self, messages: &[(String, i16)]) -> Result<(), EnqueueError> {
        let body = br#"{"amount":500}"#;
        match self {
            Producer::Pg(pool) => {
                let mut tx = pool.begin().await?;
                for (id, p) in messages {
                    enqueue(&mut tx, &Enqueue::new("payments", id, body).priority(*p)).await?;
                }
                tx.commit().await?;
            }
            Producer::Lite(pool) => {
                let mut conn = pool.acquire().await?;
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                for (id, p) in messages {
                    enqueue(&mut tx, &Enqueue::new("payments", id, body).priority(*p)).await?;
                }
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// Every claim's times, by id; `processed` is infinite while it is not done.
    async fn times(&self) -> Vec<Times> {
        use sqlx::Row;
        let pg = "SELECT id, message_id, attempt::bigint AS attempt, \
            (EXTRACT(EPOCH FROM started_utc) * 1000)::float8 AS started, \
            (EXTRACT(EPOCH FROM processed_utc) * 1000)::float8 AS processed \
            FROM claims WHERE state <> 'started' OR lease_owner IS NOT NULL ORDER BY id";
        let lite = "SELECT id, message_id, attempt, CAST(started_utc AS REAL) AS started, \
            CAST(processed_utc AS REAL) AS processed \
            FROM claims WHERE state <> 'started' OR lease_owner IS NOT NULL ORDER BY id";
        macro_rules! read {
            ($rows:expr) => {
                $rows
                    .iter()
                    .map(|r| Times {
                        id: r.get("id"),
                        high: r.get::<String, _>("message_id").starts_with("high-"),
                        attempt: r.get("attempt"),
                        started: r.get("started"),
                        processed: r
                            .get::<Option<f64>, _>("processed")
                            .unwrap_or(f64::INFINITY),
                    })
                    .collect()
            };
        }
        match self {
            Producer::Pg(p) => read!(sqlx::query(pg).fetch_all(p).await.unwrap()),
            Producer::Lite(p) => read!(sqlx::query(lite).fetch_all(p).await.unwrap()),
        }
    }

    async fn done(&self) -> i64 {
        let sql = "SELECT count(*) FROM claims WHERE state = 'completed'";
        match self {
            Producer::Pg(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
            Producer::Lite(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
        }
    }
}

/// The worker's configuration: one consumer, `payments`, on the sandbox.
async fn config(store: &TestStore, concurrency: usize, latency: Duration) -> String {
    let (sandbox, provider) = sandbox(SandboxOptions {
        latency,
        ..Default::default()
    })
    .await;
    // The sandbox lives as long as the test: its server task keeps running.
    std::mem::forget(sandbox);
    let extra = format!("concurrency = {concurrency}");
    config_toml(&store.url(), &consumer_toml("payments", &provider, &extra))
}

/// A worker started and stopped: the consumer is registered for producers, nothing runs.
async fn registered(toml: &str) {
    start(toml).await.shutdown(Duration::from_secs(5)).await;
}

async fn wait_all_done(producer: &Producer, n: i64, within: Duration) {
    assert!(
        eventually(within, || async { producer.done().await == n }).await,
        "all {n} claims complete (done: {})",
        producer.done().await
    );
}

/// `lows` low-priority claims (priority -10), then `highs` high ones (priority 10), enqueued
/// while no worker runs; a worker with 16 call slots then drains them.
async fn highs_go_before_a_backlog(store: TestStore, lows: usize, highs: usize) {
    let toml = config(&store, 16, Duration::ZERO).await;
    registered(&toml).await;
    let producer = Producer::open(&store).await;
    let low: Vec<(String, i16)> = (0..lows).map(|i| (format!("low-{i:05}"), -10)).collect();
    for chunk in low.chunks(2_500) {
        producer.commit(chunk).await.unwrap();
    }
    let high: Vec<(String, i16)> = (0..highs).map(|i| (format!("high-{i:03}"), 10)).collect();
    producer.commit(&high).await.unwrap();
    let began = std::time::Instant::now();
    let running: Running = start(&toml).await;
    wait_all_done(&producer, (lows + highs) as i64, Duration::from_secs(300)).await;
    let drained = began.elapsed();
    running.shutdown(Duration::from_secs(5)).await;

    let times = producer.times().await;
    let first_take = times
        .iter()
        .map(|t| t.started)
        .fold(f64::INFINITY, f64::min);
    let last_high = times
        .iter()
        .filter(|t| t.high)
        .map(|t| t.processed)
        .fold(0.0, f64::max);
    let lows_before = times
        .iter()
        .filter(|t| !t.high && t.processed < last_high)
        .count();
    let mut low_waits: Vec<f64> = times
        .iter()
        .filter(|t| !t.high)
        .map(|t| t.started - first_take)
        .collect();
    low_waits.sort_by(f64::total_cmp);
    let p99 = low_waits[(low_waits.len() * 99 / 100).min(low_waits.len() - 1)];
    let dialect = match store {
        TestStore::Pg(_) => "postgres",
        TestStore::Sqlite(_) => "sqlite",
    };
    println!(
        "{dialect}: {lows} low then {highs} high enqueued, drained in {drained:?}: the last high \
         completed {:.0} ms after the first take, with {lows_before} of {lows} low ones done \
         before it; the low ones' wait for a worker (from the first take): p50 {:.0} ms, p99 \
         {p99:.0} ms, max {:.0} ms",
        last_high - first_take,
        low_waits[low_waits.len() / 2],
        low_waits[low_waits.len() - 1],
    );
    assert!(
        lows_before < (lows / 10).max(100),
        "the high claims complete before the {}th low one ({lows_before} low ones were first)",
        (lows / 10).max(100)
    );
    // The aged share: the k-th oldest low claim is taken within the pickup's first 8·k claims
    // (the high ones, newer, are never ahead of it in age).
    let mut starts: Vec<f64> = times.iter().map(|t| t.started).collect();
    starts.sort_by(f64::total_cmp);
    for (k, t) in times.iter().filter(|t| !t.high).enumerate() {
        if t.attempt != 1 {
            continue;
        }
        let before = starts.partition_point(|s| *s < t.started);
        assert!(
            before <= 8 * (k + 1),
            "low claim {} (the {}th oldest) was taken after {before} claims; the aged share \
             bounds it at {}",
            t.id,
            k + 1,
            8 * (k + 1)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_low_then_twenty_high_the_high_go_first_sqlite() {
    highs_go_before_a_backlog(TestStore::sqlite(), 1_000, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_low_then_a_hundred_high_the_high_go_first_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    highs_go_before_a_backlog(store, 10_000, 100).await;
}

/// One old low claim behind a stream of high ones that never lets up: the aged share takes it
/// as soon as it is the oldest waiting, while newer high ones still wait.
async fn an_old_low_claim_is_not_starved(store: TestStore) {
    let toml = config(&store, 2, Duration::from_millis(20)).await;
    registered(&toml).await;
    let producer = Producer::open(&store).await;
    let early: Vec<(String, i16)> = (0..40).map(|i| (format!("high-a{i:03}"), 50)).collect();
    producer.commit(&early).await.unwrap();
    producer.commit(&[("low-old".into(), -50)]).await.unwrap();
    let running = start(&toml).await;
    // High ones keep coming faster than two slots at 20 ms a call take them.
    let mut batch = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < deadline {
        let more: Vec<(String, i16)> = (0..10)
            .map(|i| (format!("high-b{batch:03}-{i}"), 50))
            .collect();
        producer.commit(&more).await.unwrap();
        batch += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let times = producer.times().await;
    running.shutdown(Duration::from_secs(5)).await;
    let low = times
        .iter()
        .find(|t| !t.high)
        .expect("the low claim was taken");
    assert!(low.processed.is_finite(), "the low claim completed");
    let newer_high = times.iter().filter(|t| t.high && t.id > low.id);
    let taken_before = newer_high
        .clone()
        .filter(|t| t.started < low.started)
        .count();
    let enqueued_after = batch * 10;
    let high_done_after = times
        .iter()
        .filter(|t| t.high && t.processed > low.processed)
        .count();
    println!(
        "old low claim behind 40 older high ones and {enqueued_after} newer ones (10 every 50 ms): \
         taken after {taken_before} newer high ones; {high_done_after} high ones completed after it"
    );
    assert!(
        taken_before < enqueued_after / 2,
        "the low claim went before most newer high ones ({taken_before} of {enqueued_after} first)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_low_claim_is_not_starved_by_a_stream_of_high_ones_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    an_old_low_claim_is_not_starved(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_out_of_range_is_refused_by_enqueue() {
    for store in [TestStore::sqlite()]
        .into_iter()
        .chain(TestStore::pg().await)
    {
        let toml = config(&store, 2, Duration::ZERO).await;
        registered(&toml).await;
        let producer = Producer::open(&store).await;
        let err = producer
            .commit(&[("too-high".into(), 101)])
            .await
            .unwrap_err();
        assert!(
            matches!(err, EnqueueError::BadPriority(_)),
            "{err:?} is a bad priority"
        );
        assert_eq!(
            err.to_string(),
            "priority \"101\" is not an integer from -100 to 100"
        );
        producer.commit(&[("in-range".into(), -100)]).await.unwrap();
        if let Producer::Pg(pool) = &producer {
            // The SQL function other languages call: the priority is a last argument with a
            // default, so a call written before it still works; out of range is CD012.
            let old: (i64, bool) = sqlx::query_as(
                "SELECT id, created FROM claimd.enqueue_bytes('payments', 'old-call', \
                 convert_to('{}', 'UTF8'), '', 'application/json')",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            assert!(old.1);
            let id: i64 = sqlx::query_scalar(
                "SELECT id FROM claimd.enqueue('payments', 'named', '{}'::jsonb, priority => 7)",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            let named: i16 = sqlx::query_scalar("SELECT priority FROM claims WHERE id = $1")
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(named, 7);
            let refused = sqlx::query(
                "SELECT * FROM claimd.enqueue_bytes('payments', 'bad', convert_to('{}', 'UTF8'), \
                 '', 'application/json', 500)",
            )
            .execute(pool)
            .await
            .unwrap_err();
            let db = refused.as_database_error().unwrap();
            assert_eq!(db.code().as_deref(), Some("CD012"));
            assert_eq!(
                db.message(),
                "priority 500 is not an integer from -100 to 100"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_message_priority_header_is_stored_and_checked() {
    let store = TestStore::sqlite();
    let toml = config(&store, 2, Duration::ZERO).await;
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let post = |id: &'static str, priority: &'static str| {
        client()
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", id)
            .header("Message-Priority", priority)
            .json(&serde_json::json!({ "amount_cents": 100 }))
            .send()
    };
    for bad in ["101", "urgent", "-1000", "1.5"] {
        let answer = post("refused", bad).await.unwrap();
        assert_eq!(answer.status(), 400, "Message-Priority: {bad}");
        let body = answer.text().await.unwrap();
        assert!(
            body.contains("the Message-Priority header: priority")
                && body.contains("is not an integer from -100 to 100"),
            "{body}"
        );
    }
    let answer = post("urgent-payout", "90").await.unwrap();
    assert_eq!(answer.status(), 202);
    let producer = Producer::open(&store).await;
    let Producer::Lite(pool) = &producer else {
        unreachable!()
    };
    let stored: i64 =
        sqlx::query_scalar("SELECT priority FROM claims WHERE message_id = 'urgent-payout'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(stored, 90);
    let refused: i64 =
        sqlx::query_scalar("SELECT count(*) FROM claims WHERE message_id = 'refused'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(refused, 0);
    running.shutdown(Duration::from_secs(5)).await;
}
