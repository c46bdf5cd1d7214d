//! Driving one attempt: [`Claimer::drive`] calls the provider, retries within the lease and
//! ends in one settle (through the [`Settler`]); asking the status endpoint is in `lookup`.

use super::*;
use crate::domain::claim::Handoff;
use crate::engine::destination::{Held, HeldBy, Verdict};
use futures_util::future::Either;
use tracing::Instrument;

impl Claimer {
    /// Drives one attempt of `claim` (whose `attempt` this worker holds): calls the provider,
    /// retries while the lease allows, settles fenced. `hold` says when the lease was
    /// (re)newed and how old the claim was then. `resend` says why the first call is a re-send
    /// after a send that may have applied (counted, and refused past `max_sends`). `slot` is
    /// released once the provider has answered, before the settle.
    ///
    /// The attempt runs in the span `drive` (consumer, tenant, message id, attempt), put on
    /// here rather than with `#[instrument]`, whose two ways of awaiting the body double the
    /// size of the future every claim in a call holds (see `claim_and_perform`).
    pub fn drive<'a>(
        &'a self,
        consumer: &'a Consumer,
        claim: &'a Claim,
        hold: Hold,
        resend: Option<Resend>,
        slot: Slot,
    ) -> impl Future<Output = AttemptEnd> + Send + 'a {
        let span = tracing::info_span!(
            "drive",
            consumer = %claim.consumer,
            tenant = %claim.tenant,
            message_id = %claim.message_id,
            attempt = claim.attempt
        );
        let attempt = self.attempt(consumer, claim, hold, resend, slot);
        if !self.traces.is_on() {
            return Either::Left(attempt.instrument(span));
        }
        // Boxed: a future awaited inside another async block is kept twice in it, and every
        // claim in a call holds this one.
        let attempt = Box::pin(attempt);
        let destination = consumer.config.effect.destination();
        let open = self
            .traces
            .attempt(claim, vec![("claimd.destination", destination.into())]);
        Either::Right(
            async move {
                let end = attempt.await;
                match &end {
                    AttemptEnd::Settled(state) => open.end(state.as_str(), None),
                    AttemptEnd::LeftStarted(why) => open.end("left_started", Some(why)),
                    AttemptEnd::Lost => open.end("lost", None),
                }
                end
            }
            .instrument(span),
        )
    }

    /// [`Claimer::drive`]'s attempt, outside its span.
    async fn attempt(
        &self,
        consumer: &Consumer,
        claim: &Claim,
        hold: Hold,
        resend: Option<Resend>,
        mut slot: Slot,
    ) -> AttemptEnd {
        // However the attempt ends, the line behind an ordered claim may move then.
        let _line = LineWake::of(consumer, claim);
        let cfg = &consumer.config;
        let deadline = hold.call_deadline(cfg);
        // A settle that meets a store error is retried a while past the last call's start: the
        // outcome is known here and lost if the sweeper must decide again.
        let settle_until = Some(deadline + Duration::from_secs(30));
        // The retry delays are boxed and made only when a call is retried: everything this
        // future keeps is kept for the whole provider call, by every claim in one.
        let mut delays = None;
        if Instant::now() >= deadline {
            // Waited too long for a slot: a call now could outlive the lease and overlap
            // another worker's takeover. Hand it to the sweeper, saying that nothing was
            // called, so it performs the claim instead of treating the attempt as unknown
            // (which would park it under `on_unknown = "park"`).
            // Boxed, as is every settle in this function: inline, a settle's states (with its
            // retries) would size this future, held by every claim for its whole call.
            return Box::pin(self.settler.hand_off(
                &mut slot,
                claim,
                "lease too short to start the call (waited for a slot); not called",
                None,
                Some(Handoff::NotApplied),
                Duration::ZERO,
            ))
            .await;
        }
        if let Some(key) = crate::domain::sealed::key_id(&claim.payload) {
            // Its payload did not open (its key was retired from the keys): calling with the
            // sealed text would send garbage. Parked, naming the key; never sent.
            self.metrics.vanished.sealed_unreadable(&claim.consumer);
            let reason = format!(
                "payload sealed with key {key:?}, which is not among the keys: not sent; put the key back in the keys and redrive"
            );
            return Box::pin(self.settler.settle(
                &mut slot,
                claim,
                settle_until,
                crate::engine::settle::park(reason, None),
                "perform",
                "unreadable",
            ))
            .await;
        }
        if let Some(effect) = consumer.effect.database() {
            // A database effect commits with its settle: no marker to clear, no call to
            // classify, nothing to look up (settle::db).
            return Box::pin(self.settler.apply_and_settle(
                &mut slot,
                claim,
                effect,
                deadline,
                cfg.effect.timeout(),
            ))
            .await;
        }
        if claim.attempt == 1 && (hold.not_called || !consumer.claims_ahead()) {
            // The claim was committed with a "not called yet" marker (see
            // NewClaim::mark_not_called; an enqueued claim always carries it): it goes now,
            // fenced, before the first call.
            match self.store.mark_called(claim.id, claim.attempt).await {
                Ok(true) => {}
                Ok(false) => {
                    info!("claim was taken over before its first call; left it alone");
                    return AttemptEnd::Lost;
                }
                Err(e) => {
                    // Nothing sent, and the marker still says so to the sweeper.
                    let why = format!("store unavailable before the first call ({e}); not called");
                    return Box::pin(self.settler.hand_off(
                        &mut slot,
                        claim,
                        &why,
                        None,
                        Some(Handoff::NotApplied),
                        Duration::ZERO,
                    ))
                    .await;
                }
            }
        }
        let mut resent = claim.resent_count;
        // An earlier send of this claim may have applied: a wait is then `undecided`, never
        // `not_applied` (which would let the next send go uncounted).
        let mut pending_unknown = resend.is_some();
        let mut next_is_resend = resend;
        loop {
            // The destination's breaker and pace: wait in place while that ends before the
            // deadline, else hand the claim back with a lease that ends when it may go. Either
            // way no attempt is spent and nothing is sent.
            // The key's own pace first (`effect.rate_limit_key`), then the destination's.
            // Boxed: its state is kept only while it waits, not through the call.
            let admitted = Box::pin(self.admit(consumer, claim, deadline)).await;
            let (pass, key) = match admitted {
                Ok(admitted) => admitted,
                Err(held) => {
                    self.metrics.held(&claim.consumer, held.by.as_str());
                    let how = if pending_unknown {
                        Handoff::Undecided
                    } else {
                        Handoff::NotApplied
                    };
                    return Box::pin(self.settler.hand_off(
                        &mut slot,
                        claim,
                        held.by.describe(),
                        None,
                        Some(how),
                        spread(held.until.saturating_duration_since(Instant::now())),
                    ))
                    .await;
                }
            };
            // A re-send is admitted (counted, capped by max_sends) only once it may go: a send
            // the destination held back was never made, so it is never counted.
            let as_resend = next_is_resend.take();
            if let Some(why) = as_resend
                && let Err(end) = Box::pin(self.settler.resend_or_end(
                    &mut slot,
                    claim,
                    why,
                    &mut resent,
                    cfg.max_sends,
                    settle_until,
                ))
                .await
            {
                consumer.destination.record(pass, Verdict::Neutral);
                return end;
            }
            let called = Instant::now();
            let outcome = consumer.effect.perform(claim).await;
            if self.traces.is_on() {
                self.trace_call(claim, &outcome, called, as_resend);
            }
            let verdict = match (Verdict::of_outcome(&outcome), &key, &consumer.rate_key) {
                // A key's 429 slows that key alone.
                (Verdict::RateLimited { retry_after }, Some(k), Some(rk)) => {
                    rk.paces.throttled(k, retry_after);
                    Verdict::Answered
                }
                (v, _, _) => v,
            };
            consumer.destination.record(pass, verdict);
            // A re-send the provider provably did not apply (refused, a not-applied status)
            // sent nothing: it is taken back, so weather never brings a claim to max_sends.
            // The next call, if any, is then still a re-send, counted when it goes.
            let uncounted = match as_resend {
                Some(why) if matches!(outcome, Outcome::NotApplied { .. }) => {
                    Box::pin(self.uncount_resend(claim, &mut resent, &outcome))
                        .await
                        .then_some(why)
                }
                _ => None,
            };
            // Boxed: what follows a call (its history line, a lookup, a settle, the sleep
            // before a retry) takes memory only while it runs, not for every claim in a call.
            match Box::pin(self.after_call(
                consumer,
                claim,
                &hold,
                &mut slot,
                &mut delays,
                outcome,
                called,
                deadline,
                settle_until,
                pending_unknown,
            ))
            .await
            {
                AfterCall::End(end) => return end,
                AfterCall::Again(resend) => {
                    pending_unknown |= resend.is_some();
                    next_is_resend = resend.or(uncounted);
                }
            }
        }
    }

    /// Takes back the re-send just counted, its call having applied nothing; true when taken
    /// back. A failure to write it leaves the count one too high (the safe side) and is logged.
    async fn uncount_resend(&self, claim: &Claim, resent: &mut i32, outcome: &Outcome) -> bool {
        match self.store().unnote_resent(claim.id, claim.attempt).await {
            Ok(true) => {
                *resent = (*resent - 1).max(0);
                let detail = format!(
                    "the re-send applied nothing ({}): not counted towards max_sends",
                    error_of(outcome)
                );
                self.settler
                    .note(claim, "resend", "uncounted", None, Some(&detail))
                    .await;
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(error = %e, "could not take back a re-send that applied nothing");
                false
            }
        }
    }

    /// What follows one call of an attempt: its metrics and history line, then the settle
    /// that ends the attempt, or the wait before the next call (a retry, or a re-send when
    /// `Again` says why).
    #[allow(clippy::too_many_arguments)]
    async fn after_call(
        &self,
        consumer: &Consumer,
        claim: &Claim,
        hold: &Hold,
        slot: &mut Slot,
        delays: &mut Option<Box<backon::ExponentialBackoff>>,
        outcome: Outcome,
        called: Instant,
        deadline: Instant,
        settle_until: Option<Instant>,
        pending_unknown: bool,
    ) -> AfterCall {
        let cfg = &consumer.config;
        self.metrics.attempt(
            &cfg.name,
            outcome.name(),
            outcome.status(),
            called.elapsed().as_secs_f64(),
        );
        debug!(outcome = outcome.name(), status = ?outcome.status(), "provider answered");
        let step = policy::after_outcome(&outcome, cfg.on_unknown, consumer.effect.can_reconcile());
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
                // A 2xx completes, unless the effect reads its answer by value: then the
                // object's status may say pending, failed or a person's work.
                let effect = &consumer.effect;
                let (s, name) =
                    by_answer(effect.outcomes(), "", status, response, false, "applied");
                return AfterCall::End(
                    self.settler
                        .settle(slot, claim, settle_until, s, "perform", name)
                        .await,
                );
            }
            Step::Fail => {
                let (status, response) = match &outcome {
                    Outcome::Rejected { status, response } => (*status, response.clone()),
                    _ => unreachable!("Fail follows Rejected"),
                };
                let s = failed(status, response);
                return AfterCall::End(
                    self.settler
                        .settle(slot, claim, settle_until, s, "perform", "rejected")
                        .await,
                );
            }
            Step::Park(reason) => {
                return AfterCall::End(
                    self.settler
                        .park_unknown(slot, claim, settle_until, reason, outcome.status())
                        .await,
                );
            }
            Step::NotSent(why) => {
                let end = self.not_sent(consumer, claim, slot, settle_until, pending_unknown, why);
                return AfterCall::End(end.await);
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
                        let effect = &consumer.effect;
                        let (s, name) = by_answer(
                            effect.outcomes(),
                            effect.lookup_object(),
                            status,
                            response,
                            true,
                            "found",
                        );
                        return AfterCall::End(
                            self.settler
                                .settle(slot, claim, settle_until, s, "reconcile", name)
                                .await,
                        );
                    }
                    // The provider has no record; sending again is a re-send, bound by the
                    // key window and max_sends.
                    Some(Lookup::NotFound { .. }) => {
                        noted = true;
                        (None, false, Some(Resend::NotFound))
                    }
                    Some(Lookup::Unknown { error }) => {
                        // No decision yet, and none lost: the sweeper asks again after a
                        // backoff, and the wait is not an attempt.
                        let why = format!("{}; reconcile undecided: {error}", error_of(&outcome));
                        let wait = wait_for(consumer, claim, None);
                        return AfterCall::End(
                            self.settler
                                .hand_off(
                                    slot,
                                    claim,
                                    &why,
                                    outcome.status(),
                                    Some(Handoff::Undecided),
                                    wait,
                                )
                                .await,
                        );
                    }
                    None => {
                        let why = format!("{}; no status endpoint", error_of(&outcome));
                        return AfterCall::End(
                            self.settler
                                .park_unknown(slot, claim, settle_until, why, outcome.status())
                                .await,
                        );
                    }
                }
            }
        };
        let delay = delays
            .get_or_insert_with(|| Box::new(retry_delays()))
            .next()
            .unwrap_or(Duration::from_secs(5))
            .max(retry_after.unwrap_or_default());
        if Instant::now() + delay >= deadline {
            // Lease budget spent: let the sweeper take it from here. After answers that applied
            // nothing this is a wait (not an attempt), its lease ending after a backoff or the
            // provider's Retry-After, whichever is later; after an unknown outcome the next
            // send is a re-send, counted, and the lease is released at once.
            let (how, wait) = if not_applied {
                let how = if pending_unknown {
                    Handoff::Undecided
                } else {
                    Handoff::NotApplied
                };
                (Some(how), wait_for(consumer, claim, retry_after))
            } else {
                (None, Duration::ZERO)
            };
            return AfterCall::End(
                self.settler
                    .hand_off(slot, claim, &error, outcome.status(), how, wait)
                    .await,
            );
        }
        if !noted {
            note_call().await;
        }
        let waited = self.traces.is_on().then(std::time::SystemTime::now);
        tokio::time::sleep(delay).await;
        if let Some(waited) = waited {
            let attributes = vec![
                ("claimd.wait.reason", format!("retry after: {error}").into()),
                ("claimd.wait.handoff", "none".into()),
                ("claimd.wait.for_ms", (delay.as_millis() as i64).into()),
            ];
            self.traces
                .step(claim, TraceStep::since("claimd.wait", waited, attributes));
        }
        if resend.is_some()
            && let Err(reason) = policy::resend_within_window(hold.age_now(), cfg.redrive_within.0)
        {
            return AfterCall::End(
                self.settler
                    .park_unknown(slot, claim, settle_until, reason, outcome.status())
                    .await,
            );
        }
        AfterCall::Again(resend)
    }
}

