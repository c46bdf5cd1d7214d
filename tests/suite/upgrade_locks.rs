//! Upgrading a full database while intake goes on: 1,000,000 claims written on the first
//! schema, then `claimd migrate` applies every later migration while a writer inserts a claim
//! and settles it every 5 ms, as intake would. Each write is timed; no migration may hold a
//! lock on `claims` that keeps a write waiting for more than a second. Prints the migrations'
//! own times and the writes' latency.

use crate::common;

use common::*;
use std::time::{Duration, Instant};

const ROWS: i64 = 1_000_000;

#[tokio::test]
#[ignore = "long: 1,000,000 claims, every migration applied under intake (about 30 s)"]
async fn no_migration_stops_intake_on_a_million_claims() {
    let Some(db) = PgDb::create().await else {
        return;
    };
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let migrator = claimd::store::embedded_migrations::postgres();
    migrator.run_to(1, &mut conn).await.unwrap();
    let loaded = Instant::now();
    sqlx::query(
        "INSERT INTO claims (consumer, message_id, idem_key, fingerprint, payload, state,
                             received_utc, updated_utc, processed_utc)
         SELECT 'payments', 'old-' || n, 'payments::old-' || n, 'f', '\\x7b7d'::bytea,
                CASE WHEN n % 50 = 0 THEN 'started' ELSE 'completed' END,
                now() - (n || ' seconds')::interval, now() - (n || ' seconds')::interval,
                now() - (n || ' seconds')::interval
         FROM generate_series(1, $1) n",
    )
    .bind(ROWS)
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE claims")
        .execute(&mut conn)
        .await
        .unwrap();
    eprintln!("{ROWS} claims written in {:?}", loaded.elapsed());

    // The writer: a claim inserted and settled every 5 ms, each timed.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let url = db.url.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            let mut took = Vec::new();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                n += 1;
                let t = Instant::now();
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO claims (consumer, message_id, idem_key, fingerprint, payload)
                     VALUES ('payments', $1, 'payments::' || $1, 'f', '\\x7b7d'::bytea)
                     RETURNING id",
                )
                .bind(format!("new-{n}"))
                .fetch_one(&mut c)
                .await
                .expect("intake's insert fails during the upgrade");
                sqlx::query(
                    "UPDATE claims SET state = 'completed', updated_utc = now() WHERE id = $1",
                )
                .bind(id)
                .execute(&mut c)
                .await
                .expect("a settle fails during the upgrade");
                took.push(t.elapsed());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            took
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let url = db.url.clone();
    let started = Instant::now();
    let (code, _, err) = tokio::task::spawn_blocking(move || {
        cli_with_env(&["migrate"], &[("CLAIMD__STORE__URL", url.as_str())])
    })
    .await
    .unwrap();
    let migrate_took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut took = writer.await.unwrap();
    assert_eq!(code, 0, "claimd migrate: {err}");

    let rows: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT version, description, execution_time FROM _sqlx_migrations ORDER BY version",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    eprintln!("\n| migration | its transaction (ms) |\n|---|---:|");
    for (version, description, ns) in &rows {
        eprintln!("| {version:04} {description} | {} |", ns / 1_000_000);
    }
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    let worst = *took.last().unwrap();
    eprintln!(
        "\n{ROWS} claims; `claimd migrate` took {migrate_took:?}\n\
         | intake writes | p50 | p99 | max |\n|---:|---:|---:|---:|\n| {} | {:?} | {:?} | {:?} |",
        took.len(),
        at(0.5),
        at(0.99),
        worst
    );
    assert!(rows.len() > 1, "every later migration applied: {rows:?}");
    assert!(
        worst < Duration::from_secs(1),
        "a write waited {worst:?} for a migration's lock on claims"
    );
    let invalid: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_index WHERE NOT indisvalid")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(invalid, 0, "no index left invalid");
}
