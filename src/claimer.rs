//! The claimer: claim (committed alone) → perform → settle.
//!
//! Intake hands a [`Delivery`] to [`Claimer::submit`]. The claim row commits before anything
//! else happens (I1); the caller acknowledges; a task then drives the effect under the claim's
//! attempt number, retrying transient failures with backoff while the lease lasts, and settles
//! fenced on that attempt (I2). What it cannot finish stays `started` for the sweeper.

use crate::claim::{
    Claim, ClaimState, IdError, NewClaim, fingerprint, new_claim_token, validate_content_type,
    validate_message_id, validate_tenant,
};
use crate::consumer::Admission;
pub use crate::consumer::{Consumer, Hold, Slot};
use crate::effect::{Lookup, Outcome};
use crate::metrics::Metrics;
use crate::policy::{self, Step};
pub use crate::settle::AttemptEnd;
use crate::settle::{Resend, Settler, completed, error_of, failed};
use crate::store::{ClaimOutcome, Store, StoreError};
use backon::BackoffBuilder;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, info, instrument};

/// One message as intake received it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Consumer name (URL path or broker binding).
    pub consumer: String,
    /// Tenant bytes (`b""` for none).
    pub tenant: Vec<u8>,
    /// Message id bytes, as received.
    pub message_id: Vec<u8>,
    /// Payload, verbatim.
    pub payload: bytes::Bytes,
    /// Content type bytes, verbatim (checked before claiming).
    pub content_type: Vec<u8>,
}

/// The claim was accepted: acknowledge.
#[derive(Debug, Clone)]
pub enum Accepted {
    /// A new claim committed; the effect is under way.
    New(Claim),
    /// A duplicate of an existing claim with the same payload.
    Duplicate(Claim),
}

impl Accepted {
    /// The claim, new or existing.
    pub fn claim(&self) -> &Claim {
        match self {
            Accepted::New(c) | Accepted::Duplicate(c) => c,
        }
    }
}

/// Why a delivery was not accepted. Nothing was committed except for `Conflict`, which only
/// counted the mismatch on the existing claim.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// No consumer of that name takes this source.
    #[error("unknown consumer {0:?}")]
    UnknownConsumer(String),
    /// The message id or tenant is unusable.
    #[error("{0}")]
    BadId(#[from] IdError),
    /// The same key was used with another payload (I5).
    #[error("message id {message_id:?} was already used with a different payload")]
    Conflict {
        /// The existing claim.
        claim: Box<Claim>,
        /// The id in question.
        message_id: String,
    },
    /// Every in-flight slot stayed busy for `intake_wait`: try again later.
    #[error("consumer {0:?} is at its concurrency limit; retry later")]
    Busy(String),
    /// The worker is shutting down and takes no new work.
    #[error("claimd is shutting down; retry against another instance or later")]
    ShuttingDown,
    /// The store failed; nothing was committed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The consumer's effect cannot use this payload (checked before claiming: nothing was
    /// committed).
    #[error("{0}")]
    BadPayload(String),
    /// The content type cannot be stored and sent to the provider (checked before claiming).
    #[error("{0}")]
    BadContentType(String),
    /// A tenant was given to a consumer whose key template does not contain `{tenant}`: two
    /// tenants' messages with one id would be sent under one provider key, and one of them
    /// would never happen.
    #[error(
        "consumer {consumer:?} does not key on tenants (key template {template:?} lacks {{tenant}}): send no tenant, or add {{tenant}} to its key"
    )]
    TenantNotKeyed {
        /// The consumer.
        consumer: String,
        /// Its key template.
        template: String,
    },
    /// The rendered idempotency key is longer than the provider accepts (`max_key_length`):
    /// acknowledged, it could never be performed.
    #[error(
        "the idempotency key for this message would be {len} characters (key template {template:?}); the provider's limit is {max} (effect.max_key_length): use a shorter message id or tenant"
    )]
    KeyTooLong {
        /// Length of the rendered key.
        len: usize,
        /// The effect's limit.
        max: usize,
        /// The consumer's key template.
        template: String,
    },
    /// The claim was interrupted before its outcome was known (the worker's task failed):
    /// retry; a committed claim makes the retry a duplicate.
    #[error("the claim was interrupted before its outcome was known; retry")]
    Interrupted,
}

/// Claims deliveries and drives their effects.
pub struct Claimer {
    store: Store,
    settler: Settler,
    consumers: BTreeMap<String, Arc<Consumer>>,
    instance: String,
    intake_wait: Duration,
    accepting: AtomicBool,
    metrics: Arc<Metrics>,
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
    /// A claimer over `store` for `consumers`, named `instance` in leases and history.
    pub fn new(
        store: Store,
        consumers: Vec<Arc<Consumer>>,
        instance: String,
        intake_wait: Duration,
    ) -> Self {
        let metrics = Arc::new(Metrics::new());
        Claimer {
            settler: Settler::new(store.clone(), instance.clone(), metrics.clone()),
            store,
            consumers: consumers
                .into_iter()
                .map(|c| (c.name().to_string(), c))
                .collect(),
            instance,
            intake_wait,
            accepting: AtomicBool::new(true),
            metrics,
        }
    }

