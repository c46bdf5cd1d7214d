//! `claimd_store_replication{mode}`: what the PostgreSQL store's replication means for an
//! acknowledged claim, from the latest reading ([`crate::store::replication`]), set at each
//! scrape. SQLite has no series. The read replica's series are in [`read_replica`].

pub mod read_replica;

use crate::store::replication::ReplicationMode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabel {
    mode: String,
}

/// The replication series.
#[derive(Debug, Default)]
pub struct ReplicationMetrics {
    mode: Family<ModeLabel, Gauge>,
    /// The read replica's series (`[store] read_url`).
    pub read_replica: read_replica::ReadReplicaMetrics,
}

impl ReplicationMetrics {
    /// Registers the series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_replication",
            "1 for the PostgreSQL store's replication as last read (every minute): synchronous (no acknowledged claim is lost in a failover to the synchronous standby), asynchronous or none (a failover or the server's loss can lose acknowledged claims), unknown",
            self.mode.clone(),
        );
        self.read_replica.register(registry);
    }

    /// Sets the series to `mode`.
    pub fn set(&self, mode: ReplicationMode) {
        for m in ReplicationMode::ALL {
            self.mode
                .get_or_create(&ModeLabel {
                    mode: m.as_str().to_string(),
                })
                .set(i64::from(m == mode));
        }
    }
}
