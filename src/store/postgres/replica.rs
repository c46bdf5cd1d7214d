//! A pool to a read replica (`[store] read_url`, [`crate::store::read_replica`]): the same
//! statements as the primary's store, on a small pool of its own, and what the replica says of
//! its lag.

use super::failover::Primary;
use super::{PgDialect, PgStore};
use crate::store::dialect::SqlPool;
use crate::store::replication::ReplicaReading;
use crate::store::sql_store::SqlStore;
use crate::store::{StoreError, StoreResult};
use sqlx::Row;
use sqlx::postgres::PgPoolOptions;
use std::sync::Arc;
use std::time::Duration;

/// Whether the server is a standby, whether it streams from a primary, and how far its replay
/// is behind: nothing when it has replayed all it received while streaming; else the age of
/// the last transaction it replayed, which overstates the lag when the primary was idle (the
/// safe side: a lag shown too large never hides a missing claim).
const READING: &str = "SELECT pg_is_in_recovery() AS in_recovery, \
     COALESCE((SELECT status = 'streaming' FROM pg_stat_wal_receiver LIMIT 1), false) AS streaming, \
     pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() AS replayed_all, \
     EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())::float8 AS replay_age_s";

impl SqlStore<PgDialect> {
    /// Connects a pool of at most `max_connections` to a read replica, lazily. Its writes
    /// are never batched (it is given none), and a connection waits at most 2 s, so that a
    /// replica that is down is noticed quickly and the read falls back or is refused.
    ///
    /// None of the primary's failover checks apply: they refuse a standby's connections, and a
    /// standby is what this pool is for. Its `primary` only names the server (the first host
    /// of `url`); it is never watched or switched.
    pub fn connect_replica(
        url: &str,
        max_connections: u32,
        pooler: crate::store::pooler::Pooler,
    ) -> StoreResult<PgStore> {
        let targets = crate::store::hosts::split_hosts(url)
            .map_err(|e| StoreError::UrlRefused(url.to_string(), e))?;
        let server =
            Arc::new(Primary::new(&targets).map_err(|e| StoreError::from_sqlx("connect", e))?);
        let options = server.current_options().application_name("claimd-read");
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            // No idle reaper: sqlx's maintenance task can spin at 100% CPU and stall the runtime
            // (a num_idle underflow, launchbadge/sqlx #3645); connections live until they fail.
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy_with(options);
        Ok(SqlStore::batched(PgDialect::new(
            SqlPool { pool, pooler },
            server,
            max_connections,
        ))
        .unbatched())
    }

    /// What the server says of itself as a replica ([`ReplicaReading`]).
    pub async fn replica_reading(&self) -> StoreResult<ReplicaReading> {
        // The simple protocol: no prepared statement, safe through any pooler.
        let row = sqlx::raw_sql(READING)
            .fetch_one(self.pool())
            .await
            .map_err(|e| StoreError::from_sqlx("replica_reading", e))?;
        let get = |e: sqlx::Error| StoreError::Corrupt(e.to_string());
        let in_recovery: bool = row.try_get("in_recovery").map_err(get)?;
        let streaming: bool = row.try_get("streaming").map_err(get)?;
        let replayed_all: bool = row.try_get("replayed_all").map_err(get)?;
        let age: Option<f64> = row.try_get("replay_age_s").map_err(get)?;
        let lag_s = match (in_recovery, streaming && replayed_all) {
            (false, _) => None,
            (true, true) => Some(0.0),
            (true, false) => age.map(|a| a.max(0.0)),
        };
        Ok(ReplicaReading {
            in_recovery,
            streaming,
            lag_s,
        })
    }
}