    /// This instance's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
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

    /// Claims a delivery and, when it is new, starts its effect in the background.
    ///
    /// Returns once the claim is committed (or recognised as a duplicate): the caller may
    /// acknowledge then, and not before. Dropping the returned future (a client that hangs
    /// up, a broker handler that is aborted) never separates a committed claim from its
    /// effect: from the claim statement on, the work runs in a task of its own.
    pub async fn submit(self: &Arc<Self>, d: Delivery) -> Result<Accepted, SubmitError> {
        if !self.is_accepting() {
            return Err(SubmitError::ShuttingDown);
        }
        let consumer = self
            .consumers
            .get(&d.consumer)
            .ok_or_else(|| SubmitError::UnknownConsumer(d.consumer.clone()))?
            .clone();
        let m = &self.metrics;
        m.received(&d.consumer);
        let (message_id, tenant) = match (
            validate_message_id(&d.message_id),
            validate_tenant(&d.tenant),
        ) {
            (Ok(id), Ok(t)) => (id.to_string(), t.to_string()),
            (Err(e), _) | (_, Err(e)) => {
                m.refused(&d.consumer, "bad_id");
                return Err(e.into());
            }
        };
        if !tenant.is_empty() && !consumer.template.mentions_tenant() {
            m.refused(&d.consumer, "bad_id");
            return Err(SubmitError::TenantNotKeyed {
                consumer: d.consumer,
                template: consumer.config.key.clone(),
            });
        }
        let content_type = match validate_content_type(&d.content_type) {
            Ok(ct) => ct.to_string(),
            Err(why) => {
                m.refused(&d.consumer, "bad_content_type");
                return Err(SubmitError::BadContentType(why));
            }
        };
        if let Err(why) = consumer.effect.validate(&d.payload, &content_type) {
            m.refused(&d.consumer, "bad_payload");
            return Err(SubmitError::BadPayload(why));
        }
        let idem_key = consumer
            .template
            .render(&consumer.config.name, &tenant, &message_id);
        let max = consumer.config.effect.max_key_length();
        if idem_key.len() > max {
            m.refused(&d.consumer, "key_too_long");
            return Err(SubmitError::KeyTooLong {
                len: idem_key.len(),
                max,
                template: consumer.config.key.clone(),
            });
        }
        // Backpressure: a place first, so the backlog waits in the client or the broker, never
        // in memory here. Claiming ahead (policy::claims_ahead): an intake place now, the call
        // slot after the claim commits, so claims for the next calls commit while the current
        // ones run and a claim's commit does not lengthen each slot's turn. Otherwise the call
        // slot before claiming. Waiting here may be cancelled: nothing is committed yet.
        let admission = if consumer.claims_ahead() {
            tokio::time::timeout(self.intake_wait, consumer.intake_place())
                .await
                .map(Admission::Place)
        } else {
            tokio::time::timeout(self.intake_wait, consumer.slot())
                .await
                .map(Admission::Slot)
        };
        let Ok(admission) = admission else {
            m.refused(&d.consumer, "busy");
            return Err(SubmitError::Busy(d.consumer.clone()));
        };
        let new = NewClaim {
            consumer: d.consumer,
            tenant,
            message_id,
            idem_key,
            fingerprint: fingerprint(&d.payload),
            payload: d.payload,
            content_type,
            worker: self.instance.clone(),
            lease: consumer.config.lease.0,
            claim_token: new_claim_token(),
            mark_not_called: !consumer.claims_ahead(),
        };
        // From the claim statement on, the work must not be cancellable: the statement may
        // commit whatever happens to this caller, and a committed claim must be performed by
        // the worker that holds its lease. So it runs detached and only its answer comes back.
        let (answer, answered) = oneshot::channel();
        let this = self.clone();
        tokio::spawn(async move {
            this.claim_and_perform(consumer, new, admission, answer)
                .await
        });
        answered.await.unwrap_or(Err(SubmitError::Interrupted))
    }

