//! The ways a message reaches claimd, side by side on one PostgreSQL: HTTP intake, enqueue in the
//! producer's own transaction (`claimd::enqueue`, which calls `claimd.enqueue_bytes`), and the
//! single-transaction inbox (`txn`: BEGIN; INSERT inbox ... ON CONFLICT DO NOTHING; the effect;
//! COMMIT, holding the connection through the effect), each ending in the same effect:
//!
//! - `http` effect: a call to the sandbox provider on loopback (no added latency);
//! - `sql` effect (`BENCH_SQL_EFFECT=1`, when the build has the `sql` effect kind): a business
//!   row written in the transaction that settles the claim.
//!
//! Every producer writes a business row of its own (an order) in the same transaction as its
//! enqueue, as a real producer would; the HTTP producer commits its order first, then posts.
//! Per row: messages/s from the first send to the last settled claim, the producer's latency
//! (p50/p99 ms: the POST's answer, or the commit), claim settled after received (p50/p99 ms,
//! `processed_utc - received_utc` from the store), and PostgreSQL transactions per message
//! (`pg_stat_database.xact_commit`, every client of the database), and PostgreSQL's CPU per
//! message (its postmaster and every backend, from `/proc`: the server must run on this
//! machine).
//!
//! `cargo bench --features full --bench producers` (env: `BENCH_PG` admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `BENCH_N` messages per row [5000];
//! `BENCH_CONCURRENCY` producers at a time [32]; `BENCH_POOL` claimd's pool [16];
//! `BENCH_ROWS` which rows, comma-separated [every row]; `BENCH_EXTRA_SQL` statements run on
//! each row's database after claimd migrated it: a schema variant to measure against, such as
//! indexes a migration dropped).

mod support;

use claimd::config::Config;
use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use claimd::service::app::App;
use claimd::{Enqueue, enqueue};
use sqlx::Connection;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{BenchDb, env_or, load1};

/// How messages arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Way {
    /// Commit the order, then POST it to claimd's HTTP intake.
    Http,
    /// Enqueue in the order's own transaction.
    Enqueue,
    /// The single-transaction inbox: the inbox row, the order and the effect in one
    /// transaction held open across the effect.
    Txn,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
struct Row {
    way: Way,
    /// `true`: the `sql` effect (a business row in the settle's transaction); `false`: `http`.
    sql: bool,
}

impl Row {
    fn name(self) -> String {
        let way = match self.way {
            Way::Http => "HTTP intake",
            Way::Enqueue => "enqueue in the producer's transaction",
            Way::Txn => "txn (single-transaction inbox)",
        };
        let effect = if self.sql {
            "database effect"
        } else {
            "HTTP effect"
        };
        format!("{way} → {effect}")
    }

    fn consumer(self) -> &'static str {
        if self.sql { "ledger" } else { "payments" }
    }
}

/// Milliseconds since the Unix epoch now.
fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

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

