//! Prometheus metrics (`GET /metrics`), on an explicit registry (no globals, so several
//! workers in one test process do not mix their figures). Labels have bounded cardinality:
//! consumer, outcome, state, status class, action — never message ids or tenants.
//!
//! Counters are counted where things happen; gauges of stored state (open claims, stuck
//! claims, oldest `started` age, sweeper last run) are read from the store at scrape time,
//! from the same cheap queries `report` uses for open work.

pub mod ledger;
pub mod outbox;
pub mod rate_keys;
pub mod replication;
pub mod schedules;
pub mod storage;
pub mod vanished;
pub mod waits;

pub use vocabulary::status_class;

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
    dead_letter_unconfirmed: Family<ConsumerLabel, Counter>,
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
    oldest_pending: Family<ConsumerLabel, Gauge<f64, AtomicU64>>,
    sweeper_last_run: Gauge<f64, AtomicU64>,
    sweeper_running: Gauge,
    sweeper_running_seconds: Gauge<f64, AtomicU64>,
    uptime: Gauge<f64, AtomicU64>,
    body_bytes: Gauge,
    waiting: Family<ConsumerLabel, Gauge>,
    destination_state: Family<StateLabels, Gauge>,
    destination_rate: Family<ConsumerLabel, Gauge<f64, AtomicU64>>,
    destination_resumes: Family<ConsumerLabel, Gauge<f64, AtomicU64>>,
    destination_held: Family<ReasonLabels, Counter>,
    provider_events: Family<ReasonLabels, Counter>,
    /// The ledger reconciliation's series.
    pub ledger: ledger::LedgerMetrics,
    /// The store's tables and vacuum.
    pub storage: storage::StorageMetrics,
    /// The outcome relay's series.
    pub outbox: outbox::OutboxMetrics,
    /// The per-key paces' series (`effect.rate_limit_key`).
    pub rate_keys: rate_keys::RateKeyMetrics,
    /// The scheduled and in-line claims' series.
    pub waits: waits::WaitMetrics,
    /// The store's replication series.
    pub replication: replication::ReplicationMetrics,
    /// The `Prefer: wait` waiters' series.
    pub waiters: crate::engine::waiters::WaiterMetrics,
    /// The series of claims that vanished from the store.
    pub vanished: vanished::VanishedMetrics,
    /// The periodic schedules' series.
    pub schedules: schedules::ScheduleMetrics,
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
            dead_letter_unconfirmed: Family::default(),
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
            oldest_pending: Family::default(),
            sweeper_last_run: Gauge::default(),
            sweeper_running: Gauge::default(),
            sweeper_running_seconds: Gauge::default(),
            uptime: Gauge::default(),
            body_bytes: Gauge::default(),
            waiting: Family::default(),
            destination_state: Family::default(),
            destination_rate: Family::default(),
            destination_resumes: Family::default(),
            destination_held: Family::default(),
            provider_events: Family::default(),
            ledger: Default::default(),
            storage: Default::default(),
            outbox: Default::default(),
            rate_keys: Default::default(),
            waits: Default::default(),
            replication: Default::default(),
            waiters: Default::default(),
            vanished: Default::default(),
            schedules: Default::default(),
            registry: Registry::default(),
        };
        m.outbox.register(&mut registry);
        m.ledger.register(&mut registry);
        m.storage.register(&mut registry);
        m.rate_keys.register(&mut registry);
        m.waits.register(&mut registry);
        m.replication.register(&mut registry);
        m.waiters.register(&mut registry);
        m.vanished.register(&mut registry);
        m.schedules.register(&mut registry);
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
            "dead_letter_unconfirmed",
            "Dead-letter publishes the broker did not confirm (no queue bound, nack, channel lost); each requeues its message, which comes back",
            m.dead_letter_unconfirmed.clone(),
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
            "Open claims by state (started, pending, needs_attention), read from the store",
            m.claims.clone(),
        );
        registry.register(
            "stuck_claims",
            "Started claims whose lease expired, read from the store",
            m.stuck.clone(),
        );
        registry.register(
            "oldest_started_age_seconds",
            "Age of the oldest started claim in flight or stuck (from its scheduled time for a scheduled send; claims waiting in a line or for their time left out)",
            m.oldest.clone(),
        );
        registry.register(
            "oldest_pending_age_seconds",
            "How long the oldest pending claim (accepted by the provider, not final) has been pending",
            m.oldest_pending.clone(),
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
        registry.register(
            "waiting_claims",
            "Started claims that wait, not stuck: for their provider (down, rate limited, or a lookup without an answer), in their order key's line, or for their scheduled time; read from the store",
            m.waiting.clone(),
        );
        registry.register(
            "destination_state",
            "1 for the state of this instance's circuit breaker for the consumer's provider: closed, open or probing",
            m.destination_state.clone(),
        );
        registry.register(
            "destination_rate_per_second",
            "Requests per second this instance may send the consumer's provider now (0: no limit)",
            m.destination_rate.clone(),
        );
        registry.register(
            "destination_resumes_in_seconds",
            "Seconds until the next probe of an open provider, or until its Retry-After pause ends (0: sending)",
            m.destination_resumes.clone(),
        );
        registry.register(
            "destination_held",
            "Calls and lookups held back without a request, by reason: open, probing, pace",
            m.destination_held.clone(),
        );
        registry.register(
            "provider_events",
            "Provider events (webhooks) received, by what came of them: settled, same, stale, conflict, unmapped, duplicate, ignored, unknown_object, foreign_object, other_object, or refused (unsigned, bad_signature, expired, malformed)",
            m.provider_events.clone(),
        );
        Metrics { registry, ..m }
    }

    /// A provider event for `c` came to `result` (see the metric's help).
    pub fn provider_event(&self, c: &str, result: &str) {
        self.provider_events
            .get_or_create(&ReasonLabels {
                consumer: c.to_string(),
                reason: result.to_string(),
            })
            .inc();
    }

    /// A call or lookup of `c` was held back by its destination (`open`, `probing`, `pace`).
    pub fn held(&self, c: &str, reason: &str) {
        self.destination_held
            .get_or_create(&ReasonLabels {
                consumer: c.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Sets the destination gauges from this instance's breakers and paces.
    pub fn destinations(
        &self,
        statuses: &[(String, crate::engine::destination::DestinationStatus)],
    ) {
        for (c, s) in statuses {
            for state in vocabulary::BREAKER_STATES {
                self.destination_state
                    .get_or_create(&StateLabels {
                        consumer: c.clone(),
                        state: (*state).to_string(),
                    })
                    .set(i64::from(s.state.as_str() == *state));
            }
            self.destination_rate
                .get_or_create(&consumer(c))
                .set(s.rate.unwrap_or(0.0));
            self.destination_resumes
                .get_or_create(&consumer(c))
                .set(s.resumes_in.map_or(0.0, |d| d.as_secs_f64()));
        }
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
    /// A dead-letter publish not confirmed (its message requeued).
    pub fn dead_letter_unconfirmed(&self, c: &str) {
        self.dead_letter_unconfirmed
            .get_or_create(&consumer(c))
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
    pub fn local_sweeper(&self, local: crate::engine::sweep_activity::LocalSweeper) {
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

    /// Creates every consumer's labelled series at zero, so a series exists from start and
    /// `rate()` and `increase()` see its first event (a series born at its first event is
    /// invisible to them). Label values are the bounded vocabularies of [`vocabulary`].
    pub fn init_consumers(&self, consumers: &[String]) {
        for c in consumers {
            let label = consumer(c);
            for family in [
                &self.received,
                &self.created,
                &self.duplicates,
                &self.mismatches,
                &self.dead_letter_unconfirmed,
            ] {
                let _ = family.get_or_create(&label);
            }
            let _ = self.latency.get_or_create(&label);
            let reasons = |family: &Family<ReasonLabels, Counter>, names: &[&str]| {
                for name in names {
                    let _ = family.get_or_create(&ReasonLabels {
                        consumer: c.clone(),
                        reason: (*name).to_string(),
                    });
                }
            };
            reasons(&self.refused, vocabulary::REFUSED);
            reasons(&self.dead_lettered, vocabulary::DEAD_LETTERED);
            reasons(&self.reconciles, vocabulary::LOOKUPS);
            reasons(&self.destination_held, vocabulary::HELD);
            let _ = self.waiting.get_or_create(&label);
            let closed = crate::engine::destination::Destination::new(None).status();
            self.destinations(&[(c.clone(), closed)]);
            for state in vocabulary::SETTLED {
                let _ = self.settled.get_or_create(&StateLabels {
                    consumer: c.clone(),
                    state: (*state).to_string(),
                });
            }
            for (outcome, class) in vocabulary::ATTEMPTS {
                let _ = self.attempts.get_or_create(&OutcomeLabels {
                    consumer: c.clone(),
                    outcome: (*outcome).to_string(),
                    status_class: (*class).to_string(),
                });
            }
        }
        for action in vocabulary::SWEEP_ACTIONS {
            let _ = self.sweeper_claims.get_or_create(&ActionLabel {
                action: (*action).to_string(),
            });
        }
    }

    /// Reads the store-backed gauges and renders everything in `format`.
    pub async fn render(
        &self,
        store: &Store,
        consumers: &[String],
        format: Exposition,
    ) -> StoreResult<String> {
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
            self.claims.get_or_create(&label("pending")).set(c.pending);
            self.oldest_pending
                .get_or_create(&consumer(name))
                .set(c.oldest_pending_age_s.unwrap_or(0.0));
            self.claims
                .get_or_create(&label("needs_attention"))
                .set(c.needs_attention);
            self.stuck.get_or_create(&consumer(name)).set(c.stuck);
            self.waiting.get_or_create(&consumer(name)).set(c.waiting);
            self.waits.set(name, &c);
            self.oldest
                .get_or_create(&consumer(name))
                .set(c.oldest_started_age_s.unwrap_or(0.0));
        }
        self.outbox
            .read(store, &store.outcome_destinations())
            .await?;
        if let Some(t) = store.last_sweep().await? {
            self.sweeper_last_run
                .set(t.timestamp_millis() as f64 / 1000.0);
        }
        self.ledger.read(store).await?;
        self.storage.read(store).await?;
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        Ok(match format {
            Exposition::OpenMetrics => out,
            Exposition::Text => openmetrics_to_text(&out),
        })
    }
}

pub mod vocabulary;

/// Which exposition format `/metrics` answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// The Prometheus text format 0.0.4 (`text/plain; version=0.0.4`), the default.
    Text,
    /// OpenMetrics 1.0 text, for a scraper whose `Accept` asks for it.
    OpenMetrics,
}

impl Exposition {
    /// Chooses from an `Accept` header: OpenMetrics only when asked for by name.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Exposition::OpenMetrics,
            _ => Exposition::Text,
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::Text => "text/plain; version=0.0.4; charset=utf-8",
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Rewrites OpenMetrics text as the Prometheus text format 0.0.4: a counter's `# HELP` and
/// `# TYPE` name the family as its samples do (with `_total`), and the OpenMetrics-only lines
/// (`# UNIT`, `# EOF`) go. Everything else is the same in both formats.
pub fn openmetrics_to_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_format_names_counter_families_with_total_and_drops_eof() {
        let om = "# HELP a_total_x Things.\n# TYPE a_total_x counter\na_total_x_total{c=\"p\"} 0\n\
                  # HELP g A gauge.\n# TYPE g gauge\ng 1\n# UNIT g seconds\n# EOF\n";
        let text = openmetrics_to_text(om);
        assert_eq!(
            text,
            "# HELP a_total_x_total Things.\n# TYPE a_total_x_total counter\n\
             a_total_x_total{c=\"p\"} 0\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n"
        );
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        assert_eq!(Exposition::negotiate(None), Exposition::Text);
        assert_eq!(Exposition::negotiate(Some("text/plain")), Exposition::Text);
        assert_eq!(
            Exposition::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
            )),
            Exposition::OpenMetrics
        );
    }

    #[test]
    fn every_consumer_series_exists_at_zero_from_start() {
        let m = Metrics::new();
        m.init_consumers(&["payments".to_string()]);
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &m.registry).unwrap();
        for series in [
            "claimd_dead_lettered_total{consumer=\"payments\",reason=\"invalid_message_id\"} 0",
            "claimd_claims_settled_total{consumer=\"payments\",state=\"failed\"} 0",
            "claimd_messages_received_total{consumer=\"payments\"} 0",
            "claimd_effect_attempts_total{consumer=\"payments\",outcome=\"not_applied\",status_class=\"5xx\"} 0",
        ] {
            assert!(om.contains(series), "{series} missing from\n{om}");
        }
    }

    #[test]
    fn status_classes_are_bounded() {
        assert_eq!(status_class(Some(200)), "2xx");
        assert_eq!(status_class(Some(503)), "5xx");
        assert_eq!(status_class(None), "none");
    }
}
