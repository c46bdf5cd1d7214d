//! The outcome relay's own CPU per event: the outbox is filled with `BENCH_RELAY_N` events
//! (default 20000) on PostgreSQL, then one relay (the same `Relay` and `AmqpSink` as
//! `claimd run`, on a runtime worker, rounds back to back as when the backlog is full)
//! publishes them to RabbitMQ
//! on 127.0.0.1 until none is left. Prints, per run: events, wall time, events/s, and this
//! process's CPU per event (user + system from `/proc/self/stat`, read after the outbox is
//! filled and after the last event is marked, so the setup is not counted). PostgreSQL's and
//! the broker's CPU are their own processes' and are not counted.
//!
//! `cargo bench --features full --bench relay` (env: `BENCH_PG` admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `BENCH_AMQP`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`; `BENCH_RELAY_N`; `BENCH_RELAY_RUNS`, default 3).

mod support;

use claimd::config::OutcomesConfig;
use claimd::edge::outcome_relay::amqp::AmqpSink;
use claimd::edge::outcome_relay::{Relay, Sink};
use claimd::engine::metrics::Metrics;
use claimd::store::postgres::PgStore;
use claimd::store::{ClaimStore, Store};
use lapin::options::{
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use std::sync::Arc;
use std::time::Instant;
use support::env_or;

/// This process's CPU seconds so far (user + system, every thread, in 10 ms ticks).
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name is in parentheses and may hold spaces: split after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // utime and stime are fields 14 and 15 of stat(5): 11 and 12 after the state (field 3).
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
}

#[tokio::main]
async fn main() {
    let n: i64 = env_or("BENCH_RELAY_N", 20_000);
    let runs: usize = env_or("BENCH_RELAY_RUNS", 3);
    let amqp: String = env_or(
        "BENCH_AMQP",
        "amqp://guest:guest@127.0.0.1:5672/%2f".to_string(),
    );
    let exchange = "claimd-bench-relay";
    let queue = format!("claimd-bench-relay-{}", std::process::id());

    let db = support::BenchDb::create("relay").await;
    let pg = PgStore::connect(&db.url, 4).await.unwrap();
    pg.migrate().await.unwrap();
    let pool = pg.pool().clone();
    let store: Store = Arc::new(pg);

    // A queue bound to every event, so each publish is routed (they are `mandatory`).
    let setup = Connection::connect(&amqp, ConnectionProperties::default())
        .await
        .expect("RabbitMQ on BENCH_AMQP");
    let ch = setup.create_channel().await.unwrap();
    ch.exchange_declare(
        exchange.into(),
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        queue.as_str().into(),
        exchange.into(),
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();

    let config: OutcomesConfig = toml::from_str(&format!(
        "kind = \"amqp\"\nurl = {amqp:?}\nexchange = {exchange:?}\n"
    ))
    .unwrap();
    let sink: Arc<dyn Sink> = Arc::new(AmqpSink::new(&config, "bench"));
    let relay = Arc::new(Relay {
        store: store.clone(),
        consumer: "payments".into(),
        destination: "amqp".into(),
        adopts: false,
        owner: "bench".into(),
        config: config.clone(),
        sink,
        metrics: Arc::new(Metrics::new()),
        traces: claimd::engine::traces::Traces::off(),
        held_until: std::sync::Mutex::new(None),
        recovery: std::sync::Mutex::new(Default::default()),
    });

    println!(
        "outcome relay, PostgreSQL -> RabbitMQ, batch {}, load {:.2}",
        config.batch,
        support::load1()
    );
    println!(
        "{:>8} {:>9} {:>9} {:>16}",
        "events", "wall s", "events/s", "relay CPU ms/ev"
    );
    for run in 0..runs {
        // Events like a payment's: a short provider answer, each of its own claim.
        sqlx::query(
            "INSERT INTO outcome_events (claim_id, consumer, tenant, message_id, idem_key, state, \
               attempt, provider_status, provider_id, provider_response, actor, action, \
               destination, claim_version) \
             SELECT g, 'payments', '', 'order-' || g, 'payments::order-' || g, 'completed', 1, \
               200, 'pi_' || g, \
               '{\"id\":\"pi_' || g || '\",\"status\":\"succeeded\",\"amount\":1250,\"currency\":\"eur\"}', \
               'bench-1', 'perform', 'amqp', 2 \
             FROM generate_series($1, $2) g",
        )
        .bind(run as i64 * n + 1)
        .bind((run as i64 + 1) * n)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("ANALYZE outcome_events")
            .execute(&pool)
            .await
            .unwrap();

        let cpu0 = cpu_s();
        let t = Instant::now();
        // On a runtime worker, as `claimd run` spawns it (not on the bench's main thread).
        let rounds = relay.clone();
        let taken = tokio::spawn(async move {
            let mut taken = 0usize;
            loop {
                let k = rounds.round().await.expect("a round");
                if k == 0 {
                    return taken;
                }
                taken += k;
            }
        })
        .await
        .unwrap();
        let wall = t.elapsed().as_secs_f64();
        let cpu = cpu_s() - cpu0;

        let unsent: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outcome_events WHERE sent_utc IS NULL")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(unsent, 0, "every event sent");
        assert_eq!(taken as i64, n, "each event taken once");
        // The queue's count may trail the confirms by a moment.
        let mut queued = 0;
        for _ in 0..50 {
            let q = ch
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            queued = i64::from(q.message_count());
            if queued >= n {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(queued, n, "one message per event");
        ch.queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
            .await
            .unwrap();
        println!(
            "{:>8} {:>9.2} {:>9.0} {:>16.4}",
            n,
            wall,
            n as f64 / wall,
            cpu * 1000.0 / n as f64
        );
    }
    let _ = ch
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    drop(relay);
    db.drop_now().await;
}
