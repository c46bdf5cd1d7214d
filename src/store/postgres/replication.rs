//! The primary's replication settings as claimd's sessions see them ([`read`]), for
//! [`crate::store::replication`]. The settings are readable by any role; `pg_stat_replication`
//! shows its rows to any role but their `sync_state` only to roles with `pg_read_all_stats`,
//! and a server or pooler may refuse the view: what cannot be read is left unknown.

use crate::store::dialect::SqlPool;
use crate::store::replication::ReplicationSettings;
use crate::store::{StoreError, StoreResult};
use sqlx::{Postgres, Row};

/// Whether the server is a standby, and the two settings that decide whether a commit waits
/// for one.
const REPLICATION_SETTINGS: &str = "SELECT pg_is_in_recovery(), \
     current_setting('synchronous_standby_names'), current_setting('synchronous_commit')";

/// Standbys streaming from this server: all, the synchronous ones, and how many rows show
/// their `sync_state` at all (fewer than all: the role may not see it).
const REPLICATION_STANDBYS: &str = "SELECT count(*), \
     count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')), count(sync_state) \
     FROM pg_stat_replication";

/// Reads the settings; the standbys are `None` when `pg_stat_replication` cannot be read.
pub(super) async fn read(pool: &SqlPool<Postgres>) -> StoreResult<ReplicationSettings> {
    let (in_recovery, names, commit): (bool, String, String) = one(pool, REPLICATION_SETTINGS)
        .await
        .map_err(|e| StoreError::from_sqlx("replication_settings", e))?;
    let standbys: Option<(i64, i64, i64)> = match one(pool, REPLICATION_STANDBYS).await {
        Ok(row) => Some(row),
        Err(e) => {
            tracing::debug!(error = %e, "pg_stat_replication cannot be read; standbys unknown");
            None
        }
    };
    Ok(ReplicationSettings {
        in_recovery,
        synchronous_standby_names: names,
        synchronous_commit: commit,
        standbys: standbys.map(|(all, _, _)| all),
        synchronous_standbys: standbys
            .filter(|(all, _, visible)| visible == all)
            .map(|(_, sync, _)| sync),
    })
}

/// The one row of a statement of three columns.
async fn one<A, B, C>(pool: &SqlPool<Postgres>, sql: &'static str) -> Result<(A, B, C), sqlx::Error>
where
    for<'r> A: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
    for<'r> B: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
    for<'r> C: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    let row = pool
        .optional(sqlx::query(sql))
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}