    /// Commits the claim, sends the answer for the caller to acknowledge, then performs the
    /// claim if it is new. Runs detached from the caller (see [`Claimer::submit`]).
    #[instrument(skip_all, fields(consumer = %new.consumer, tenant = %new.tenant, message_id = %new.message_id))]
    async fn claim_and_perform(
        self: Arc<Self>,
        consumer: Arc<Consumer>,
        new: NewClaim,
        admission: Admission,
        answer: oneshot::Sender<Result<Accepted, SubmitError>>,
    ) {
        let m = &self.metrics;
        // The database starts the lease inside the statement; the local clock starts before
        // it, so this worker's deadline never falls after the lease the database recorded.
        let hold = Hold::fresh();
        let claim = match self.store.claim(&new).await {
            Ok(ClaimOutcome::Created(mut claim)) => {
                m.created(&new.consumer);
                // Intake answers from the claim's identity and state: it gets no copy of the
                // payload (a backlog of large bodies would otherwise be held twice).
                let payload = std::mem::take(&mut claim.payload);
                let _ = answer.send(Ok(Accepted::New(claim.clone())));
                claim.payload = payload;
                claim
            }
            Ok(ClaimOutcome::Duplicate(claim)) => {
                m.duplicate(&new.consumer);
                let _ = answer.send(Ok(Accepted::Duplicate(claim)));
                return;
            }
            Ok(ClaimOutcome::Mismatch(claim)) => {
                m.mismatch(&new.consumer);
                let _ = answer.send(Err(SubmitError::Conflict {
                    message_id: new.message_id,
                    claim: Box::new(claim),
                }));
                return;
            }
            Err(e) => {
                m.refused(&new.consumer, "store_unavailable");
                let _ = answer.send(Err(e.into()));
                match self.adopt(&consumer, &new, hold).await {
                    Some(claim) => {
                        m.created(&new.consumer);
                        claim
                    }
                    None => return,
                }
            }
        };
        // The claim carries the payload from here on; the delivery's copy is not needed.
        drop(new);
        let permit = match admission {
            Admission::Place(place) => {
                let slot = consumer.slot().await;
                drop(place);
                slot
            }
            Admission::Slot(slot) => slot,
        };
        let slot = Slot::held(permit, &consumer);
        self.drive(&consumer, &claim, hold, None, slot).await;
    }

    /// After a claim statement failed, it may still have committed (the connection was cut
    /// after the commit, before its reply). Looks for the row this call inserted until the
    /// store answers or the lease leaves no time for a call, and returns it when it is ours
    /// and untouched, so it is performed now instead of waiting a lease for the sweeper,
    /// which would have to treat it as an unknown outcome (and park it under `park`).
    async fn adopt(&self, consumer: &Consumer, new: &NewClaim, hold: Hold) -> Option<Claim> {
        let deadline = hold.call_deadline(&consumer.config);
        let mut delay = Duration::from_millis(100);
        while Instant::now() + delay < deadline {
            tokio::time::sleep(delay).await;
            match self
                .store
                .get(&new.consumer, &new.tenant, &new.message_id)
                .await
            {
                Ok(Some(c))
                    if new.inserted(&c) && c.state == ClaimState::Started && c.attempt == 1 =>
                {
                    info!("the claim committed although its statement failed; performing it");
                    return Some(c);
                }
                Ok(_) => return None,
                Err(_) => delay = (delay * 2).min(Duration::from_secs(2)),
            }
        }
        None
    }

