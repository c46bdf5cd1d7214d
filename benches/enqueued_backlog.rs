//! A backlog of enqueued claims drains as fast as fresh ones: producers enqueued `BENCH_BACKLOG`
//! messages while no worker ran (a deploy, a stopped consumer), into a `claims` table whose
//! statistics were taken before the backlog, when it held `BENCH_FINISHED` finished claims and
//! none waiting (as autovacuum leaves them on a large table, until a tenth of it changes:
//! autovacuum is off for `claims` here so that it stays so). Then a worker starts; the bench
//! prints how long it took to settle them all, messages a second, and PostgreSQL's CPU per
//! message (the server must run on this machine; it includes the bench's own count of the
//! settled claims, four times a second). With autovacuum off, vacuum does not run during the
//! drain either: the figures are the worst case of a backlog smaller than a tenth of its
//! table.
//!
//! `cargo bench --features full --bench enqueued_backlog` (env: `BENCH_PG` admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `BENCH_BACKLOG` [200000];
//! `BENCH_FINISHED` [100000]). To compare two builds, run each build's
//! `target/release/deps/enqueued_backlog-*` with `--bench`, in turn.

mod support;

use claimd::config::Config;
use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use claimd::service::app::App;
use std::path::Path;
use std::time::{Duration, Instant};
use support::{BenchDb, env_or, load1};

/// Starts a worker on `toml`'s store.
async fn worker(toml: &str) -> claimd::service::run::Running {
    let cfg = Config::from_toml(toml, Path::new("bench.toml"), std::env::vars())
        .expect("config")
        .config;
    claimd::service::run::start(App::open(cfg, true).await.expect("open"))
        .await
        .expect("start")
}

#[tokio::main]
async fn main() {
    let backlog: i64 = env_or("BENCH_BACKLOG", 200_000);
    let finished: i64 = env_or("BENCH_FINISHED", 100_000);
    let db = BenchDb::create("enqueued_backlog").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    let sandbox = Sandbox::new(SandboxOptions::default());
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = sandbox
            .serve(listener, async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            })
            .await;
    });
    let toml = support::payments_toml(&db.url, &provider, 16, false);
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&db.url)
        .await
        .unwrap();

    // A worker starts once (migrations, the consumer registered), then stops.
    worker(&toml).await.shutdown(Duration::from_secs(5)).await;
    let t = Instant::now();
    for sql in [
        "ALTER TABLE claims SET (autovacuum_enabled = false)".to_string(),
        format!(
            "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
             content_type, state, processed_utc) \
             SELECT 'payments', '', 'done-' || g, 'done-' || g, 'f', '\\x7b7d', \
             'application/json', 'completed', now() FROM generate_series(1, {finished}) g"
        ),
        "VACUUM ANALYZE claims".to_string(),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .unwrap();
    }
    // The producers' enqueues, 10,000 to a transaction.
    let mut from = 1;
    while from <= backlog {
        let to = (from + 9_999).min(backlog);
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM generate_series({from}, {to}) g, \
             LATERAL claimd.enqueue_bytes('payments', 'order-' || g, \
               convert_to('{{\"order_id\":\"order-' || g || '\",\"amount_cents\":' || (100 + g) || '}}', 'UTF8'))"
        )))
        .execute(&admin)
        .await
        .unwrap();
        from = to + 1;
    }
    let fill = t.elapsed().as_secs_f64();

    let postmaster = support::proc_cpu::postmaster(&db.url).await;
    let cpu_before = support::proc_cpu::postgres_cpu(postmaster);
    let load_before = load1();
    let started = Instant::now();
    let running = worker(&toml).await;
    let mut done: i64 = 0;
    while done < backlog {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (completed, other): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'completed'), \
                    count(*) FILTER (WHERE state IN ('failed', 'needs_attention')) \
             FROM claims WHERE message_id LIKE 'order-%'",
        )
        .fetch_one(&admin)
        .await
        .unwrap();
        assert_eq!(other, 0, "claims of the backlog failed or were parked");
        done = completed;
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "{done} of {backlog} settled after an hour"
        );
    }
    let drain = started.elapsed().as_secs_f64();
    let pg_cpu =
        (support::proc_cpu::postgres_cpu(postmaster) - cpu_before) * 1000.0 / backlog as f64;
    running.shutdown(Duration::from_secs(5)).await;
    let _ = stop_tx.send(true);
    println!(
        "\nPostgreSQL; {backlog} enqueued claims waiting, {finished} finished claims before them \
         (statistics from before the backlog); consumer concurrency 64, pool 16; provider on \
         loopback, no added latency; filled in {fill:.0} s\n"
    );
    println!("| backlog | drained in s | msgs/s | PG CPU ms/msg | load1 before → after |");
    println!("|---|---|---|---|---|");
    println!(
        "| {backlog} | {drain:.1} | {:.0} | {pg_cpu:.3} | {load_before:.2} → {:.2} |",
        backlog as f64 / drain,
        load1()
    );
    admin.close().await;
    db.drop_now().await;
}
