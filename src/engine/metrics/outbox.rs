//! The relay's metrics, registered with claimd's: events sent and not confirmed (counters),
//! and the backlog read from the store at each scrape (unsent events, the oldest one's age).

use crate::store::{Store, StoreResult};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DestinationLabel {
    consumer: String,
    destination: String,
}

fn label(c: &str, d: &str) -> DestinationLabel {
    DestinationLabel {
        consumer: c.to_string(),
        destination: d.to_string(),
    }
}

/// The outcome relay's series.
#[derive(Debug, Default)]
pub struct OutboxMetrics {
    sent: Family<DestinationLabel, Counter>,
    failed: Family<DestinationLabel, Counter>,
    unsent: Family<DestinationLabel, Gauge>,
    oldest: Family<DestinationLabel, Gauge<f64, AtomicU64>>,
}

impl OutboxMetrics {
    /// Registers the series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "outcome_events_sent",
            "Outcome events the destination confirmed",
            self.sent.clone(),
        );
        registry.register(
            "outcome_events_failed",
            "Outcome event sends not confirmed (tried again later)",
            self.failed.clone(),
        );
        registry.register(
            "outcome_events_unsent",
            "Outcome events written and not sent yet (the relay's backlog)",
            self.unsent.clone(),
        );
        registry.register(
            "outcome_events_oldest_unsent_seconds",
            "Age of the oldest unsent outcome event (0: none)",
            self.oldest.clone(),
        );
    }

    /// `n` events of consumer `c` confirmed by its destination `d`.
    pub fn sent(&self, c: &str, d: &str, n: usize) {
        self.sent.get_or_create(&label(c, d)).inc_by(n as u64);
    }

    /// `n` sends of consumer `c` to its destination `d` not confirmed.
    pub fn failed(&self, c: &str, d: &str, n: usize) {
        self.failed.get_or_create(&label(c, d)).inc_by(n as u64);
    }

    /// Reads the backlog of each (consumer, destination) in `destinations` from the store.
    pub async fn read(&self, store: &Store, destinations: &[(String, String)]) -> StoreResult<()> {
        if destinations.is_empty() {
            return Ok(());
        }
        let backlog = store.outbox_backlog().await?;
        for (c, d) in destinations {
            let b = backlog
                .iter()
                .find(|b| &b.consumer == c && &b.destination == d);
            let l = label(c, d);
            self.unsent.get_or_create(&l).set(b.map_or(0, |b| b.unsent));
            self.oldest
                .get_or_create(&l)
                .set(b.and_then(|b| b.oldest_unsent_age_s).unwrap_or(0.0));
            let _ = self.sent.get_or_create(&l);
            let _ = self.failed.get_or_create(&l);
        }
        Ok(())
    }
}
