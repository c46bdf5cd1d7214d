//! Prometheus metrics (`GET /metrics`), on an explicit registry (no globals, so several
//! workers in one test process do not mix their figures). Labels have bounded cardinality:
//! consumer, outcome, state, status class, action — never message ids or tenants.
//!
//! Counters are counted where things happen; gauges of stored state (open claims, stuck
//! claims, oldest `started` age, sweeper last run) are read from the store at scrape time,
//! from the same cheap queries `report` uses for open work.

use crate::store::{Store, StoreResult};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConsumerLabel {
    consumer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    consumer: String,
    outcome: String,
    status_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    consumer: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    consumer: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: String,
}

/// claimd's metrics.
pub struct Metrics {
    registry: Registry,
    received: Family<ConsumerLabel, Counter>,
    created: Family<ConsumerLabel, Counter>,
    duplicates: Family<ConsumerLabel, Counter>,
    mismatches: Family<ConsumerLabel, Counter>,
    refused: Family<ReasonLabels, Counter>,
    dead_lettered: Family<ReasonLabels, Counter>,
    attempts: Family<OutcomeLabels, Counter>,
    latency: Family<ConsumerLabel, Histogram>,
    settled: Family<StateLabels, Counter>,
    reconciles: Family<ReasonLabels, Counter>,
    resent: Family<ReasonLabels, Counter>,
    sweeper_passes: Counter,
    sweeper_claims: Family<ActionLabel, Counter>,
    pruned: Counter,
    claims: Family<StateLabels, Gauge>,
    stuck: Family<ConsumerLabel, Gauge>,
    oldest: Family<ConsumerLabel, Gauge<f64, AtomicU64>>,
    sweeper_last_run: Gauge<f64, AtomicU64>,
    sweeper_running: Gauge,
    sweeper_running_seconds: Gauge<f64, AtomicU64>,
    uptime: Gauge<f64, AtomicU64>,
    body_bytes: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn consumer(c: &str) -> ConsumerLabel {
    ConsumerLabel {
        consumer: c.to_string(),
    }
}

/// `2xx`, `4xx`, `5xx` or `none` (no answer).
pub fn status_class(status: Option<i32>) -> String {
    match status {
        Some(s) => format!("{}xx", s / 100),
        None => "none".into(),
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("claimd");
        let m = Metrics {
            received: Family::default(),
            created: Family::default(),
            duplicates: Family::default(),
            mismatches: Family::default(),
            refused: Family::default(),
            dead_lettered: Family::default(),
            attempts: Family::default(),
            latency: Family::new_with_constructor(|| {
                Histogram::new([
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ])
            }),
            settled: Family::default(),
            reconciles: Family::default(),
            resent: Family::default(),
            sweeper_passes: Counter::default(),
            sweeper_claims: Family::default(),
            pruned: Counter::default(),
            claims: Family::default(),
            stuck: Family::default(),
            oldest: Family::default(),
            sweeper_last_run: Gauge::default(),
            sweeper_running: Gauge::default(),
            sweeper_running_seconds: Gauge::default(),
            uptime: Gauge::default(),
            body_bytes: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "messages_received",
            "Deliveries that reached intake for a known consumer",
            m.received.clone(),
        );
        registry.register("claims_created", "New claims committed", m.created.clone());
        registry.register(
            "duplicates",
            "Duplicate deliveries recognised (same key, same payload)",
            m.duplicates.clone(),
        );
        registry.register(
            "payload_mismatches",
            "Deliveries that reused a key with another payload",
            m.mismatches.clone(),
        );
        registry.register(
            "messages_refused",
            "Deliveries refused before acknowledgement, by reason",
            m.refused.clone(),
        );
        registry.register(
            "dead_lettered",
            "Broker messages sent to the dead-letter exchange, by reason",
            m.dead_lettered.clone(),
        );
        registry.register(
            "effect_attempts",
            "Calls to the provider by outcome and status class",
            m.attempts.clone(),
        );
        registry.register(
            "effect_duration_seconds",
            "Provider call latency",
            m.latency.clone(),
        );
        registry.register(
            "claims_settled",
            "Claims that left started, by new state",
            m.settled.clone(),
        );
        registry.register(
            "reconcile_outcomes",
            "Status-endpoint answers: found, not_found, unknown",
            m.reconciles.clone(),
        );
        registry.register(
            "resent",
            "Sends of a claim after one whose effect may have happened, by reason",
            m.resent.clone(),
        );
        registry.register(
            "sweeper_passes",
            "Sweeper passes run by this instance",
            m.sweeper_passes.clone(),
        );
        registry.register(
            "sweeper_claims",
            "Claims taken by this instance's sweeper, by action",
            m.sweeper_claims.clone(),
        );
        registry.register(
            "pruned_rows",
            "Terminal claims deleted by retention",
            m.pruned.clone(),
        );
        registry.register(
            "claims",
            "Open claims by state (started, needs_attention), read from the store",
            m.claims.clone(),
        );
        registry.register(
            "stuck_claims",
            "Started claims whose lease expired, read from the store",
            m.stuck.clone(),
        );
        registry.register(
            "oldest_started_age_seconds",
            "Age of the oldest started claim",
            m.oldest.clone(),
        );
        registry.register(
            "sweeper_last_run_timestamp_seconds",
            "Unix time the last sweeper pass by any instance started",
            m.sweeper_last_run.clone(),
        );
        registry.register(
            "sweeper_running",
            "1 while a sweeper pass runs on this instance",
            m.sweeper_running.clone(),
        );
        registry.register(
            "sweeper_pass_running_seconds",
            "How long this instance's running sweeper pass has been running (0: none)",
            m.sweeper_running_seconds.clone(),
        );
        registry.register(
            "uptime_seconds",
            "Time since this worker started (the sweeper's grace period is 3 schedule periods)",
            m.uptime.clone(),
        );
        registry.register(
            "http_body_bytes_in_flight",
            "Bytes of the request-body budget taken by bodies being read or handled",
            m.body_bytes.clone(),
        );
        Metrics { registry, ..m }
    }

    /// A delivery reached intake for `c`.
    pub fn received(&self, c: &str) {
        self.received.get_or_create(&consumer(c)).inc();
    }
    /// A new claim committed.
    pub fn created(&self, c: &str) {
        self.created.get_or_create(&consumer(c)).inc();
    }
    /// A duplicate recognised.
    pub fn duplicate(&self, c: &str) {
        self.duplicates.get_or_create(&consumer(c)).inc();
    }
    /// A payload mismatch.
    pub fn mismatch(&self, c: &str) {
        self.mismatches.get_or_create(&consumer(c)).inc();
    }
    /// A delivery refused before acknowledgement (`bad_id`, `bad_payload`, `busy`, `store`, ...).
    pub fn refused(&self, c: &str, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabels {
                consumer: c.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }
    /// A broker message dead-lettered.
    pub fn dead_lettered(&self, c: &str, reason: &str) {
        self.dead_lettered
            .get_or_create(&ReasonLabels {
                consumer: c.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }
    /// A provider call and how long it took.
    pub fn attempt(&self, c: &str, outcome: &str, status: Option<i32>, seconds: f64) {
        self.attempts
            .get_or_create(&OutcomeLabels {
                consumer: c.to_string(),
                outcome: outcome.to_string(),
                status_class: status_class(status),
            })
            .inc();
        self.latency.get_or_create(&consumer(c)).observe(seconds);
    }
    /// A claim left `started`.
    pub fn settled(&self, c: &str, state: &str) {
        self.settled
            .get_or_create(&StateLabels {
                consumer: c.to_string(),
                state: state.to_string(),
            })
            .inc();
    }
    /// A status-endpoint answer.
    pub fn reconcile(&self, c: &str, outcome: &str) {
        self.reconciles
            .get_or_create(&ReasonLabels {
                consumer: c.to_string(),
                reason: outcome.to_string(),
            })
            .inc();
    }
    /// A claim was sent again after a send whose effect may have happened (`reason`: a
    /// short class such as `unknown_outcome`, `not_found`, `takeover`).
    pub fn resent(&self, c: &str, reason: &str) {
        self.resent
            .get_or_create(&ReasonLabels {
                consumer: c.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }
    /// A sweeper pass ended.
    pub fn sweep_pass(&self) {
        self.sweeper_passes.inc();
    }
    /// The sweeper took a claim and chose `action`.
    pub fn sweep_action(&self, action: &str) {
        self.sweeper_claims
            .get_or_create(&ActionLabel {
                action: action.to_string(),
            })
            .inc();
    }
    /// This worker's own sweeper state, set before a scrape renders.
    pub fn local_sweeper(&self, local: crate::report::LocalSweeper) {
        self.sweeper_running
            .set(i64::from(local.running_for.is_some()));
        self.sweeper_running_seconds
            .set(local.running_for.map_or(0.0, |d| d.as_secs_f64()));
        self.uptime.set(local.uptime.as_secs_f64());
    }
    /// Bytes of the request-body budget in use, set before a scrape renders.
    pub fn body_bytes_in_flight(&self, bytes: usize) {
        self.body_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    /// Retention deleted `n` rows.
    pub fn pruned(&self, n: u64) {
        self.pruned.inc_by(n);
    }

    /// Reads the store-backed gauges and renders everything as Prometheus text.
    pub async fn render(&self, store: &Store, consumers: &[String]) -> StoreResult<String> {
        let open = store.open_counts().await?;
        for name in consumers {
            let c = open
                .iter()
                .find(|c| &c.consumer == name)
                .cloned()
                .unwrap_or_default();
            let label = |state: &str| StateLabels {
                consumer: name.clone(),
                state: state.to_string(),
            };
            self.claims.get_or_create(&label("started")).set(c.started);
            self.claims
                .get_or_create(&label("needs_attention"))
                .set(c.needs_attention);
            self.stuck.get_or_create(&consumer(name)).set(c.stuck);
            self.oldest
                .get_or_create(&consumer(name))
                .set(c.oldest_started_age_s.unwrap_or(0.0));
        }
        if let Some(t) = store.last_sweep().await? {
            self.sweeper_last_run
                .set(t.timestamp_millis() as f64 / 1000.0);
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes_are_bounded() {
        assert_eq!(status_class(Some(200)), "2xx");
        assert_eq!(status_class(Some(503)), "5xx");
        assert_eq!(status_class(None), "none");
    }
}