/// Runs one row on a fresh database; prints and returns its table line.
async fn run_row(row: Row, n: usize, concurrency: usize, pool_size: u32) -> String {
    let db = BenchDb::create("producers").await;
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
    let producers = sqlx::postgres::PgPoolOptions::new()
        .max_connections(concurrency as u32 + 2)
        .connect(&db.url)
        .await
        .unwrap();
    for ddl in [
        "CREATE TABLE bench_orders (id TEXT PRIMARY KEY, amount_cents BIGINT NOT NULL)",
        "CREATE TABLE bench_ledger (order_id TEXT NOT NULL, amount_cents BIGINT NOT NULL)",
        "CREATE TABLE bench_inbox (message_id TEXT PRIMARY KEY, processed BOOLEAN NOT NULL DEFAULT false)",
    ] {
        sqlx::query(ddl).execute(&producers).await.unwrap();
    }
    let toml = support::payments_toml(&db.url, &provider, pool_size, row.sql);
    let cfg = Config::from_toml(&toml, Path::new("bench.toml"), std::env::vars())
        .expect("config")
        .config;
    let running = claimd::service::run::start(App::open(cfg, true).await.expect("open"))
        .await
        .expect("start");
    let intake = format!(
        "http://{}/v1/messages/{}",
        running.http_addr,
        row.consumer()
    );
    let extra = env_or("BENCH_EXTRA_SQL", String::new());
    if !extra.is_empty() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(extra))
            .execute(&producers)
            .await
            .expect("BENCH_EXTRA_SQL");
    }
    let http = reqwest::Client::new();
    let postmaster = support::proc_cpu::postmaster(&db.url).await;
    let before = xacts(&mut producers.acquire().await.unwrap()).await;
    let cpu_before = support::proc_cpu::postgres_cpu(postmaster);
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (next, producers, http, intake) = (
            next.clone(),
            producers.clone(),
            http.clone(),
            intake.clone(),
        );
        let provider = format!("{provider}/v1/payments");
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut commits) = (Vec::new(), Vec::new());
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return (latencies, commits);
                }
                let id = format!("order-{i}");
                let body = format!(r#"{{"order_id":"{id}","amount_cents":{}}}"#, 100 + i);
                let t = Instant::now();
                produce(row, &producers, &http, &intake, &provider, &id, &body).await;
                latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                // When the producer saw its commit (or intake's answer) return, on the clock
                // PostgreSQL stamps `started_utc` with (one machine).
                commits.push((id, unix_ms()));
            }
        }));
    }
    let (mut produced, mut commits) = (Vec::new(), std::collections::HashMap::new());
    for t in tasks {
        let (latencies, committed) = t.await.unwrap();
        produced.extend(latencies);
        commits.extend(committed);
    }
    // Wait for every claim (or inbox row) to be settled.
    let settled_sql = if row.way == Way::Txn {
        "SELECT count(*) FROM bench_inbox WHERE processed"
    } else {
        "SELECT count(*) FROM claims WHERE processed_utc IS NOT NULL"
    };
    loop {
        let done: i64 = sqlx::query_scalar(settled_sql)
            .fetch_one(&producers)
            .await
            .unwrap();
        if done as usize >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wall = started.elapsed().as_secs_f64();
    let mut settled: Vec<f64> = if row.way == Way::Txn {
        produced.clone()
    } else {
        sqlx::query_scalar(
            "SELECT (EXTRACT(EPOCH FROM processed_utc - received_utc) * 1000)::float8 FROM claims",
        )
        .fetch_all(&producers)
        .await
        .unwrap()
    };
    // How long a claim waited to be taken (intake takes at once; the pickup after the commit).
    let mut taken: Vec<f64> = if row.way == Way::Txn {
        Vec::new()
    } else {
        sqlx::query_scalar(
            "SELECT (EXTRACT(EPOCH FROM started_utc - received_utc) * 1000)::float8 FROM claims",
        )
        .fetch_all(&producers)
        .await
        .unwrap()
    };
    // How long an enqueued claim waited for the pickup after its producer's commit returned:
    // the figure a producer sees (`taken` above also counts the producer's own transaction,
    // since `received_utc` is its start).
    let mut after_commit: Vec<f64> = if row.way == Way::Enqueue {
        let started: Vec<(String, f64)> = sqlx::query_as(
            "SELECT message_id, (EXTRACT(EPOCH FROM started_utc) * 1000)::float8 FROM claims",
        )
        .fetch_all(&producers)
        .await
        .unwrap();
        started
            .into_iter()
            .filter_map(|(id, at)| commits.get(&id).map(|c| at - c))
            .collect()
    } else {
        Vec::new()
    };
    produced.sort_by(f64::total_cmp);
    settled.sort_by(f64::total_cmp);
    taken.sort_by(f64::total_cmp);
    after_commit.sort_by(f64::total_cmp);
    if row.sql {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_ledger")
            .fetch_one(&producers)
            .await
            .unwrap();
        assert_eq!(rows as usize, n, "business rows = messages");
    }
    // A backend reports its transactions when it exits (or idles a while): count after every
    // other connection to the database has gone.
    running.shutdown(Duration::from_secs(5)).await;
    let _ = stop_tx.send(true);
    producers.close().await;
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
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
    let pg_cpu_ms = (support::proc_cpu::postgres_cpu(postmaster) - cpu_before) * 1000.0 / n as f64;
    let pair = |v: &[f64]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.1} / {:.1}", percentile(v, 0.5), percentile(v, 0.99))
        }
    };
    let line = format!(
        "| {} | {n} | {:.0} | {:.1} / {:.1} | {} | {} | {:.1} / {:.1} | {:.2} | {pg_cpu_ms:.2} | {:.2} |",
        row.name(),
        n as f64 / wall,
        percentile(&produced, 0.5),
        percentile(&produced, 0.99),
        pair(&taken),
        pair(&after_commit),
        percentile(&settled, 0.5),
        percentile(&settled, 0.99),
        (after - before) as f64 / n as f64,
        load1(),
    );
    drop(admin);
    db.drop_now().await;
    line
}

