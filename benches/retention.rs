//! Retention on a large table: prune 1,000,000 claims (PostgreSQL) in batches while new claims
//! keep arriving, and show that claiming is not blocked and open claims are never deleted.
//!
//! `cargo bench --features full --bench retention` (env: `BENCH_PG` admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `BENCH_ROWS`, default 1000000;
//! `BENCH_BATCH`, default 5000).

mod support;

use claimd::domain::claim::{NewClaim, fingerprint};
use claimd::store::postgres::PgStore;
use claimd::store::{ClaimStore, EngineStore, IntakeStore};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::env_or;

#[tokio::main]
async fn main() {
    let rows: i64 = env_or("BENCH_ROWS", 1_000_000);
    let batch: u32 = env_or("BENCH_BATCH", 5000);
    let db = support::BenchDb::create("retention").await;
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    store.migrate().await.unwrap();

    let t = Instant::now();
    // 92% completed, 4% failed (all 30 days old), 2% started, 2% needs_attention (also old).
    sqlx::query(
        "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, content_type, \
           state, received_utc, started_utc, updated_utc, processed_utc, lease_until) \
         SELECT 'payments', '', 'old-' || g, 'old-' || g, 'f', '\\x7b7d'::bytea, 'application/json', \
           CASE WHEN g % 50 = 0 THEN 'started' WHEN g % 50 = 1 THEN 'needs_attention' \
                WHEN g % 25 = 2 THEN 'failed' ELSE 'completed' END, \
           now() - interval '30 days', now() - interval '30 days', now() - interval '30 days', \
           now() - interval '30 days', now() + interval '1 hour' \
         FROM generate_series(1, $1) g",
    )
    .bind(rows)
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::query("ANALYZE claims")
        .execute(store.pool())
        .await
        .unwrap();
    let load_s = t.elapsed().as_secs_f64();
    let open_before: i64 = sqlx::query_scalar("SELECT count(*) FROM claims WHERE state IN ('started','needs_attention') AND message_id LIKE 'old-%'")
        .fetch_one(store.pool())
        .await
        .unwrap();

    // New claims arrive during the prune; record each claim's latency.
    let stop = Arc::new(AtomicBool::new(false));
    let claimer = {
        let store = store.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
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
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let result = store
        .prune(Duration::from_secs(14 * 86_400), batch, false)
        .await
        .unwrap();
    let prune_s = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let mut lat = claimer.await.unwrap();
    lat.sort();
    let q =
        |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1000.0;
    let open_after: i64 = sqlx::query_scalar("SELECT count(*) FROM claims WHERE state IN ('started','needs_attention') AND message_id LIKE 'old-%'")
        .fetch_one(store.pool())
        .await
        .unwrap();

    println!(
        "| rows | load_s | deleted | batches (of {batch}) | prune_s | rows/s | claims during prune | claim p50 ms | claim p99 ms | claim max ms | open before | open after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {rows} | {load_s:.1} | {} | {} | {prune_s:.1} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {open_before} | {open_after} |",
        result.deleted,
        result.batches,
        result.deleted as f64 / prune_s,
        lat.len(),
        q(0.5),
        q(0.99),
        lat.last().unwrap().as_secs_f64() * 1000.0,
    );
    assert_eq!(
        open_before, open_after,
        "retention must never delete open claims"
    );
    drop(store);
    db.drop_now().await;
}
