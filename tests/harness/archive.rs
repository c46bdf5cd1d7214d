//! The archive in the combined run: once the faults are over, the finished claims of the
//! payments and email consumers are aged past `archive_after` (1 h) and the workers' own
//! retention, running every second, moves them to `claims_archive`; the end-of-run checks then
//! read them there, through the same listings, histories and erasure an operator uses.

use std::time::{Duration, Instant};

/// The consumers whose finished claims are archived before the checks.
const ARCHIVED: &str = "consumer IN ('payments', 'email') AND state IN ('completed', 'failed')";

/// Ages the finished claims by 90 minutes and waits (at most a minute) until the workers'
/// retention has moved every one of them; returns how many the archive holds.
pub async fn archive_finished(db_url: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(db_url).await.unwrap();
    let aged = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE claims SET updated_utc = updated_utc - interval '90 minutes' WHERE {ARCHIVED}"
    )))
    .execute(&mut c)
    .await
    .unwrap()
    .rows_affected();
    let started = Instant::now();
    loop {
        let (left,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM claims WHERE {ARCHIVED}"
        )))
        .fetch_one(&mut c)
        .await
        .unwrap();
        if left == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "retention left {left} of {aged} aged finished claims out of the archive"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (archived,): (i64,) = sqlx::query_as("SELECT count(*) FROM claims_archive")
        .fetch_one(&mut c)
        .await
        .unwrap();
    eprintln!(
        "archive: {aged} finished claims aged, {archived} archived in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(archived > 0, "the archive holds the aged claims");
    archived
}
