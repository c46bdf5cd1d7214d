//! Retention on a large table (PostgreSQL), while new claims keep arriving, three ways side by
//! side in one run, each on a fresh database holding the same claims (92% completed, 4%
//! failed, 4% open, all 30 days old):
//!
//! - `delete`: the finished claims deleted from `claims` in batches (no archive);
//! - `archive move`: the finished claims moved to the archive (`archive_after`, windows of 45
//!   days), in batches;
//! - `archive month over`: the archive holds as many claims whose retention ended last month,
//!   and retention drops that month.
//!
//! Printed per variant: the time, the claims made meanwhile and their latency, and the sizes
//! and dead rows of `claims` and of the archive after (before any vacuum). Open claims are
//! never touched (asserted).
//!
//! `cargo bench --features full --bench retention` (env: `BENCH_PG` admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `BENCH_ROWS`, default 1000000;
//! `BENCH_BATCH`, default 5000).

mod support;

use claimd::domain::claim::{NewClaim, fingerprint};
use claimd::store::postgres::PgStore;
use claimd::store::{ClaimStore, EngineStore, IntakeStore, PruneResult, RetentionWindows};
use sqlx::Row;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::env_or;

const DAY: Duration = Duration::from_secs(86_400);

/// 30-day-old claims: 92% completed, 4% failed, 2% started, 2% needs_attention.
const FILL: &str = "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, \
    payload, content_type, state, received_utc, started_utc, updated_utc, processed_utc, \
    lease_until) \
  SELECT 'payments', '', 'old-' || g, 'old-' || g, 'f', '\\x7b7d'::bytea, 'application/json', \
    CASE WHEN g % 50 = 0 THEN 'started' WHEN g % 50 = 1 THEN 'needs_attention' \
         WHEN g % 25 = 2 THEN 'failed' ELSE 'completed' END, \
    now() - interval '30 days', now() - interval '30 days', now() - interval '30 days', \
    now() - interval '30 days', now() + interval '1 hour' \
  FROM generate_series(1, $1) g";

/// The open claims among the old ones.
const OPEN: &str = "SELECT count(*) FROM claims \
    WHERE state IN ('started', 'needs_attention') AND message_id LIKE 'old-%'";

/// A table's size with its indexes (MB), and its dead rows as the statistics count them.
const SIZE: &str = "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::float8 / 1048576 AS mb, \
    COALESCE(SUM(s.n_dead_tup), 0)::bigint AS dead \
  FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid \
  WHERE c.relname = $1 OR c.oid IN (SELECT inhrelid FROM pg_inherits \
    WHERE inhparent = to_regclass($1))";

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Delete,
    ArchiveMove,
    ArchiveMonthOver,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Delete => "delete",
            Variant::ArchiveMove => "archive move",
            Variant::ArchiveMonthOver => "archive month over",
        }
    }

    fn windows(self) -> RetentionWindows {
        match self {
            Variant::Delete => RetentionWindows::uniform(14 * DAY),
            _ => RetentionWindows {
                archive_after: Some(DAY),
                ..RetentionWindows::uniform(45 * DAY)
            },
        }
    }
}

#[tokio::main]
async fn main() {
    let rows: i64 = env_or("BENCH_ROWS", 1_000_000);
    let batch: u32 = env_or("BENCH_BATCH", 5000);
    println!(
        "| variant | rows | load s | claims moved or deleted | archive months dropped | retention s | claims during it | claim p50 / p99 / max ms | `claims` after MB (dead rows) | archive after MB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for v in [
        Variant::Delete,
        Variant::ArchiveMove,
        Variant::ArchiveMonthOver,
    ] {
        run(v, rows, batch).await;
    }
}

async fn run(v: Variant, rows: i64, batch: u32) {
    let db = support::BenchDb::create("retention").await;
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool();
    let t = Instant::now();
    sqlx::query(FILL).bind(rows).execute(pool).await.unwrap();
    if v == Variant::ArchiveMonthOver {
        // The same claims, archived with a retention that ended last month; `claims` keeps
        // only the open ones.
        for sql in [
            "SELECT claimd.claims_archive_months(ARRAY[(now() AT TIME ZONE 'UTC')::date - 31])",
            "INSERT INTO claims_archive \
               SELECT date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' \
                 - interval '15 days', now(), '[]', c.* \
               FROM claims c WHERE state IN ('completed', 'failed')",
            "DELETE FROM claims WHERE state IN ('completed', 'failed')",
            "VACUUM ANALYZE claims",
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(pool)
                .await
                .unwrap();
        }
    }
    sqlx::query("ANALYZE claims").execute(pool).await.unwrap();
    let load_s = t.elapsed().as_secs_f64();
    let open_before: i64 = sqlx::query_scalar(OPEN).fetch_one(pool).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let claimer = tokio::spawn(claims_meanwhile(store.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let r: PruneResult = store.prune(&v.windows(), batch, false).await.unwrap();
    let prune_s = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let mut lat = claimer.await.unwrap();
    lat.sort();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e3;
    let open_after: i64 = sqlx::query_scalar(OPEN).fetch_one(pool).await.unwrap();
    let size = |table: &'static str| async move {
        let r = sqlx::query(SIZE).bind(table).fetch_one(pool).await.unwrap();
        (r.get::<f64, _>("mb"), r.get::<i64, _>("dead"))
    };
    // The statistics are sent at the end of each transaction; give them a moment.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (claims_mb, claims_dead) = size("claims").await;
    let (archive_mb, _) = size("claims_archive").await;
    println!(
        "| {} | {rows} | {load_s:.1} | {} | {} | {prune_s:.2} | {} | {:.2} / {:.2} / {:.2} | {claims_mb:.1} ({claims_dead}) | {archive_mb:.1} |",
        v.name(),
        r.archived + r.deleted,
        r.archive_months_dropped,
        lat.len(),
        q(0.5),
        q(0.99),
        lat.last().unwrap().as_secs_f64() * 1e3,
    );
    assert_eq!(
        open_before, open_after,
        "retention must never touch open claims"
    );
    drop(store);
    db.drop_now().await;
}

/// Claims one new message after another until `stop`; each one's latency.
async fn claims_meanwhile(store: PgStore, stop: Arc<AtomicBool>) -> Vec<Duration> {
    let mut lat = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let id = format!("new-{i}");
        let n = NewClaim {
            consumer: "payments".into(),
            tenant: String::new(),
            message_id: id.clone(),
            idem_key: id,
            fingerprint: fingerprint(b"{}"),
            payload: b"{}".to_vec().into(),
            content_type: "application/json".into(),
            worker: "bench".into(),
            lease: Duration::from_secs(60),
            claim_token: claimd::domain::claim::new_claim_token(),
            mark_not_called: false,
            order_key: None,
            not_before: None,
            trace_parent: None,
            priority: 0,
        };
        let t = Instant::now();
        store.claim(&n).await.unwrap();
        lat.push(t.elapsed());
        i += 1;
    }
    lat
}
