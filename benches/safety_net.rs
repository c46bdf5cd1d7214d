//! Scale of the safety net (PostgreSQL): the sweeper's take query over 1,000 stale claims
//! hidden among millions of settled ones, and the report queries (`counts`, `open_counts`) on
//! the same table: time of each and its `EXPLAIN (ANALYZE, BUFFERS)` plan.
//!
//! `cargo bench --features full --bench safety_net`. Environment (defaults in brackets): `BENCH_SIZES` table
//! sizes to measure at, growing, comma-separated [1000000,10000000]; `BENCH_PG` admin URL
//! [postgres://postgres@127.0.0.1:5432/postgres]; `BENCH_DB` database name
//! [claimd_bench_safety_net]; `BENCH_KEEP=1` keeps the database for a later run (which then
//! loads only the rows still missing); `BENCH_REPEAT` timings per query [7].
//!
//! The table: 1,000 stale `started` claims (lease expired an hour ago), 1,000 `started` claims
//! in flight (lease in the future), and bulk claims received over the last 30 days: 98.9%
//! `completed`, 1% `failed`, 0.1% `needs_attention`; 90% consumer `payments`, 10% `emails`.
//! Received times grow with insertion order, as in a real table (claims are inserted when they
//! are received), spread evenly so that the largest size covers the 30 days: the last 24 hours
//! hold 1/30 of the rows at the largest size (none at the smaller ones). The bulk rows come
//! from `support::fill`, shared with the throughput bench's table-size runs.

mod support;

use claimd::store::postgres::{COUNT_OPEN, COUNT_WINDOW, PgStore, TAKE_STALE};
use claimd::store::{ClaimStore, EngineStore, ReportStore};
use sqlx::{Connection, Row};
use std::time::{Duration, Instant};
use support::{env_or, load1};

const RESET_STALE: &str = "\
    UPDATE claims SET attempt = 1, lease_owner = 'crashed', \
      lease_until = now() - interval '1 hour' \
    WHERE consumer = 'payments' AND message_id LIKE 'stale-%'";

async fn explain(pool: &sqlx::PgPool, sql: &str, binds: Binds) -> String {
    // EXPLAIN ANALYZE runs the statement: do it in a transaction that is rolled back.
    let mut tx = pool.begin().await.unwrap();
    let q = format!("EXPLAIN (ANALYZE, BUFFERS) {sql}");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(q));
    query = binds.apply(query);
    let rows = query.fetch_all(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    rows.iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

#[derive(Clone, Copy)]
enum Binds {
    Take,
    Window(chrono::DateTime<chrono::Utc>),
    None,
}

impl Binds {
    fn apply<'q>(
        self,
        q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        match self {
            Binds::Take => q
                .bind("payments")
                .bind(1000i64)
                .bind("bench-sweeper")
                .bind(60_000i64)
                .bind(chrono::Utc::now())
                .bind(true),
            Binds::Window(since) => q.bind(since),
            Binds::None => q,
        }
    }
}

fn median_max(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], *v.last().unwrap())
}

