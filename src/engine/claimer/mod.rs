//! The claimer: claim (committed alone) → perform → settle.
//!
//! Intake hands a [`Delivery`] to [`Claimer::submit`]. The claim row commits before anything
//! else happens (I1); the caller acknowledges; a task then drives the effect under the claim's
//! attempt number, retrying transient failures with backoff while the lease lasts, and settles
//! fenced on that attempt (I2). What it cannot finish stays `started` for the sweeper.
//!
//! By role: `submit` (intake's way in, up to the committed claim and the caller's answer),
//! `drive` (one attempt: calls, retries, the settle); this file holds the [`Claimer`] itself,
//! its consumers and the shutdown drain. Capacity (call slots, intake places) is in
//! [`crate::engine::consumer`].

use crate::domain::claim::{
    Claim, IdError, NewClaim, new_claim_token, validate_content_type, validate_message_id,
    validate_tenant,
};
use crate::engine::consumer::Admission;
pub use crate::engine::consumer::{Consumer, Hold, Slot};
use crate::engine::follow_ups::FollowUpPlan;
use crate::engine::metrics::Metrics;
use crate::engine::policy::{self, Step};
pub use crate::engine::settle::AttemptEnd;
use crate::engine::settle::{Resend, Settler, by_answer, error_of, failed};
use crate::engine::traces::{Step as TraceStep, Traces};
use crate::provider::effect::{Lookup, Outcome};
use crate::store::replication::ReplicationWatch;
use crate::store::writes::WriteHealth;
use crate::store::{ClaimOutcome, Store, StoreError};
use backon::BackoffBuilder;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, info};

pub(crate) mod drive;
pub mod lookup;
mod submit;

pub(crate) use submit::check_payload;
pub use submit::{Accepted, Delivery, SubmitError};

/// Claims deliveries and drives their effects.
pub struct Claimer {
    store: Store,
    settler: Settler,
    consumers: BTreeMap<String, Arc<Consumer>>,
    instance: String,
    intake_wait: Duration,
    accepting: AtomicBool,
    metrics: Arc<Metrics>,
    writes: WriteHealth,
    replication: ReplicationWatch,
    traces: Traces,
}

