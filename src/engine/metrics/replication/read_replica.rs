//! The read replica's series (`[store] read_url`, [`crate::store::read_replica`]), set at each
//! scrape from a reading taken then: whether it answers, whether it is a standby, how far
//! behind the primary it is, and the operators' reads that ran on the primary or were refused
//! because it could not be read. No series without a replica.

use crate::store::read_replica::ReplicaStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabel {
    replica: String,
}

/// The read replica's series.
#[derive(Debug, Default)]
pub struct ReadReplicaMetrics {
    up: Family<ReplicaLabel, Gauge>,
    in_recovery: Family<ReplicaLabel, Gauge>,
    lag: Family<ReplicaLabel, Gauge<f64, AtomicU64>>,
    fallbacks: Family<ReplicaLabel, Counter>,
    refused: Family<ReplicaLabel, Counter>,
}

impl ReadReplicaMetrics {
    /// Registers the series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "read_replica_up",
            "1 when the read replica ([store] read_url) answered at this scrape; 0: operators' searches and reports fall back to the primary or are refused ([store] read_fallback)",
            self.up.clone(),
        );
        registry.register(
            "read_replica_in_recovery",
            "1 when the read replica is a standby (pg_is_in_recovery()); 0: it is a primary (promoted?), and operators' reads load it",
            self.in_recovery.clone(),
        );
        registry.register(
            "read_replica_lag_seconds",
            "How far the read replica may be behind the primary: 0 when streaming with everything received replayed, else the age of the last transaction it replayed (too large when the primary is idle)",
            self.lag.clone(),
        );
        registry.register(
            "read_replica_fallback_reads",
            "Operators' reads run on the primary, one at a time, because the read replica could not be read",
            self.fallbacks.clone(),
        );
        registry.register(
            "read_replica_refused_reads",
            "Operators' reads answered busy because the read replica could not be read (read_fallback = \"refuse\", or another fallback read was running on the primary)",
            self.refused.clone(),
        );
    }

    /// Sets the series from `status`, read at this scrape.
    pub fn set(&self, status: &ReplicaStatus) {
        let label = ReplicaLabel {
            replica: status.url.clone(),
        };
        let reading = status.reading.as_ref().ok();
        self.up
            .get_or_create(&label)
            .set(i64::from(reading.is_some()));
        match reading {
            Some(r) => {
                self.in_recovery
                    .get_or_create(&label)
                    .set(i64::from(r.in_recovery));
                match r.lag_s {
                    Some(lag) => {
                        self.lag.get_or_create(&label).set(lag);
                    }
                    None => {
                        self.lag.remove(&label);
                    }
                }
            }
            // Unknown while it does not answer: no sample rather than a stale one.
            None => {
                self.in_recovery.remove(&label);
                self.lag.remove(&label);
            }
        }
        for (family, total) in [
            (&self.fallbacks, status.fallbacks),
            (&self.refused, status.refused),
        ] {
            let counter = family.get_or_create(&label);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }
}
