//! What flow control per key costs (docs/performance.md, "Flow control per key"): HTTP intake
//! → the sandbox provider on loopback, on PostgreSQL, one row per configuration:
//!
//! - `plain`: none of it configured (the path every other bench measures);
//! - `order_key, a line per message`: every message its own order (`{order_id}` distinct):
//!   the cost of the line itself (committed waiting, taken by the pickup under the line lock);
//! - `order_key, 100 lines`: 100 orders, so messages of one order wait for each other;
//! - `fairness = "tenant"`: 10 tenants (intake claims are driven at once: this shows the
//!   configuration costs intake nothing);
//! - `rate_limit_key`: 100 accounts, a ceiling of 1,000/s each (never reached: the cost of
//!   the per-key pace itself).
//!
//! Each row reports messages a second, the time from receipt to settle (p50 / p99) and the
//! PostgreSQL transactions per message (`pg_stat_database.xact_commit`).
//!
//! `cargo bench --features full --bench flow` (env: `BENCH_PG` admin URL; `BENCH_N` messages per row [3000];
//! `BENCH_CONCURRENCY` clients at a time [32]).

mod support;

use claimd::config::Config;
use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use claimd::service::app::App;
use sqlx::Connection;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use support::{BenchDb, env_or, load1};

/// One configuration under test.
struct Row {
    name: &'static str,
    /// Extra `[[consumers]]` keys.
    consumer: &'static str,
    /// Extra `[consumers.effect]` keys.
    effect: &'static str,
    /// The order id of message `i`.
    order: fn(usize) -> String,
    /// The tenant of message `i`.
    tenant: fn(usize) -> String,
}

const ROWS: [Row; 5] = [
    Row {
        name: "plain",
        consumer: "",
        effect: "",
        order: |i| format!("o-{i}"),
        tenant: |_| String::new(),
    },
    Row {
        name: "order_key, a line per message",
        consumer: "order_key = \"{order_id}\"",
        effect: "",
        order: |i| format!("o-{i}"),
        tenant: |_| String::new(),
    },
    Row {
        name: "order_key, 100 lines",
        consumer: "order_key = \"{order_id}\"",
        effect: "",
        order: |i| format!("o-{}", i % 100),
        tenant: |_| String::new(),
    },
    Row {
        name: "fairness = \"tenant\", 10 tenants",
        consumer: "fairness = \"tenant\"",
        effect: "",
        order: |i| format!("o-{i}"),
        tenant: |i| format!("t{}", i % 10),
    },
    Row {
        name: "rate_limit_key, 100 accounts",
        consumer: "",
        effect: "rate_limit = \"1000/s\"\nrate_limit_key = \"{account}\"",
        order: |i| format!("o-{i}"),
        tenant: |_| String::new(),
    },
];

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn xacts(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT xact_commit::bigint FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

async fn run_row(row: &Row, n: usize, concurrency: usize) -> String {
    let db = BenchDb::create("flow").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    let sandbox = Sandbox::new(SandboxOptions::default());
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let served = sandbox.clone();
    tokio::spawn(async move {
        let _ = served
            .serve(listener, async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            })
            .await;
    });
    let toml = format!(
        r#"
[store]
url = "{url}"
max_connections = 16
[http]
listen = "127.0.0.1:0"
intake_wait = "5s"
[sweeper]
schedule = "*/10 * * * * *"
[[consumers]]
name = "payments"
source = "http"
concurrency = 64
lease = "60s"
{consumer}
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "10s"
status_url = "{provider}/v1/effects/{{key}}"
{effect}
"#,
        url = db.url,
        consumer = row.consumer,
        effect = row.effect,
    );
    let cfg = Config::from_toml(&toml, Path::new("bench.toml"), std::env::vars())
        .expect("config")
        .config;
    let running = claimd::service::run::start(App::open(cfg, true).await.expect("open"))
        .await
        .expect("start");
    let intake = Arc::new(format!("http://{}/v1/messages/payments", running.http_addr));
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let before = xacts(&mut admin).await;
    let http = reqwest::Client::new();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (next, http, intake) = (next.clone(), http.clone(), intake.clone());
        let (order, tenant) = (row.order, row.tenant);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let body = format!(
                    r#"{{"order_id":"{}","account":"acct_{}","amount_cents":{i}}}"#,
                    order(i),
                    i % 100
                );
                loop {
                    let mut req = http
                        .post(intake.as_str())
                        .header("Idempotency-Key", format!("m-{i}"))
                        .header("Content-Type", "application/json")
                        .body(body.clone());
                    let t = tenant(i);
                    if !t.is_empty() {
                        req = req.header("Tenant-Id", t);
                    }
                    let r = req.send().await.expect("intake answers");
                    if r.status().is_success() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    loop {
        let done: i64 =
            sqlx::query_scalar("SELECT count(*) FROM claims WHERE processed_utc IS NOT NULL")
                .fetch_one(&mut admin)
                .await
                .unwrap();
        if done as usize >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wall = started.elapsed().as_secs_f64();
    let mut settled: Vec<f64> = sqlx::query_scalar(
        "SELECT (EXTRACT(EPOCH FROM processed_utc - received_utc) * 1000)::float8 FROM claims",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    settled.sort_by(f64::total_cmp);
    running.shutdown(Duration::from_secs(5)).await;
    let _ = stop_tx.send(true);
    // A backend reports its transactions when it exits: count once the others have gone.
    for _ in 0..200 {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut admin)
        .await
        .unwrap();
        if others == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = xacts(&mut admin).await;
    drop(admin);
    db.drop_now().await;
    format!(
        "| {} | {n} | {:.0} | {:.1} / {:.1} | {:.2} | {:.2} |",
        row.name,
        n as f64 / wall,
        percentile(&settled, 0.5),
        percentile(&settled, 0.99),
        (after - before) as f64 / n as f64,
        load1(),
    )
}

#[tokio::main]
async fn main() {
    let n: usize = env_or("BENCH_N", 3000);
    let concurrency: usize = env_or("BENCH_CONCURRENCY", 32);
    println!(
        "PostgreSQL; HTTP intake, {n} messages per row, {concurrency} clients at a time; provider on loopback, no added latency\n"
    );
    println!(
        "| configuration | messages | msgs/s | receipt → settled p50 / p99 ms | PG xacts/msg | load1 |"
    );
    println!("|---|---|---|---|---|---|");
    for row in &ROWS {
        println!("{}", run_row(row, n, concurrency).await);
    }
}