#[tokio::main]
async fn main() {
    let admin: String = env_or(
        "BENCH_PG",
        "postgres://postgres@127.0.0.1:5432/postgres".to_string(),
    );
    let sizes: Vec<i64> = env_or("BENCH_SIZES", "1000000,10000000".to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let db: String = env_or("BENCH_DB", "claimd_bench_safety_net".to_string());
    let keep = std::env::var("BENCH_KEEP").is_ok_and(|v| v == "1");
    let repeat: usize = env_or("BENCH_REPEAT", 7);
    let largest = sizes.iter().copied().max().unwrap_or(1).max(1);

    let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&db)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    if !exists {
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let url = format!("{}/{db}", admin.rsplit_once('/').unwrap().0);
    let store = PgStore::connect(&url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_meta (bulk BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let mut loaded: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(bulk), -1) FROM bench_meta")
        .fetch_one(&pool)
        .await
        .unwrap();
    if loaded < 0 {
        // The open work: 1,000 stale claims (a crashed worker's) and 1,000 in flight.
        sqlx::query(
            "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
               content_type, state, lease_owner, lease_until, received_utc) \
             SELECT 'payments', '', CASE WHEN g <= 1000 THEN 'stale-' ELSE 'live-' END || g, \
               'k-' || g, 'f', '\\x7b7d'::bytea, 'application/json', 'started', 'w', \
               CASE WHEN g <= 1000 THEN now() - interval '1 hour' \
                    ELSE now() + interval '1 hour' END, now() - interval '2 hours' \
             FROM generate_series(1, 2000) g",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("INSERT INTO bench_meta VALUES (0)")
            .execute(&pool)
            .await
            .unwrap();
        loaded = 0;
    }

    let mut table = vec![
        "| claims in table | load s | take_stale 1,000 of 1,000 stale ms (median / max) | open_counts ms | counts(since 24h) ms | counts(all time) ms | load1 |".to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut plans = String::new();
    for &size in &sizes {
        let mut load_s = 0.0;
        if loaded < size {
            let t = Instant::now();
            support::fill::fill_bulk(&pool, loaded + 1, size, largest).await;
            sqlx::query("UPDATE bench_meta SET bulk = $1")
                .bind(size)
                .execute(&pool)
                .await
                .unwrap();
            support::fill::vacuum_analyze(&pool).await;
            load_s = t.elapsed().as_secs_f64();
            loaded = size;
        }
        let load = load1();
        let since = chrono::Utc::now() - chrono::Duration::hours(24);

        // The sweeper's take: the real statement through the store, then undone for the next.
        let mut take = Vec::new();
        for _ in 0..repeat {
            sqlx::query(RESET_STALE).execute(&pool).await.unwrap();
            let t = Instant::now();
            let taken = store
                .take_stale(
                    "payments",
                    1000,
                    "bench-sweeper",
                    Duration::from_secs(60),
                    chrono::Utc::now(),
                    true,
                )
                .await
                .unwrap();
            take.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(taken.len(), 1000, "every stale claim taken, none other");
            assert!(
                taken
                    .iter()
                    .all(|t| t.claim.message_id.starts_with("stale-"))
            );
        }
        sqlx::query(RESET_STALE).execute(&pool).await.unwrap();
        let mut open = Vec::new();
        let mut window = Vec::new();
        let mut all = Vec::new();
        for _ in 0..repeat {
            let t = Instant::now();
            let o = store.open_counts().await.unwrap();
            open.push(t.elapsed().as_secs_f64() * 1000.0);
            assert!(
                o.iter()
                    .any(|c| c.consumer == "payments" && c.stuck == 1000)
            );
            let t = Instant::now();
            store.counts(Some(since)).await.unwrap();
            window.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        for _ in 0..3.min(repeat) {
            let t = Instant::now();
            store.counts(None).await.unwrap();
            all.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let (tm, tx) = median_max(take);
        let (om, ox) = median_max(open);
        let (wm, wx) = median_max(window);
        let (am, ax) = median_max(all);
        let line = format!(
            "| {} | {load_s:.0} | {tm:.1} / {tx:.1} | {om:.1} / {ox:.1} | {wm:.0} / {wx:.0} | {am:.0} / {ax:.0} | {load:.2} |",
            size + 2000
        );
        eprintln!("{line}");
        table.push(line);

        for (name, sql, binds) in [
            ("sweeper take (TAKE_STALE)", TAKE_STALE, Binds::Take),
            ("open_counts (COUNT_OPEN)", COUNT_OPEN, Binds::None),
            (
                "counts since 24h (COUNT_WINDOW)",
                COUNT_WINDOW,
                Binds::Window(since),
            ),
        ] {
            sqlx::query(RESET_STALE).execute(&pool).await.unwrap();
            plans.push_str(&format!(
                "\n### {name}, {} claims\n\n```\n{}\n```\n",
                size + 2000,
                explain(&pool, sql, binds).await
            ));
        }
    }
    println!("{}", table.join("\n"));
    println!("{plans}");
    drop(store);
    pool.close().await;
    if !keep {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }
}
