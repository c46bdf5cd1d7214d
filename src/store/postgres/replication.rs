//! The primary's replication settings as claimd's sessions see them ([`read`]), for
//! [`crate::store::replication`]. The settings are readable by any role; `pg_stat_replication`
//! shows its rows to any role but their `sync_state` only to roles with `pg_read_all_stats`,
//! and a server or pooler may refuse the view: what cannot be read is left unknown.

use crate::store::replication::ReplicationSettings;
use crate::store::{StoreError, StoreResult};
use sqlx::PgPool;

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
pub(super) async fn read(pool: &PgPool) -> StoreResult<ReplicationSettings> {
    let (in_recovery, names, commit): (bool, String, String) = sqlx::query_as(REPLICATION_SETTINGS)
        .fetch_one(pool)
        .await
        .map_err(|e| StoreError::from_sqlx("replication_settings", e))?;
    let standbys: Option<(i64, i64, i64)> =
        match sqlx::query_as(REPLICATION_STANDBYS).fetch_one(pool).await {
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
