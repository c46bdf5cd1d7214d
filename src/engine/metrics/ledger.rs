//! The ledger reconciliation's series, read from the store at each scrape: when the last
//! `claimd reconcile --ledger` of each consumer ran and what it found.

use crate::store::{Store, StoreResult};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    consumer: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConsumerLabel {
    consumer: String,
}

/// The ledger's series.
#[derive(Debug, Default)]
pub struct LedgerMetrics {
    mismatches: Family<KindLabels, Gauge>,
    last_run: Family<ConsumerLabel, Gauge<f64, AtomicU64>>,
}

impl LedgerMetrics {
    /// Registers the series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "ledger_mismatches",
            "Disagreements the last `claimd reconcile --ledger` found, by kind: double, missing, orphan, amount_mismatch, currency_mismatch, status_mismatch",
            self.mismatches.clone(),
        );
        registry.register(
            "ledger_last_run_timestamp_seconds",
            "When the last `claimd reconcile --ledger` of the consumer ran",
            self.last_run.clone(),
        );
    }

    /// Sets the series from the store's last runs.
    pub async fn read(&self, store: &Store) -> StoreResult<()> {
        for run in store.ledger_runs().await? {
            // The run's `mismatches` (`crate::ops::ledger::Summary`), read from its JSON: the
            // metrics sit below the ledger. A summary without it (another version's) is skipped.
            let Some(mismatches) = run.summary.get("mismatches").and_then(|m| m.as_object()) else {
                continue;
            };
            self.last_run
                .get_or_create(&ConsumerLabel {
                    consumer: run.consumer.clone(),
                })
                .set(run.at_utc.timestamp_millis() as f64 / 1000.0);
            for (kind, n) in mismatches {
                self.mismatches
                    .get_or_create(&KindLabels {
                        consumer: run.consumer.clone(),
                        kind: kind.clone(),
                    })
                    .set(
                        n.as_u64()
                            .map_or(i64::MAX, |n| i64::try_from(n).unwrap_or(i64::MAX)),
                    );
            }
        }
        Ok(())
    }
}