impl Claimer {
    /// One call to the provider in the claim's trace (`claimd.call`): what it answered, its
    /// status, and whether it was a re-send (and why).
    fn trace_call(
        &self,
        claim: &Claim,
        outcome: &Outcome,
        called: Instant,
        resend: Option<Resend>,
    ) {
        let start = std::time::SystemTime::now() - called.elapsed();
        let mut attributes = vec![("claimd.call.outcome", outcome.name().into())];
        if let Some(status) = outcome.status() {
            attributes.push(("http.response.status_code", status.into()));
        }
        if let Some(why) = resend {
            attributes.push(("claimd.call.resend", why.class().into()));
        }
        let step = TraceStep::since("claimd.call", start, attributes);
        let step = match outcome {
            Outcome::Applied { .. } => step,
            other => step.failed(error_of(other)),
        };
        self.traces.step(claim, step);
    }

    /// Waits for the claim's key's turn, then the destination's, in place while they come by
    /// `deadline` (and traces a wait of a millisecond or more); `Err` says until when the
    /// claim is held.
    async fn admit(
        &self,
        consumer: &Consumer,
        claim: &Claim,
        deadline: Instant,
    ) -> Result<(crate::engine::destination::Pass, Option<String>), Held> {
        let paced_from = self.traces.is_on().then(std::time::SystemTime::now);
        let admitted = match key_turn(consumer, claim, deadline).await {
            Ok(key) => consumer.destination.admit(deadline).await.map(|p| (p, key)),
            Err(until) => Err(Held {
                until,
                by: HeldBy::Pace,
            }),
        };
        if let (Ok(_), Some(from)) = (&admitted, paced_from) {
            self.trace_paced(claim, from);
        }
        admitted
    }

