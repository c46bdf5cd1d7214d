//! Intake's way in: [`Claimer::submit`] checks a [`Delivery`], waits for an intake place,
//! commits the claim on its own (I1) in a task of its own, answers the caller (who may then
//! acknowledge), and drives the new claim with a call slot.

use super::*;
use crate::domain::claim::{KeyTooLong, TenantNotKeyed};
use crate::provider::effect::Unusable;
use tracing::Instrument;

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
    /// Send no earlier than this (a scheduled send, docs/flow-control.md); `None`: at once.
    pub not_before: Option<chrono::DateTime<chrono::Utc>>,
    /// The producer's W3C `traceparent` (HTTP, AMQP or NATS header), when it sent a valid one:
    /// with `[traces]` on, the message's trace continues the producer's.
    pub trace_parent: Option<crate::domain::trace_context::TraceParent>,
    /// The message's priority, -100 to 100, checked by the way in (`Message-Priority` header, AMQP
    /// `priority` property): acts where the claim waits in the database (docs/flow-control.md).
    pub priority: i16,
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
    /// A synchronous standby is required (`[store] require_synchronous_standby`) and the
    /// store's replication is not synchronous now: nothing was committed; retry later.
    #[error("{0}; nothing was recorded: retry later")]
    NotReplicated(String),
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
    /// A value of the message (a payload field, the message id, the tenant) would make a path
    /// segment of the provider's URL `.`, `..` or empty, sending the call to another path
    /// (checked before claiming: nothing was committed).
    /// The content type declares JSON and the body does not parse (checked before claiming).
    #[error("{0}")]
    NotJson(#[from] crate::domain::json_body::NotJson),
    /// A payload value would make a path segment of the effect's URL unsafe (`.`, `..`, empty).
    #[error("{0}")]
    UnsafeUrlValue(#[from] crate::provider::effect::http_template::url_segments::UrlValueError),
    /// A tenant was given to a consumer whose key template does not contain `{tenant}`.
    #[error(transparent)]
    TenantNotKeyed(#[from] TenantNotKeyed),
    /// The rendered idempotency key is longer than the provider accepts (`max_key_length`).
    #[error(transparent)]
    KeyTooLong(#[from] KeyTooLong),
    /// The claim was interrupted before its outcome was known (the worker's task failed):
    /// retry; a committed claim makes the retry a duplicate.
    #[error("the claim was interrupted before its outcome was known; retry")]
    Interrupted,
}

impl Claimer {
    /// Claims a delivery and, when it is new, starts its effect in the background.
    ///
    /// Returns once the claim is committed (or recognised as a duplicate): the caller may
    /// acknowledge then, and not before. Dropping the returned future (a client that hangs
    /// up, a broker handler that is aborted) never separates a committed claim from its
    /// effect: from the claim statement on, the work runs in a task of its own.
    pub async fn submit(self: &Arc<Self>, d: Delivery) -> Result<Accepted, SubmitError> {
        self.submit_held(d, ()).await
    }

    /// [`Claimer::submit`], keeping `held` (what the delivery's payload costs its intake: the
    /// HTTP body budget's share) until the claim's call slot is taken or the delivery is
    /// answered without a call. Payloads claimed and waiting for a slot then count against
    /// the intake's budget; those in a call are bounded by the consumer's `concurrency`.
    pub async fn submit_held<H: Send + 'static>(
        self: &Arc<Self>,
        d: Delivery,
        held: H,
    ) -> Result<Accepted, SubmitError> {
        if !self.traces.is_on() {
            return self.claim_delivery(d, held, None).await;
        }
        let intake = self.traces.intake(
            d.trace_parent,
            &d.consumer,
            &String::from_utf8_lossy(&d.tenant),
            &String::from_utf8_lossy(&d.message_id),
        );
        let result = self.claim_delivery(d, held, intake.trace_parent()).await;
        match &result {
            Ok(Accepted::New(c)) => intake.end("accepted", Some(c.id), None),
            Ok(Accepted::Duplicate(c)) => intake.end("duplicate", Some(c.id), None),
            Err(SubmitError::Conflict { claim, .. }) => {
                intake.end("conflict", Some(claim.id), Some("same id, another payload"))
            }
            Err(e) => intake.end("refused", None, Some(&e.to_string())),
        }
        result
    }

    /// [`Claimer::submit_held`] after the intake span opened: `trace_parent` is that span's.
    async fn claim_delivery<H: Send + 'static>(
        self: &Arc<Self>,
        d: Delivery,
        held: H,
        trace_parent: Option<String>,
    ) -> Result<Accepted, SubmitError> {
        if !self.is_accepting() {
            return Err(SubmitError::ShuttingDown);
        }
        if let Some(why) = self.replication.refusal() {
            return Err(SubmitError::NotReplicated(why));
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
            return Err(TenantNotKeyed {
                consumer: d.consumer,
                template: consumer.config.key.clone(),
            }
            .into());
        }
        let content_type = match validate_content_type(&d.content_type) {
            Ok(ct) => ct.to_string(),
            Err(why) => {
                m.refused(&d.consumer, "bad_content_type");
                return Err(SubmitError::BadContentType(why));
            }
        };
        if let Err(e) = crate::domain::json_body::check(content_type.as_bytes(), &d.payload) {
            m.refused(&d.consumer, "bad_payload");
            return Err(e.into());
        }
        let (idem_key, order_key) =
            match check_payload(&consumer, &message_id, &tenant, &d.payload, &content_type) {
                Ok(keys) => keys,
                Err((e, reason)) => {
                    m.refused(&d.consumer, reason);
                    return Err(e);
                }
            };
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
            fingerprint: crate::store::sealing::fingerprint(&d.payload),
            payload: d.payload,
            content_type,
            worker: self.instance.clone(),
            lease: consumer.config.lease.0,
            claim_token: new_claim_token(),
            mark_not_called: !consumer.claims_ahead(),
            order_key,
            not_before: d.not_before,
            trace_parent,
            priority: d.priority,
        };
        // From the claim statement on, the work must not be cancellable: the statement may
        // commit whatever happens to this caller, and a committed claim must be performed by
        // the worker that holds its lease. So it runs detached and only its answer comes back.
        let (answer, answered) = oneshot::channel();
        tokio::spawn(
            self.clone()
                .claim_and_perform(consumer, new, admission, answer, held),
        );
        answered.await.unwrap_or(Err(SubmitError::Interrupted))
    }

    /// Commits the claim, sends the answer for the caller to acknowledge, then performs the
    /// claim if it is new. Runs detached from the caller (see [`Claimer::submit`]).
    ///
    /// Shaped for memory: this task lives through the provider call, and an async task's
    /// allocation is the size of its largest state for its whole life, with every argument
    /// of an `async fn` kept in it besides. So the delivery goes into a boxed commit (freed
    /// once the claim is committed), the attempt into a boxed [`Claimer::drive`], and the span
    /// is put on here instead of with `#[instrument]` (whose two ways of awaiting the body
    /// double a future's size). What stays is the claim, its consumer and its slot: about
    /// 0.6 KiB a claim, against 2.3 KiB before (docs/performance.md, round four).
    pub(super) fn claim_and_perform<H: Send + 'static>(
        self: Arc<Self>,
        consumer: Arc<Consumer>,
        new: NewClaim,
        admission: Admission,
        answer: oneshot::Sender<Result<Accepted, SubmitError>>,
        held: H,
    ) -> impl Future<Output = ()> + Send + 'static {
        // No parent, as with `#[instrument]` in the spawned task: a caller's span (the
        // broker delivery's) would otherwise be kept open for as long as this call lasts.
        let span = tracing::info_span!(
            parent: None,
            "claim_and_perform",
            consumer = %new.consumer,
            tenant = %new.tenant,
            message_id = %new.message_id
        );
        // The database starts the lease inside the statement; the local clock starts before
        // it, so this worker's deadline never falls after the lease the database recorded.
        let hold = Hold::fresh();
        let commit = Box::pin(self.clone().commit(consumer.clone(), new, answer, hold));
        async move {
            let Some(claim) = commit.await else {
                return;
            };
            if claim.lease_owner.as_deref() != Some(self.instance()) {
                // It waits: for its line (the pickup takes it when its turn comes) or for
                // its time (the sweeper does).
                if claim.order_key.is_some() {
                    consumer.wake_pickup();
                }
                return;
            }
            let permit = match admission {
                Admission::Place(place) => {
                    let slot = consumer.slot().await;
                    drop(place);
                    slot
                }
                Admission::Slot(slot) => slot,
            };
            drop(held);
            let slot = Slot::held(permit, &consumer);
            Box::pin(self.drive(&consumer, &claim, hold, None, slot)).await;
        }
        .instrument(span)
    }

    /// Commits the claim and sends the caller its answer. Returns the claim when it is new
    /// (or when a failed statement turns out to have committed it: see [`Claimer::adopt`]),
    /// carrying the payload; the delivery's copy is dropped here.
    async fn commit(
        self: Arc<Self>,
        consumer: Arc<Consumer>,
        new: NewClaim,
        answer: oneshot::Sender<Result<Accepted, SubmitError>>,
        hold: Hold,
    ) -> Option<Claim> {
        let m = &self.metrics;
        let started = self.traces.is_on().then(std::time::SystemTime::now);
        let outcome = self.store.claim(&new).await;
        match &outcome {
            Ok(_) => self.writes.succeeded(),
            Err(e) => self.writes.failed(e),
        }
        if let Some(started) = started {
            self.trace_claim(&new, &outcome, started);
        }
        match outcome {
            Ok(ClaimOutcome::Created(mut claim)) => {
                m.created(&new.consumer);
                // Intake answers from the claim's identity and state: it gets no copy of the
                // payload (a backlog of large bodies would otherwise be held twice).
                let payload = std::mem::take(&mut claim.payload);
                let _ = answer.send(Ok(Accepted::New(claim.clone())));
                claim.payload = payload;
                Some(claim)
            }
            Ok(ClaimOutcome::Duplicate(claim)) => {
                m.duplicate(&new.consumer);
                let _ = answer.send(Ok(Accepted::Duplicate(claim)));
                None
            }
            Ok(ClaimOutcome::Mismatch(claim)) => {
                m.mismatch(&new.consumer);
                let _ = answer.send(Err(SubmitError::Conflict {
                    message_id: new.message_id,
                    claim: Box::new(claim),
                }));
                None
            }
            Err(e) => {
                m.refused(&new.consumer, "store_unavailable");
                let _ = answer.send(Err(e.into()));
                let claim = self.adopt(&consumer, &new, hold).await?;
                m.created(&new.consumer);
                Some(claim)
            }
        }
    }

    /// The claim's commit, in its message's trace.
    fn trace_claim(
        &self,
        new: &NewClaim,
        outcome: &Result<ClaimOutcome, StoreError>,
        started: std::time::SystemTime,
    ) {
        // Only a created claim is this message's: a duplicate's or a mismatch's is the earlier
        // claim, whose trace is elsewhere.
        let (result, id) = match outcome {
            Ok(ClaimOutcome::Created(c)) => ("created", Some(c.id)),
            Ok(ClaimOutcome::Duplicate(_)) => ("duplicate", None),
            Ok(ClaimOutcome::Mismatch(_)) => ("mismatch", None),
            Err(_) => ("store_error", None),
        };
        let mut step = TraceStep::since(
            "claimd.claim",
            started,
            vec![("claimd.claim.result", result.into())],
        );
        if let Err(e) = outcome {
            step = step.failed(e.to_string());
        }
        self.traces.step_of(id, new.trace_parent.as_deref(), step);
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
                Ok(Some(c)) if new.adoptable(&c) => {
                    info!("the claim committed although its statement failed; performing it");
                    return Some(c);
                }
                Ok(Some(c)) if new.inserted(&c) && c.order_key.is_some() => {
                    // It committed waiting in its line: the pickup takes it at its turn.
                    info!(
                        "the claim committed although its statement failed; it waits in its line"
                    );
                    consumer.wake_pickup();
                    return None;
                }
                Ok(_) => return None,
                Err(_) => delay = (delay * 2).min(Duration::from_secs(2)),
            }
        }
        None
    }
}

