//! Claims that vanished from the store while this instance held them
//! (`claimd_claims_vanished_total`): a fenced settle found no row of the claim's key, so the
//! store lost a claim it had committed (a failover to a standby that had not received it).
//! Each is written back by the instance that held it (`crate::engine::settle`); the counter
//! pages all the same, because the store lost acknowledged data.
//!
//! Beside it, claims whose sealed payload did not open (`claimd_claims_sealed_unreadable_total`,
//! see [`sealing`](crate::store::sealing)): its key was retired from the keys, so the claim is
//! parked, never sent.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConsumerLabel {
    consumer: String,
}

/// The vanished claims' series.
#[derive(Debug, Default)]
pub struct VanishedMetrics {
    vanished: Family<ConsumerLabel, Counter>,
    unreadable: Family<ConsumerLabel, Counter>,
}

impl VanishedMetrics {
    /// Registers the series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "claims_vanished",
            "Claims that vanished from the store while this instance held them (a fenced settle found no row of their key): the store lost acknowledged data; each is written back",
            self.vanished.clone(),
        );
        registry.register(
            "claims_sealed_unreadable",
            "Claims whose sealed payload did not open (its key is not among the keys): parked, never sent",
            self.unreadable.clone(),
        );
    }

    /// Creates each consumer's series at zero, so `increase()` sees the first one.
    pub fn init(&self, consumers: &[String]) {
        for c in consumers {
            let _ = self.vanished.get_or_create(&label(c));
            let _ = self.unreadable.get_or_create(&label(c));
        }
    }

    /// A claim of `consumer` vanished from the store.
    pub fn vanished(&self, consumer: &str) {
        self.vanished.get_or_create(&label(consumer)).inc();
    }

    /// A claim of `consumer` was not sent: its sealed payload did not open.
    pub fn sealed_unreadable(&self, consumer: &str) {
        self.unreadable.get_or_create(&label(consumer)).inc();
    }
}

fn label(consumer: &str) -> ConsumerLabel {
    ConsumerLabel {
        consumer: consumer.to_string(),
    }
}