    /// A wait in place before a call (the key's or the destination's pace, a probe's answer)
    /// in the claim's trace, when it lasted a millisecond or more.
    fn trace_paced(&self, claim: &Claim, from: std::time::SystemTime) {
        let waited = from.elapsed().unwrap_or_default();
        if waited < Duration::from_millis(1) {
            return;
        }
        let attributes = vec![
            (
                "claimd.wait.reason",
                "paced: the key's or the destination's rate, or a probe's answer".into(),
            ),
            ("claimd.wait.handoff", "none".into()),
            ("claimd.wait.for_ms", (waited.as_millis() as i64).into()),
        ];
        self.traces
            .step(claim, TraceStep::since("claimd.wait", from, attributes));
    }

    /// Ends an attempt whose call was not made and never can be as the claim stands (a value
    /// that would send it to another path; intake refuses such messages, a claim stored
    /// before it did may have one): `failed` "never sent" when no call of the claim may have
    /// reached the provider, else a person's, since an earlier call may have gone to the
    /// other path.
    async fn not_sent(
        &self,
        consumer: &Consumer,
        claim: &Claim,
        slot: &mut Slot,
        settle_until: Option<Instant>,
        pending_unknown: bool,
        why: String,
    ) -> AttemptEnd {
        let sends = if claim.attempt == 1 && !pending_unknown {
            // The first attempt's calls all render the same URL: none was made.
            policy::Sends::NeverSent
        } else {
            match self.store.events(claim.id).await {
                Ok(events) => policy::read_sends(
                    events.iter().map(|e| {
                        let status = e.provider_status;
                        (e.attempt, e.action.as_str(), e.outcome.as_str(), status)
                    }),
                    claim.attempt,
                    |status| consumer.effect.proves_non_receipt(status),
                ),
                Err(_) => policy::Sends::MaybeApplied,
            }
        };
        let (s, outcome) = if sends == policy::Sends::NeverSent {
            let reason = format!(
                "never sent: {why}; the call was not made, so submitting it again with a corrected value is safe"
            );
            (crate::engine::settle::never_sent(reason), "never_sent")
        } else {
            let reason = format!(
                "{why}; not sent now, but an earlier call of this claim may have reached the provider (at another path): check there"
            );
            (crate::engine::settle::park(reason, None), "not_sent")
        };
        self.settler
            .settle(slot, claim, settle_until, s, "perform", outcome)
            .await
    }
}