/// One producer's message, the way `row` says.
async fn produce(
    row: Row,
    pool: &sqlx::PgPool,
    http: &reqwest::Client,
    intake: &str,
    provider: &str,
    id: &str,
    body: &str,
) {
    let amount = 100_i64;
    match row.way {
        Way::Http => {
            sqlx::query("INSERT INTO bench_orders (id, amount_cents) VALUES ($1, $2)")
                .bind(id)
                .bind(amount)
                .execute(pool)
                .await
                .unwrap();
            let answer = http
                .post(intake)
                .header("Idempotency-Key", id)
                .header("Content-Type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert!(answer.status().is_success(), "{}", answer.status());
        }
        Way::Enqueue => {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("INSERT INTO bench_orders (id, amount_cents) VALUES ($1, $2)")
                .bind(id)
                .bind(amount)
                .execute(&mut *tx)
                .await
                .unwrap();
            enqueue(&mut tx, &Enqueue::new(row.consumer(), id, body.as_bytes()))
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        Way::Txn => {
            let mut conn = pool.acquire().await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            let new = sqlx::query(
                "INSERT INTO bench_inbox (message_id) VALUES ($1) ON CONFLICT DO NOTHING",
            )
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap()
            .rows_affected()
                == 1;
            if new {
                sqlx::query("INSERT INTO bench_orders (id, amount_cents) VALUES ($1, $2)")
                    .bind(id)
                    .bind(amount)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                if row.sql {
                    sqlx::query(
                        "INSERT INTO bench_ledger (order_id, amount_cents) VALUES ($1, $2)",
                    )
                    .bind(id)
                    .bind(amount)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                } else {
                    let answer = http
                        .post(provider)
                        .header("Idempotency-Key", id)
                        .header("Content-Type", "application/json")
                        .body(body.to_string())
                        .send()
                        .await
                        .unwrap();
                    assert!(answer.status().is_success(), "{}", answer.status());
                }
                sqlx::query("UPDATE bench_inbox SET processed = true WHERE message_id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
        }
    }
}

#[tokio::main]
async fn main() {
    let n: usize = env_or("BENCH_N", 5000);
    let concurrency: usize = env_or("BENCH_CONCURRENCY", 32);
    let pool: u32 = env_or("BENCH_POOL", 16);
    let sql_effect = std::env::var("BENCH_SQL_EFFECT").is_ok_and(|v| v == "1");
    let wanted: Vec<String> = env_or("BENCH_ROWS", String::new())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let mut rows = Vec::new();
    for sql in [false, true] {
        if sql && !sql_effect {
            continue;
        }
        for way in [Way::Http, Way::Enqueue, Way::Txn] {
            rows.push(Row { way, sql });
        }
    }
    println!(
        "PostgreSQL; {n} messages per row, {concurrency} producers at a time; claimd's pool {pool}; provider on loopback, no added latency\n"
    );
    println!(
        "| how it arrives → effect | messages | msgs/s | producer p50 / p99 ms | taken p50 / p99 ms | taken after commit p50 / p99 ms | settled p50 / p99 ms | PG xacts/msg | PG CPU ms/msg | load1 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (i, row) in rows.into_iter().enumerate() {
        if !wanted.is_empty() && !wanted.iter().any(|w| w == &i.to_string()) {
            continue;
        }
        let line = run_row(row, n, concurrency, pool).await;
        println!("{line}");
    }
}