/// The checks `consumer` makes of a message before claiming it, once its id, tenant and
/// content type are valid: its effect's, its order and rate keys' (which must render from the
/// payload), and the idempotency key's length. The idempotency key and the order key; or the
/// refusal and its reason for `claimd_messages_refused_total`. Schedules check their messages
/// with it at start.
pub(crate) fn check_payload(
    consumer: &Consumer,
    message_id: &str,
    tenant: &str,
    payload: &[u8],
    content_type: &str,
) -> Result<(String, Option<String>), (SubmitError, &'static str)> {
    let idem_key = consumer
        .template
        .render(&consumer.config.name, tenant, message_id);
    let incoming = crate::provider::effect::Incoming {
        key: &idem_key,
        message_id,
        tenant,
        consumer: &consumer.config.name,
        payload,
        content_type,
    };
    match consumer.effect.check_message(&incoming) {
        Ok(()) => {}
        Err(Unusable::Payload(why)) => return Err((SubmitError::BadPayload(why), "bad_payload")),
        Err(Unusable::UrlValue(e)) => return Err((e.into(), "unsafe_url_value")),
    }
    let order_key = match &consumer.order_key {
        Some(t) => Some(
            t.render(payload, tenant, message_id)
                .map_err(|e| (SubmitError::BadPayload(e.to_string()), "bad_payload"))?,
        ),
        None => None,
    };
    if let Some(rk) = &consumer.rate_key {
        rk.template
            .render(payload, tenant, message_id)
            .map_err(|e| (SubmitError::BadPayload(e.to_string()), "bad_payload"))?;
    }
    let max = consumer.config.effect.max_key_length();
    if idem_key.len() > max {
        let too_long = KeyTooLong {
            len: idem_key.len(),
            max,
            template: consumer.config.key.clone(),
        };
        return Err((too_long.into(), "key_too_long"));
    }
    Ok((idem_key, order_key))
}