/// How the calls of an attempt go on after one of them.
enum AfterCall {
    /// The attempt ended.
    End(AttemptEnd),
    /// Call again; `Some` when the call is a re-send (and why).
    Again(Option<Resend>),
}

/// The longest a waiting claim is left before the sweeper takes it again (a backoff; an open
/// destination's probe or a `Retry-After` may ask for longer).
pub(crate) const WAIT_CAP: Duration = Duration::from_secs(10);

/// How long a claim that waits is left before the sweeper takes it: its own backoff
/// ([`policy::wait_backoff`] by the waits so far), or longer when the provider asked
/// (`Retry-After`) or its destination is open until later; spread a little, so that claims
/// that began waiting together do not return together.
pub(crate) fn wait_for(
    consumer: &Consumer,
    claim: &Claim,
    retry_after: Option<Duration>,
) -> Duration {
    let own = policy::wait_backoff(claim.waits, WAIT_CAP);
    let open = consumer
        .destination
        .open_until()
        .map(|t| t.saturating_duration_since(Instant::now()))
        .unwrap_or_default();
    spread(own.max(open).max(retry_after.unwrap_or_default()))
}

/// `wait` plus up to a tenth more (at most a second), at random.
pub(crate) fn spread(wait: Duration) -> Duration {
    let extra = (wait / 10).min(Duration::from_secs(1));
    wait + extra.mul_f64(fastrand::f64())
}

