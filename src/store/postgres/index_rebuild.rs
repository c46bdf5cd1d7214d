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

/// What `claimd reindex` found and did: each index, and the invalid copies dropped.
pub(super) async fn run(
    pool: &SqlPool<Postgres>,
    choice: &RebuildChoice,
    dry_run: bool,
) -> StoreResult<Reindexed> {
    let mut leftovers = drop_leftovers(pool, dry_run).await?;
    let rows = pool
        .all(sqlx::query(INDEXES).bind(TABLES))
        .await
        .map_err(|e| StoreError::from_sqlx("reindex_indexes", e))?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let (reading, qualified) = read_index(&r);
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
                    outcome.bytes_after = pool
                        .optional(
                            sqlx::query("SELECT pg_relation_size(to_regclass($1))::bigint")
                                .bind(&qualified),
                        )
                        .await
                        .ok()
                        .flatten()
                        .and_then(|r| r.try_get(0).ok());
                }
                // Not the owner: no other index will fare better.
                Err(e) if is_not_owner(&e) => return Err(refused("reindex", e)),
                Err(e) => {
                    tracing::warn!(index = %qualified, error = %e, "could not rebuild an index");
                    outcome.error = Some(crate::store::driver_words(&e));
                    // Its invalid copy would otherwise take every write until the next run.
                    if let Ok(more) = drop_leftovers(pool, false).await {
                        leftovers.extend(more);
                    }
                }
            }
        }
        out.push(outcome);
    }
    Ok(Reindexed {
        indexes: out,
        leftovers,
    })
}

/// Drops (or, in a dry run, lists) the invalid copies cut rebuilds left on [`TABLES`].
async fn drop_leftovers(pool: &SqlPool<Postgres>, dry_run: bool) -> StoreResult<Vec<String>> {
    let found: Vec<String> = pool
        .all(sqlx::query(LEFTOVERS).bind(TABLES))
        .await
        .map_err(|e| StoreError::from_sqlx("reindex_leftovers", e))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !dry_run {
        for qualified in &found {
            raw(
                pool,
                &format!("DROP INDEX CONCURRENTLY IF EXISTS {qualified}"),
            )
            .await
            .map_err(|e| refused("drop_invalid_index", e))?;
        }
    }
    Ok(found)
}

/// What a fresh build of each table's indexes would take ([`IndexReading::fresh_bytes`],
/// summed); `None` for a table one of whose indexes has no estimate.
pub(super) async fn fresh_bytes_by_table(
    pool: &SqlPool<Postgres>,
) -> StoreResult<std::collections::HashMap<String, Option<i64>>> {
    let rows = pool
        .all(sqlx::query(INDEXES).bind(TABLES))
        .await
        .map_err(|e| StoreError::from_sqlx("reindex_indexes", e))?;
    let mut out: std::collections::HashMap<String, Option<i64>> = Default::default();
    for r in rows {
        let (reading, _) = read_index(&r);
        let fresh = reading.fresh_bytes();
        let sum = out.entry(reading.table).or_insert(Some(0));
        *sum = sum.zip(fresh).map(|(a, b)| a + b);
    }
    Ok(out)
}

/// One row of [`INDEXES`]: the reading and the index's qualified, quoted name.
fn read_index(r: &sqlx::postgres::PgRow) -> (IndexReading, String) {
    let reading = IndexReading {
        table: r.get(0),
        index: r.get(1),
        bytes: r.get(3),
        entries: r.get(4),
        key_width: r.get(5),
    };
    (reading, r.get(2))
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