    /// Drives one attempt of `claim` (whose `attempt` this worker holds): calls the provider,
    /// retries while the lease allows, settles fenced. `hold` says when the lease was
    /// (re)newed and how old the claim was then. `resend` says why the first call is a re-send
    /// after a send that may have applied (counted, and refused past `max_sends`). `slot` is
    /// released once the provider has answered, before the settle.
    #[instrument(skip_all, fields(consumer = %claim.consumer, tenant = %claim.tenant, message_id = %claim.message_id, attempt = claim.attempt))]
    pub async fn drive(
        &self,
        consumer: &Consumer,
        claim: &Claim,
        hold: Hold,
        resend: Option<Resend>,
        mut slot: Slot,
    ) -> AttemptEnd {
        let cfg = &consumer.config;
        let deadline = hold.call_deadline(cfg);
        // A settle that meets a store error is retried a while past the last call's start: the
        // outcome is known here and lost if the sweeper must decide again.
        let settle_until = Some(deadline + Duration::from_secs(30));
        let mut delays = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(5))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build();
        if Instant::now() >= deadline {
            // Waited too long for a slot: a call now could outlive the lease and overlap
            // another worker's takeover. Hand it to the sweeper, saying that nothing was
            // called, so it performs the claim instead of treating the attempt as unknown
            // (which would park it under `on_unknown = "park"`).
            return self
                .settler
                .hand_off(
                    &mut slot,
                    claim,
                    "lease too short to start the call (waited for a slot); not called",
                    None,
                    true,
                )
                .await;
        }
        if claim.attempt == 1 && !consumer.claims_ahead() {
            // The claim was committed with a "not called yet" marker (see
            // NewClaim::mark_not_called): it goes now, fenced, before the first call.
            match self.store.mark_called(claim.id, claim.attempt).await {
                Ok(true) => {}
                Ok(false) => {
                    info!("claim was taken over before its first call; left it alone");
                    return AttemptEnd::Lost;
                }
                Err(e) => {
                    // Nothing sent, and the marker still says so to the sweeper.
                    let why = format!("store unavailable before the first call ({e}); not called");
                    return self
                        .settler
                        .hand_off(&mut slot, claim, &why, None, true)
                        .await;
                }
            }
        }
        let mut resent = claim.resent_count;
        let mut next_is_resend = resend;
        loop {
            if let Some(why) = next_is_resend.take()
                && let Err(end) = self
                    .settler
                    .resend_or_end(
                        &mut slot,
                        claim,
                        why,
                        &mut resent,
                        cfg.max_sends,
                        settle_until,
                    )
                    .await
            {
                return end;
            }
            let called = Instant::now();
            let outcome = consumer.effect.perform(claim).await;
            self.metrics.attempt(
                &cfg.name,
                outcome.name(),
                outcome.status(),
                called.elapsed().as_secs_f64(),
            );
            debug!(outcome = outcome.name(), status = ?outcome.status(), "provider answered");
            let step =
                policy::after_outcome(&outcome, cfg.on_unknown, consumer.effect.can_reconcile());
            let error = error_of(&outcome);
            // The previous call's line in the history, before whatever follows it.
            let note_call = || {
                self.settler.note(
                    claim,
                    "perform",
                    outcome.name(),
                    outcome.status(),
                    Some(&error),
                )
            };
            let mut noted = false;
            // `resend`: the next send repeats one whose effect may have happened, which is
            // safe only while the provider keeps the key (I6), and is counted and capped.
            let (retry_after, not_applied, resend) = match step {
                Step::Complete => {
                    let (status, response) = match &outcome {
                        Outcome::Applied { status, response } => (*status, response.clone()),
                        _ => unreachable!("Complete follows Applied"),
                    };
                    return self
                        .settler
                        .settle(
                            &mut slot,
                            claim,
                            settle_until,
                            completed(status, response, false),
                            "perform",
                            "applied",
                        )
                        .await;
                }
                Step::Fail => {
                    let (status, response) = match &outcome {
                        Outcome::Rejected { status, response } => (*status, response.clone()),
                        _ => unreachable!("Fail follows Rejected"),
                    };
                    let s = failed(status, response);
                    return self
                        .settler
                        .settle(&mut slot, claim, settle_until, s, "perform", "rejected")
                        .await;
                }
                Step::Park(reason) => {
                    return self
                        .settler
                        .park_unknown(&mut slot, claim, settle_until, reason, outcome.status())
                        .await;
                }
                Step::Retry { retry_after } => (retry_after, true, None),
                Step::Resend => (None, false, Some(Resend::UnknownOutcome)),
                Step::Reconcile => {
                    // The unknown call goes into the history before the lookup that decides it.
                    note_call().await;
                    match self
                        .reconcile_inline(consumer, claim, called, deadline)
                        .await
                    {
                        Some(Lookup::Found {
                            status, response, ..
                        }) => {
                            return self
                                .settler
                                .settle(
                                    &mut slot,
                                    claim,
                                    settle_until,
                                    completed(status, response, true),
                                    "reconcile",
                                    "found",
                                )
                                .await;
                        }
                        // The provider has no record; sending again is a re-send, bound by the
                        // key window and max_sends.
                        Some(Lookup::NotFound { .. }) => {
                            noted = true;
                            (None, false, Some(Resend::NotFound))
                        }
                        Some(Lookup::Unknown { error }) => {
                            let why =
                                format!("{}; reconcile undecided: {error}", error_of(&outcome));
                            return self
                                .settler
                                .hand_off(&mut slot, claim, &why, outcome.status(), false)
                                .await;
                        }
                        None => {
                            let why = format!("{}; no status endpoint", error_of(&outcome));
                            return self
                                .settler
                                .park_unknown(&mut slot, claim, settle_until, why, outcome.status())
                                .await;
                        }
                    }
                }
            };
            let delay = delays
                .next()
                .unwrap_or(Duration::from_secs(5))
                .max(retry_after.unwrap_or_default());
            if Instant::now() + delay >= deadline {
                // Lease budget spent: let the sweeper take it from here.
                return self
                    .settler
                    .hand_off(&mut slot, claim, &error, outcome.status(), not_applied)
                    .await;
            }
            if !noted {
                note_call().await;
            }
            tokio::time::sleep(delay).await;
            if resend.is_some()
                && let Err(reason) =
                    policy::resend_within_window(hold.age_now(), cfg.redrive_within.0)
            {
                return self
                    .settler
                    .park_unknown(&mut slot, claim, settle_until, reason, outcome.status())
                    .await;
            }
            next_is_resend = resend;
        }
    }
}
