//! Reads [`StorageHealth`] from PostgreSQL's statistics views. Any role can read
//! `pg_stat_user_tables` and the sizes of tables it uses; `pg_stat_activity` shows every
//! session's `backend_xmin` and, to roles without `pg_read_all_stats`, other roles'
//! `xact_start` as NULL: the horizon's age in transactions is then known, its holder's time
//! not (docs/operations.md, "Storage").

use crate::store::dialect::SqlPool;
use crate::store::storage_health::{StorageHealth, TableHealth, VacuumHorizon};
use crate::store::{StoreError, StoreResult};
use sqlx::{Postgres, Row};

/// claimd's tables in the current schema: rows, dead rows, sizes, last vacuum; the archive's
/// partitions (migration 0027) summed as one table, its least recently vacuumed day's age.
const TABLES: &str = "\
    SELECT * FROM ( \
      SELECT relname::text, n_live_tup, n_dead_tup, pg_table_size(relid) AS t, \
        pg_indexes_size(relid) AS i, \
        EXTRACT(EPOCH FROM now() - GREATEST(last_vacuum, last_autovacuum))::float8 \
      FROM pg_stat_user_tables \
      WHERE schemaname = current_schema() \
        AND relname IN ('claims', 'claim_events', 'outcome_events', 'dead_letters', \
                        'provider_events', 'operator_audit', 'ledger_runs') \
      UNION ALL \
      SELECT 'claims_archive', SUM(s.n_live_tup)::bigint, SUM(s.n_dead_tup)::bigint, \
        SUM(pg_table_size(s.relid))::bigint, SUM(pg_indexes_size(s.relid))::bigint, \
        MAX(EXTRACT(EPOCH FROM now() - GREATEST(s.last_vacuum, s.last_autovacuum)))::float8 \
      FROM pg_stat_user_tables s JOIN pg_inherits h ON h.inhrelid = s.relid \
      WHERE h.inhparent = to_regclass('claims_archive') HAVING COUNT(*) > 0) tables \
    ORDER BY t + i DESC";

/// The oldest snapshot in this database that vacuum must respect: a session's (its snapshot,
/// or its transaction id: an idle transaction that wrote holds no snapshot between statements
/// but still holds vacuum back), a replication slot's or a prepared transaction's, with its
/// age and who holds it. Every snapshot taken while an old transaction runs has that
/// transaction's id as its horizon: of the sessions with the oldest horizon, the one whose
/// transaction began first is the holder (not one of claimd's own short ones).
const HORIZON: &str = "\
    SELECT age, seconds, holder FROM ( \
      SELECT age(COALESCE(backend_xmin, backend_xid))::bigint AS age, \
        EXTRACT(EPOCH FROM now() - xact_start)::float8 AS seconds, \
        format('pid %s (%s, %s)', pid, COALESCE(NULLIF(application_name, ''), usename::text, '?'), \
               COALESCE(state, '?')) AS holder \
      FROM pg_stat_activity \
      WHERE COALESCE(backend_xmin, backend_xid) IS NOT NULL \
        AND datname = current_database() AND pid <> pg_backend_pid() \
      UNION ALL \
      SELECT age(xmin)::bigint, NULL, format('replication slot %s', slot_name) \
      FROM pg_replication_slots WHERE xmin IS NOT NULL \
      UNION ALL \
      SELECT age(transaction)::bigint, EXTRACT(EPOCH FROM now() - prepared)::float8, \
        format('prepared transaction %s', gid) \
      FROM pg_prepared_xacts WHERE database = current_database() \
    ) h ORDER BY age DESC NULLS LAST, seconds DESC NULLS LAST LIMIT 1";

/// One reading.
pub(super) async fn read(pool: &SqlPool<Postgres>) -> StoreResult<StorageHealth> {
    let rows = pool
        .all(sqlx::query(TABLES))
        .await
        .map_err(|e| StoreError::from_sqlx("storage_tables", e))?;
    let mut tables = rows
        .iter()
        .map(|r| {
            Ok(TableHealth {
                table: r.try_get(0)?,
                live_rows: r.try_get(1)?,
                dead_rows: r.try_get(2)?,
                table_bytes: r.try_get(3)?,
                index_bytes: r.try_get(4)?,
                index_fresh_bytes: None,
                vacuumed_s_ago: r.try_get(5)?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()
        .map_err(|e| StoreError::from_sqlx("storage_tables", e))?;
    match super::index_rebuild::fresh_bytes_by_table(pool).await {
        Ok(fresh) => {
            for t in &mut tables {
                t.index_fresh_bytes = fresh.get(&t.table).copied().flatten();
            }
        }
        Err(e) => tracing::debug!(error = %e, "the indexes' fresh sizes cannot be read"),
    }
    let horizon = match pool.optional(sqlx::query(HORIZON)).await {
        Ok(Some(r)) => VacuumHorizon {
            age_transactions: r.try_get::<Option<i64>, _>(0).ok().flatten().unwrap_or(0),
            oldest_transaction_s: r.try_get(1).ok().flatten(),
            holder: r.try_get(2).ok(),
        },
        Ok(None) => VacuumHorizon::default(),
        Err(e) => {
            tracing::debug!(error = %e, "the vacuum horizon cannot be read");
            VacuumHorizon::default()
        }
    };
    Ok(StorageHealth { tables, horizon })
}
