//! Driving one attempt: [`Claimer::drive`] calls the provider, retries within the lease and
//! ends in one settle (through the [`Settler`]); asking the status endpoint is in `lookup`.

use super::*;

impl Claimer {
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
