//! `claimd reindex` on PostgreSQL: reads the B-tree indexes of claimd's churned tables
//! ([`crate::store::index_rebuild::TABLES`]) with what a fresh build of each would take, and
//! rebuilds those chosen with `REINDEX INDEX CONCURRENTLY`, one at a time: intake and settles
//! go on meanwhile. Only the tables' owner may rebuild (the role that runs `claimd migrate`).
//! A rebuild cut short (the command killed, the connection lost) leaves an invalid copy named
//! `<index>_ccnew`; the next run drops it first.

use crate::store::dialect::SqlPool;
use crate::store::index_rebuild::{
    IndexOutcome, IndexReading, RebuildChoice, Reindexed, TABLES, Verdict, verdict,
};
use crate::store::{StoreError, StoreResult};
use sqlx::{Postgres, Row};
use std::time::Instant;

/// Each valid B-tree index of the tables in `$1` (current schema): its size, its entries at
/// the last vacuum or build, and the average width of an entry's columns (key and included)
/// from the statistics (`pg_stats`; an expression's under the index's own name): NULL when a
/// column has none.
const INDEXES: &str = "\
    SELECT t.relname::text AS tbl, i.relname::text AS idx, \
      quote_ident(n.nspname) || '.' || quote_ident(i.relname) AS qualified, \
      pg_relation_size(i.oid) AS bytes, \
      CASE WHEN i.reltuples < 0 THEN NULL ELSE i.reltuples::bigint END AS entries, \
      (SELECT CASE WHEN bool_and(COALESCE(s.avg_width, e.avg_width) IS NOT NULL) \
                   THEN SUM(COALESCE(s.avg_width, e.avg_width))::float8 END \
       FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, pos) \
       LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum AND k.attnum > 0 \
       LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = t.relname \
                           AND s.attname = a.attname \
       LEFT JOIN pg_attribute ia ON ia.attrelid = i.oid AND ia.attnum = k.pos AND k.attnum = 0 \
       LEFT JOIN pg_stats e ON e.schemaname = n.nspname AND e.tablename = i.relname \
                           AND e.attname = ia.attname) AS key_width \
    FROM pg_index x \
    JOIN pg_class i ON i.oid = x.indexrelid \
    JOIN pg_class t ON t.oid = x.indrelid \
    JOIN pg_namespace n ON n.oid = t.relnamespace \
    JOIN pg_am am ON am.oid = i.relam AND am.amname = 'btree' \
    WHERE n.nspname = current_schema() AND t.relname = ANY($1) AND x.indisvalid \
    ORDER BY pg_relation_size(i.oid) DESC";

/// The invalid copies a cut `REINDEX ... CONCURRENTLY` leaves on these tables.
const LEFTOVERS: &str = "\
    SELECT quote_ident(n.nspname) || '.' || quote_ident(i.relname) \
    FROM pg_index x \
    JOIN pg_class i ON i.oid = x.indexrelid \
    JOIN pg_class t ON t.oid = x.indrelid \
    JOIN pg_namespace n ON n.oid = t.relnamespace \
    WHERE n.nspname = current_schema() AND t.relname = ANY($1) AND NOT x.indisvalid \
      AND i.relname ~ '_cc(new|old)[0-9]*$'";

/// PostgreSQL's `insufficient_privilege`.
const NOT_OWNER: &str = "42501";

/// What `claimd reindex` found and did: each index, and the invalid copies dropped first.
pub(super) async fn run(
    pool: &SqlPool<Postgres>,
    choice: &RebuildChoice,
    dry_run: bool,
) -> StoreResult<Reindexed> {
    let tables: Vec<String> = TABLES.iter().map(|t| t.to_string()).collect();
    let mut dropped = Vec::new();
    if !dry_run {
        let leftovers: Vec<String> = sqlx::query_scalar(LEFTOVERS)
            .bind(&tables)
            .fetch_all(&pool.pool)
            .await
            .map_err(|e| StoreError::from_sqlx("reindex_leftovers", e))?;
        for qualified in leftovers {
            raw(
                pool,
                &format!("DROP INDEX CONCURRENTLY IF EXISTS {qualified}"),
            )
            .await
            .map_err(|e| refused("drop_invalid_index", e))?;
            dropped.push(qualified);
        }
    }
    let rows = sqlx::query(INDEXES)
        .bind(&tables)
        .fetch_all(&pool.pool)
        .await
        .map_err(|e| StoreError::from_sqlx("reindex_indexes", e))?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let reading = IndexReading {
            table: r.get(0),
            index: r.get(1),
            bytes: r.get(3),
            entries: r.get(4),
            key_width: r.get(5),
        };
        let qualified: String = r.get(2);
        let verdict = verdict(&reading, choice);
        let mut outcome = IndexOutcome {
            bloat: reading.bloat(),
            reading,
            verdict,
            bytes_after: None,
            seconds: None,
            error: None,
        };
        if verdict == Verdict::Rebuild && !dry_run {
            let started = Instant::now();
            match raw(pool, &format!("REINDEX INDEX CONCURRENTLY {qualified}")).await {
                Ok(()) => {
                    outcome.seconds = Some(started.elapsed().as_secs_f64());
                    outcome.bytes_after =
                        sqlx::query_scalar("SELECT pg_relation_size(to_regclass($1))::bigint")
                            .bind(&qualified)
                            .fetch_one(&pool.pool)
                            .await
                            .ok();
                }
                // Not the owner: no other index will fare better.
                Err(e) if is_not_owner(&e) => return Err(refused("reindex", e)),
                Err(e) => {
                    tracing::warn!(index = %qualified, error = %e, "could not rebuild an index");
                    outcome.error = Some(crate::store::driver_words(&e));
                }
            }
        }
        out.push(outcome);
    }
    Ok(Reindexed {
        indexes: out,
        leftovers_dropped: dropped,
    })
}

/// Runs one statement outside a transaction (`CONCURRENTLY` refuses to run in one).
async fn raw(pool: &SqlPool<Postgres>, sql: &str) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&pool.pool)
        .await
        .map(|_| ())
}

fn is_not_owner(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some(NOT_OWNER))
}

/// A refusal for want of ownership says who may rebuild.
fn refused(query: &'static str, e: sqlx::Error) -> StoreError {
    if is_not_owner(&e) {
        StoreError::NotOwner(crate::store::driver_words(&e))
    } else {
        StoreError::from_sqlx(query, e)
    }
}
