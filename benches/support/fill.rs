//! Bulk history for PostgreSQL benches: millions of settled claims inserted by
//! `generate_series`, one statement per million rows, as a real table would hold them.
//!
//! Rows are `bulk-<g>` claims: 98.9% `completed`, 1% `failed`, 0.1% `needs_attention`; 90%
//! consumer `payments`, 10% `emails`. Received times grow with `g` (claims are inserted when
//! they are received), spread evenly so that row `largest` is received now and row 1 thirty
//! days ago. None is `started`, so no sweeper takes them and no bench waits for them.

use std::time::Instant;

/// Rows per `INSERT … SELECT … generate_series` statement (one transaction each).
pub const ROWS_PER_STATEMENT: i64 = 1_000_000;

/// Inserts bulk claims `from..=to` (see the module doc) into `pool`'s `claims` table; `largest`
/// is the final table size the received times are spread for. Prints progress to stderr.
pub async fn fill_bulk(pool: &sqlx::PgPool, from: i64, to: i64, largest: i64) {
    let t = Instant::now();
    let mut start = from;
    while start <= to {
        let end = (start + ROWS_PER_STATEMENT - 1).min(to);
        sqlx::query(
            "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, \
               payload, content_type, state, attempt, lease_owner, lease_until, \
               received_utc, started_utc, processed_utc, updated_utc, provider_status) \
             SELECT CASE WHEN g % 10 = 0 THEN 'emails' ELSE 'payments' END, '', \
               'bulk-' || g, 'k-' || g, 'f', '\\x7b7d'::bytea, 'application/json', \
               CASE WHEN g % 1000 = 7 THEN 'needs_attention' \
                    WHEN g % 100 = 3 THEN 'failed' ELSE 'completed' END, 1, NULL, NULL, \
               r, r, r + interval '80 milliseconds', r + interval '80 milliseconds', 200 \
             FROM (SELECT g, now() - ($3::bigint - g) * ($4::float8 * interval '1 second') AS r \
                   FROM generate_series($1::bigint, $2::bigint) g) s",
        )
        .bind(start)
        .bind(end)
        .bind(largest.max(1))
        .bind(2_592_000.0 / largest.max(1) as f64)
        .execute(pool)
        .await
        .unwrap();
        eprintln!("loaded {end} claims ({:.0} s)", t.elapsed().as_secs_f64());
        start = end + 1;
    }
}

/// `VACUUM (ANALYZE) claims`: after a bulk load, so the planner knows the table's size and the
/// visibility map lets index-only scans skip the heap.
pub async fn vacuum_analyze(pool: &sqlx::PgPool) {
    sqlx::query("VACUUM (ANALYZE) claims")
        .execute(pool)
        .await
        .unwrap();
}