impl std::fmt::Debug for Claimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claimer")
            .field("instance", &self.instance)
            .field("consumers", &self.consumers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Claimer {
    /// A claimer over `store` for `consumers`, named `instance` in leases and history, its
    /// messages' steps traced to `traces`.
    pub fn new(
        store: Store,
        consumers: Vec<Arc<Consumer>>,
        instance: String,
        intake_wait: Duration,
        traces: Traces,
    ) -> Self {
        let metrics = Arc::new(Metrics::new());
        let names: Vec<String> = consumers.iter().map(|c| c.name().to_string()).collect();
        metrics.init_consumers(&names);
        metrics.vanished.init(&names);
        Claimer {
            settler: Settler::new(store.clone(), instance.clone(), metrics.clone())
                .with_traces(traces.clone())
                .with_follow_ups(Arc::new(FollowUpPlan::new(&consumers))),
            store,
            consumers: consumers
                .into_iter()
                .map(|c| (c.name().to_string(), c))
                .collect(),
            instance,
            intake_wait,
            accepting: AtomicBool::new(true),
            metrics,
            writes: WriteHealth::default(),
            replication: ReplicationWatch::default(),
            traces,
        }
    }

    /// Where this instance's messages are traced.
    pub fn traces(&self) -> &Traces {
        &self.traces
    }

    /// This instance's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Whether this instance's store writes succeed (claims, sweeper heartbeats), for
    /// readiness.
    pub fn writes(&self) -> &WriteHealth {
        &self.writes
    }

    /// The store's latest replication reading, and whether intake requires a synchronous
    /// standby (`[store] require_synchronous_standby`).
    pub fn replication(&self) -> &ReplicationWatch {
        &self.replication
    }

    /// Where this instance's attempts are settled.
    pub fn settler(&self) -> &Settler {
        &self.settler
    }

    /// This instance's name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// A consumer by name.
    pub fn consumer(&self, name: &str) -> Option<&Arc<Consumer>> {
        self.consumers.get(name)
    }

    /// Every consumer.
    pub fn consumers(&self) -> impl Iterator<Item = &Arc<Consumer>> {
        self.consumers.values()
    }

    /// Whether new deliveries are taken.
    pub fn is_accepting(&self) -> bool {
        self.accepting.load(Ordering::SeqCst)
    }

    /// Stops taking deliveries (graceful shutdown).
    pub fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::SeqCst);
    }

    /// Waits until no effect is in flight, or `grace` passes. Returns how many were still
    /// running (they stay `started`; the sweeper owns them).
    pub async fn drain(&self, grace: Duration) -> usize {
        let deadline = Instant::now() + grace;
        loop {
            let busy: usize = self
                .consumers
                .values()
                .map(|c| c.queued() + c.in_flight() + c.settling())
                .sum();
            if busy == 0 || Instant::now() >= deadline {
                return busy;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::claim::NewClaim;

    /// Every claim in a provider call keeps its task and its attempt's future for as long as
    /// the call lasts: at 10,000 calls in flight, each 100 bytes of them is a megabyte. In a
    /// release build they are 632 and 440 bytes (2,344 and 1,416 with `#[instrument]` on the
    /// two functions and the claim's and the settle's states kept across the call). These
    /// bounds, loose enough for a debug build, catch such a change coming back.
    #[tokio::test]
    async fn a_claim_in_a_call_keeps_little_memory() {
        let (_dir, claimer, consumer, new) = payments().await;
        let ClaimOutcome::Created(claim) = claimer.store.claim(&new).await.unwrap() else {
            panic!("not created")
        };
        let attempt = claimer.drive(&consumer, &claim, Hold::fresh(), None, Slot::none());
        let attempt_size = std::mem::size_of_val(&attempt);
        drop(attempt);
        let (answer, _answered) = oneshot::channel();
        let admission = Admission::Slot(consumer.slot().await);
        let task = claimer
            .clone()
            .claim_and_perform(consumer.clone(), new, admission, answer, ());
        let task_size = std::mem::size_of_val(&task);
        drop(task);
        assert!(
            attempt_size <= 1024,
            "an attempt's future is {attempt_size} bytes"
        );
        assert!(task_size <= 1024, "a claim's task is {task_size} bytes");
    }

    /// Only an ordered claim's attempt wakes the pickup when it ends: a plain consumer's
    /// pickup, woken at every attempt, ran a take statement (and held the consumer's free
    /// intake places) once per message for nothing.
    #[tokio::test]
    async fn only_an_ordered_claims_attempt_wakes_the_pickup() {
        let (_dir, claimer, consumer, new) = payments().await;
        let ClaimOutcome::Created(claim) = claimer.store.claim(&new).await.unwrap() else {
            panic!("not created")
        };
        let bell = consumer.pickup_bell();
        let rang = || tokio::time::timeout(Duration::from_millis(50), bell.notified());

        drop(drive::LineWake::of(&consumer, &claim));
        assert!(
            rang().await.is_err(),
            "a plain claim's attempt woke the pickup"
        );

        let mut ordered = claim.clone();
        ordered.order_key = Some("order-1".into());
        drop(drive::LineWake::of(&consumer, &ordered));
        assert!(
            rang().await.is_ok(),
            "an ordered claim's attempt did not wake the pickup"
        );
    }

    /// The default configuration's `payments` consumer on a fresh SQLite store, its claimer,
    /// and a new claim of it (message `m-1`, no order key); the folder holds the database.
    async fn payments() -> (tempfile::TempDir, Arc<Claimer>, Arc<Consumer>, NewClaim) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("claims.db").display());
        let text = include_str!("../../../config/default.toml");
        let env = [("CLAIMD__STORE__URL".to_string(), url)];
        let config = crate::config::Config::from_toml(text, "default.toml".as_ref(), env)
            .unwrap()
            .config;
        let app = crate::service::app::App::open(config, true).await.unwrap();
        let claimer = app.claimer.clone();
        let consumer = claimer.consumer("payments").unwrap().clone();
        let new = NewClaim {
            consumer: "payments".into(),
            tenant: String::new(),
            message_id: "m-1".into(),
            idem_key: "payments:m-1".into(),
            fingerprint: crate::domain::claim::fingerprint(b"{}"),
            payload: bytes::Bytes::from_static(b"{}"),
            content_type: "application/json".into(),
            worker: "w".into(),
            lease: Duration::from_secs(60),
            claim_token: new_claim_token(),
            mark_not_called: false,
            order_key: None,
            not_before: None,
            trace_parent: None,
            priority: 0,
        };
        (dir, claimer, consumer, new)
    }
}
