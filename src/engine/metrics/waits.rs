//! What the started claims wait for, read from the store at each scrape: the scheduled sends
//! whose time has not come and the claims waiting in their order key's line. Both are part of
//! `claimd_waiting_claims` and neither is in flight, so neither ages
//! `claimd_oldest_started_age_seconds`.

use crate::store::ConsumerCounts;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConsumerLabel {
    consumer: String,
}

/// The waiting claims' series.
#[derive(Debug, Default)]
pub struct WaitMetrics {
    scheduled: Family<ConsumerLabel, Gauge>,
    in_line: Family<ConsumerLabel, Gauge>,
}

impl WaitMetrics {
    /// Registers the series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "scheduled_claims",
            "Scheduled sends (Not-Before) whose time has not come, read from the store",
            self.scheduled.clone(),
        );
        registry.register(
            "waiting_in_line",
            "Started claims waiting in their order key's line behind an unfinished claim, read from the store",
            self.in_line.clone(),
        );
    }

    /// Sets `consumer`'s series from its open counts.
    pub fn set(&self, consumer: &str, counts: &ConsumerCounts) {
        let label = ConsumerLabel {
            consumer: consumer.to_string(),
        };
        self.scheduled.get_or_create(&label).set(counts.scheduled);
        self.in_line.get_or_create(&label).set(counts.in_line);
    }
}