/// The delays between retries of a call within one attempt: exponential from 100 ms to 5 s,
/// jittered, as many as the lease allows.
fn retry_delays() -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Waits for the claim's key's turn (`effect.rate_limit_key`) while it comes by `deadline`:
/// `Ok(Some(key))` when it may go, `Ok(None)` without a key pace (or a payload without the
/// key's fields: only the consumer's pace applies), `Err(until)` when its turn comes later.
async fn key_turn(
    consumer: &Consumer,
    claim: &Claim,
    deadline: Instant,
) -> Result<Option<String>, Instant> {
    let Some(rk) = &consumer.rate_key else {
        return Ok(None);
    };
    let Ok(key) = rk
        .template
        .render(&claim.payload, &claim.tenant, &claim.message_id)
    else {
        return Ok(None);
    };
    rk.paces.admit(&key, deadline).await?;
    Ok(Some(key))
}

/// Wakes the consumer's pickup when dropped: an ordered claim's attempt ended (settled, handed
/// back or lost), so the claims behind it in its line may be takeable now.
pub(super) struct LineWake<'a>(&'a Consumer);

impl<'a> LineWake<'a> {
    /// The wake for `claim`'s line: none for a claim without an order key. Not
    /// `bool::then_some`, which builds its value either way and so, dropping it at once,
    /// woke the pickup at every attempt's start: a take statement per attempt for nothing.
    pub(super) fn of(consumer: &'a Consumer, claim: &Claim) -> Option<Self> {
        if claim.order_key.is_some() {
            Some(LineWake(consumer))
        } else {
            None
        }
    }
}

impl Drop for LineWake<'_> {
    fn drop(&mut self) {
        self.0.wake_pickup();
    }
}
