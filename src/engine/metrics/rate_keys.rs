//! The per-key paces' metrics (`effect.rate_limit_key`), registered with claimd's: how many
//! keys each consumer paces, and for its top keys only ([`crate::engine::key_pace::TOP_KEYS`],
//! the most `429`s, then the most waits) their counts: never one series per key of all keys.

use crate::engine::key_pace::KeyCounts;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConsumerLabel {
    consumer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KeyLabels {
    consumer: String,
    key: String,
}

/// The per-key paces' series.
#[derive(Debug, Default)]
pub struct RateKeyMetrics {
    keys: Family<ConsumerLabel, Gauge>,
    throttled: Family<KeyLabels, Gauge>,
    waits: Family<KeyLabels, Gauge>,
}

impl RateKeyMetrics {
    /// Registers the series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rate_limit_keys",
            "Keys whose pace this instance keeps for the consumer (effect.rate_limit_key)",
            self.keys.clone(),
        );
        registry.register(
            "rate_limit_key_throttled",
            "429 answers for a key since this instance began pacing it, for the 10 keys with the most (effect.rate_limit_key)",
            self.throttled.clone(),
        );
        registry.register(
            "rate_limit_key_waits",
            "Calls a key's pace held back since this instance began pacing it, for the 10 keys with the most 429s, then waits",
            self.waits.clone(),
        );
    }

    /// Sets the series at a scrape: per consumer with `effect.rate_limit_key`, how many keys
    /// it keeps and its top keys' counts; the series of keys that left the top are dropped.
    pub fn set(&self, consumers: &[(String, usize, Vec<KeyCounts>)]) {
        self.throttled.clear();
        self.waits.clear();
        for (c, kept, top) in consumers {
            let consumer = ConsumerLabel {
                consumer: c.clone(),
            };
            self.keys.get_or_create(&consumer).set(*kept as i64);
            for k in top {
                let labels = KeyLabels {
                    consumer: c.clone(),
                    key: k.key.clone(),
                };
                self.throttled
                    .get_or_create(&labels)
                    .set(k.throttled as i64);
                self.waits.get_or_create(&labels).set(k.waits as i64);
            }
        }
    }
}
