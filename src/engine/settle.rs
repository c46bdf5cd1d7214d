//! The one place where an attempt's outcome is written: every fenced transition of a claim
//! that a worker holds (complete, fail, park, hand off to the sweeper), its history lines and
//! its re-send count. Each write is conditional on the attempt the worker holds and on the
//! claim still being `started` (I2); a worker whose claim was taken over changes nothing.
//! The claimer and the sweeper both settle through [`Settler`], so the transitions can be
//! audited here against the invariants. A write that changed nothing because the claim
//! vanished from the store (not moved: no row of its key at all) is an alarm, and the claim
//! is written back (`vanished`).

mod db;
mod vanished;

pub use vanished::Whereabouts;

use crate::config::ValueOutcomes;
use crate::domain::claim::{Claim, ClaimState, Handoff};
use crate::engine::consumer::Slot;
use crate::engine::follow_ups::FollowUpPlan;
use crate::engine::metrics::Metrics;
use crate::engine::traces::{Step as TraceStep, Traces};
use crate::engine::waiters::SettleSignals;
use crate::provider::effect::Outcome;
use crate::provider::effect::by_value::{self, Reading, Verdict};
use crate::store::{NewEvent, Settlement, Store};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptEnd {
    /// Settled in this state.
    Settled(ClaimState),
    /// Left `started` for the sweeper (lease budget spent, store down, or reconcile undecided).
    LeftStarted(String),
    /// Another worker took the claim over; nothing was changed.
    Lost,
}

/// Why a claim is sent again after a send whose effect may have happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// The last call's outcome was unknown and `on_unknown = "redrive"`.
    UnknownOutcome,
    /// The provider's status check found no record of the key.
    NotFound,
    /// The sweeper took over a claim whose last attempt ended without an answer, under
    /// `on_unknown = "redrive"`.
    Takeover,
}

impl Resend {
    /// Short class for history and the `claimd_resent_total` metric.
    pub fn class(self) -> &'static str {
        match self {
            Resend::UnknownOutcome => "unknown_outcome",
            Resend::NotFound => "not_found",
            Resend::Takeover => "takeover",
        }
    }

    /// The reason, for a person.
    pub fn describe(self) -> &'static str {
        match self {
            Resend::UnknownOutcome => {
                "sent again with the same key: the last call's outcome was unknown (on_unknown = \"redrive\")"
            }
            Resend::NotFound => {
                "sent again: the provider's status check found no record of the key"
            }
            Resend::Takeover => {
                "sent again with the same key: the previous attempt ended without an answer (on_unknown = \"redrive\")"
            }
        }
    }
}

/// Why a re-send was not made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResendRefused {
    /// `max_sends` reached: park with this reason.
    Capped(String),
    /// The claim was taken over by another worker.
    Lost,
    /// The re-send could not be counted (store error): leave the claim for the sweeper.
    Unrecorded(String),
}

/// Writes the outcomes of the attempts this instance holds.
#[derive(Clone)]
pub struct Settler {
    store: Store,
    instance: String,
    metrics: Arc<Metrics>,
    /// Rung after each committed change, for the requests waiting on the claim.
    signals: Arc<SettleSignals>,
    /// Where each committed change is traced.
    traces: Traces,
    /// The claims a settle creates for other consumers (`[[consumers.follow_ups]]`).
    follow_ups: Arc<FollowUpPlan>,
}

impl std::fmt::Debug for Settler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settler")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Settler {
    /// A settler writing to `store` as `instance`.
    pub fn new(store: Store, instance: String, metrics: Arc<Metrics>) -> Self {
        Settler {
            store,
            instance,
            metrics,
            signals: Arc::default(),
            traces: Traces::off(),
            follow_ups: Arc::default(),
        }
    }

    /// The same settler, creating the follow-ups of `plan` as it settles.
    pub fn with_follow_ups(mut self, plan: Arc<FollowUpPlan>) -> Self {
        self.follow_ups = plan;
        self
    }

    /// The same settler, tracing what it writes to `traces`.
    pub fn with_traces(mut self, traces: Traces) -> Self {
        self.traces = traces;
        self
    }

    /// The signals rung when a claim is settled here (`Prefer: wait` listens to them).
    pub fn signals(&self) -> &Arc<SettleSignals> {
        &self.signals
    }

    /// Records a history line (an attempt's outcome, a lookup's answer) without changing the
    /// claim. A failure is logged: the history is for people, the claim row decides.
    pub async fn note(
        &self,
        claim: &Claim,
        action: &str,
        outcome: &str,
        status: Option<i32>,
        detail: Option<&str>,
    ) {
        let detail = detail.map(storable);
        let event = NewEvent {
            actor: &self.instance,
            action,
            outcome,
            provider_status: status,
            detail: detail.as_deref(),
        };
        if let Err(e) = self
            .store
            .record_event(claim.id, claim.attempt, &event)
            .await
        {
            warn!(error = %e, "could not record attempt history");
        }
    }

    /// Parks a claim whose last call's outcome is unknown and may not be decided here: the
    /// reason goes to a person (a `perform` line with outcome `unknown`).
    pub async fn park_unknown(
        &self,
        slot: &mut Slot,
        claim: &Claim,
        retry_until: Option<Instant>,
        reason: String,
        status: Option<i32>,
    ) -> AttemptEnd {
        self.settle(
            slot,
            claim,
            retry_until,
            park(reason, status),
            "perform",
            "unknown",
        )
        .await
    }

    /// Admits one re-send (a send after one whose effect may have happened): refused once the
    /// claim has been sent `max_sends` times (`*resent` re-sends plus the first send), else
    /// counted on the claim (fenced like a settle), written to the history with its reason and
    /// counted in metrics. `*resent` is the claim's re-send count so far; it is bumped.
    pub async fn admit_resend(
        &self,
        claim: &Claim,
        why: Resend,
        resent: &mut i32,
        max_sends: u32,
    ) -> Result<(), ResendRefused> {
        let sends = i64::from(*resent) + 1;
        if sends >= i64::from(max_sends) {
            return Err(ResendRefused::Capped(format!(
                "{}, but the claim was already sent {sends} time(s) and max_sends = {max_sends}: one of them may have been applied (the provider may ignore idempotency keys); a person must check the provider before resolving or redriving",
                why.describe()
            )));
        }
        match self.store.note_resent(claim.id, claim.attempt).await {
            Ok(true) => {}
            Ok(false) => return Err(ResendRefused::Lost),
            Err(e) => {
                return Err(ResendRefused::Unrecorded(format!(
                    "{}; could not count the re-send ({e}); not sent",
                    why.describe()
                )));
            }
        }
        *resent += 1;
        self.metrics.resent(&claim.consumer, why.class());
        let detail = format!(
            "send {} of at most {max_sends}: {}",
            *resent + 1,
            why.describe()
        );
        self.note(claim, "resend", why.class(), None, Some(&detail))
            .await;
        Ok(())
    }

    /// Admits a re-send ([`Settler::admit_resend`]); when refused, ends the attempt: parked past
    /// `max_sends`, left for the sweeper when the count could not be written.
    pub async fn resend_or_end(
        &self,
        slot: &mut Slot,
        claim: &Claim,
        why: Resend,
        resent: &mut i32,
        max_sends: u32,
        settle_until: Option<Instant>,
    ) -> Result<(), AttemptEnd> {
        let refused = match self.admit_resend(claim, why, resent, max_sends).await {
            Ok(()) => return Ok(()),
            Err(refused) => refused,
        };
        Err(match refused {
            ResendRefused::Capped(reason) => {
                self.settle(
                    slot,
                    claim,
                    settle_until,
                    park(reason, None),
                    "resend",
                    "capped",
                )
                .await
            }
            ResendRefused::Lost => AttemptEnd::Lost,
            ResendRefused::Unrecorded(why) => {
                self.hand_off(
                    slot,
                    claim,
                    &why,
                    None,
                    Some(Handoff::Undecided),
                    Duration::ZERO,
                )
                .await
            }
        })
    }

    /// Leaves the claim `started` for the sweeper, its lease ending `lease_for` from now
    /// (zero: the next sweep takes it). `how` says how the attempt let go:
    /// [`Handoff::NotApplied`] when the answers so far prove nothing was applied (the sweeper
    /// may send again even under `on_unknown = "park"`), [`Handoff::Undecided`] when an
    /// unknown outcome only waits for an answer; either makes the attempt a wait, not counted
    /// towards `max_attempts`. `None`: the outcome is unknown and the attempt counts.
    pub async fn hand_off(
        &self,
        slot: &mut Slot,
        claim: &Claim,
        error: &str,
        status: Option<i32>,
        how: Option<Handoff>,
        lease_for: Duration,
    ) -> AttemptEnd {
        let s = Settlement {
            state: None,
            provider_status: status,
            error: Some(storable(error).into_owned()),
            handoff: how,
            lease_for: Some(lease_for),
            ..Default::default()
        };
        slot.release_for_settle();
        let outcome = match how {
            Some(Handoff::NotApplied) => "not_applied",
            Some(_) => "waiting",
            None => "unknown",
        };
        let event = NewEvent {
            actor: &self.instance,
            action: "handoff",
            outcome,
            provider_status: status,
            detail: s.error.as_deref(),
        };
        match self.store.settle(claim.id, claim.attempt, &s, &event).await {
            Ok(true) => {
                if self.traces.is_on() {
                    self.trace_wait(claim, &s, outcome);
                }
                AttemptEnd::LeftStarted(error.to_string())
            }
            Ok(false) => match self.locate_or_restore(claim, &s, ClaimState::Started).await {
                Whereabouts::Moved(id) => {
                    info!("claim was taken over by another worker; left it alone");
                    if id == claim.id {
                        self.fenced_out(claim, &s, "handoff", &event).await;
                    }
                    AttemptEnd::Lost
                }
                Whereabouts::Restored(_) => AttemptEnd::LeftStarted(error.to_string()),
                Whereabouts::Lost => AttemptEnd::Lost,
            },
            Err(e) => {
                warn!(error = %e, "could not hand the claim off; its lease will expire");
                AttemptEnd::LeftStarted(error.to_string())
            }
        }
    }

    /// Settles, retrying store errors until `retry_until` (once when `None`); after that the
    /// lease expires and the sweeper decides again (the effect's outcome is then unknown to
    /// it: it reconciles). `action` and `outcome` name the history line.
    pub async fn settle(
        &self,
        slot: &mut Slot,
        claim: &Claim,
        retry_until: Option<Instant>,
        mut s: Settlement,
        action: &str,
        outcome: &str,
    ) -> AttemptEnd {
        make_storable(&mut s);
        s.follow_ups = self.follow_ups.children(claim, &s);
        let event = self.event_of(&s, action, outcome);
        slot.release_for_settle();
        let mut delay = Duration::from_millis(100);
        loop {
            match self.store.settle(claim.id, claim.attempt, &s, &event).await {
                Ok(true) => {
                    self.follow_ups.ring(&s);
                    if self.traces.is_on() {
                        self.trace_settle(claim, &s, action, outcome);
                    }
                    let state = s.state.unwrap_or(ClaimState::Started);
                    self.signals.settled(claim.id);
                    self.metrics.settled(&claim.consumer, state.as_str());
                    debug!(%state, "settled");
                    return AttemptEnd::Settled(state);
                }
                Ok(false) => {
                    let state = s.state.unwrap_or(ClaimState::Started);
                    return match self.locate_or_restore(claim, &s, state).await {
                        Whereabouts::Moved(id) => {
                            info!(
                                "claim moved (taken over, or settled by an event, a poll or an operator) before settle; changed nothing"
                            );
                            if id == claim.id {
                                self.fenced_out(claim, &s, action, &event).await;
                            }
                            AttemptEnd::Lost
                        }
                        Whereabouts::Restored(_) if state == ClaimState::Started => {
                            AttemptEnd::LeftStarted(s.error.clone().unwrap_or_default())
                        }
                        Whereabouts::Restored(_) => AttemptEnd::Settled(state),
                        Whereabouts::Lost => AttemptEnd::Lost,
                    };
                }
                Err(e) if retry_until.is_some_and(|until| Instant::now() + delay < until) => {
                    warn!(error = %e, "settle failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    warn!(error = %e, "settle failed; the sweeper will decide this claim again");
                    return AttemptEnd::LeftStarted(e.to_string());
                }
            }
        }
    }
}

impl Settler {
    /// The history line a settlement writes.
    fn event_of<'a>(
        &'a self,
        s: &'a Settlement,
        action: &'a str,
        outcome: &'a str,
    ) -> NewEvent<'a> {
        NewEvent {
            actor: &self.instance,
            action,
            outcome,
            provider_status: s.provider_status,
            detail: s.error.as_deref(),
        }
    }

    /// Writes the answer of a settle that lost its fence (the claim moved before it landed)
    /// to the claim's history, unfenced, so that a person reading it sees what the provider
    /// said to this attempt: `answer after the claim moved: ...; not applied (claim was
    /// pending@v7, attempt 1)`. A failure is logged: the claim row decides, not this line.
    pub async fn fenced_out(
        &self,
        claim: &Claim,
        s: &Settlement,
        action: &str,
        lost: &NewEvent<'_>,
    ) {
        let detail = fenced_out_detail(s, lost);
        let event = NewEvent {
            actor: &self.instance,
            action,
            outcome: "fenced_out",
            provider_status: s.provider_status,
            detail: Some(&detail),
        };
        if let Err(e) = self
            .store
            .record_fenced_out(claim.id, claim.attempt, &event)
            .await
        {
            warn!(error = %e, "could not record the answer that arrived after the claim moved");
        }
    }

    /// Settles a claim this instance does not hold as a worker: a `pending` claim it polled,
    /// or a claim a provider event decided. Fenced on the state, attempt and version read
    /// (`from`, `claim.attempt`, `claim.version`): `Ok(false)` when the claim moved meanwhile,
    /// even when it came back to the same state (nothing written). One try: the poll comes
    /// back, the provider re-sends an event not answered 2xx. A claim that is no longer in the
    /// store at all (not a terminal one, which retention may have deleted) vanished: it is
    /// written back with this settlement, and `Ok(true)` is returned
    /// ([`Settler::locate_or_restore`]).
    pub async fn settle_from(
        &self,
        claim: &Claim,
        from: ClaimState,
        mut s: Settlement,
        action: &str,
        outcome: &str,
    ) -> Result<bool, crate::store::StoreError> {
        make_storable(&mut s);
        s.follow_ups = self.follow_ups.children(claim, &s);
        let event = self.event_of(&s, action, outcome);
        let changed = self
            .store
            .settle_from(claim.id, claim.attempt, claim.version, from, &s, &event)
            .await?;
        if !changed && !matches!(from, ClaimState::Completed | ClaimState::Failed) {
            let state = s.state.unwrap_or(from);
            // Written back, it is counted and signalled there.
            return Ok(matches!(
                self.locate_or_restore(claim, &s, state).await,
                Whereabouts::Restored(_)
            ));
        }
        if changed {
            self.follow_ups.ring(&s);
            self.signals.settled(claim.id);
            if self.traces.is_on() {
                self.trace_settle(claim, &s, action, outcome);
            }
        }
        if changed && let Some(state) = s.state.filter(|st| *st != from) {
            self.metrics.settled(&claim.consumer, state.as_str());
        }
        Ok(changed)
    }
}

impl Settler {
    /// A committed settle in the claim's trace (`claimd.settle`, at its commit): the state it
    /// set, who decided (`action`: perform, reconcile, event, poll, ...) and how.
    fn trace_settle(&self, claim: &Claim, s: &Settlement, action: &str, outcome: &str) {
        let state = s.state.map(|st| st.as_str()).unwrap_or("started");
        let mut attributes = vec![
            ("claimd.state", state.into()),
            ("claimd.settle.by", action.into()),
            ("claimd.settle.outcome", outcome.into()),
        ];
        if let Some(status) = s.provider_status {
            attributes.push(("http.response.status_code", status.into()));
        }
        if let Some(why) = &s.error {
            attributes.push(("claimd.reason", why.clone().into()));
        }
        let step = TraceStep::now("claimd.settle", attributes);
        let step = match (s.state, &s.error) {
            (Some(ClaimState::NeedsAttention), Some(why)) => step.failed(why.clone()),
            _ => step,
        };
        self.traces.step(claim, step);
    }

    /// A hand-off to the sweeper in the claim's trace (`claimd.wait`, at its commit): why it
    /// waits, how the attempt let go (`not_applied`, `waiting`, `unknown`) and for how long at
    /// least.
    fn trace_wait(&self, claim: &Claim, s: &Settlement, how: &str) {
        let mut attributes = vec![
            (
                "claimd.wait.reason",
                s.error.clone().unwrap_or_default().into(),
            ),
            ("claimd.wait.handoff", how.into()),
            (
                "claimd.wait.for_ms",
                (s.lease_for.unwrap_or_default().as_millis() as i64).into(),
            ),
        ];
        if let Some(status) = s.provider_status {
            attributes.push(("http.response.status_code", status.into()));
        }
        self.traces
            .step(claim, TraceStep::now("claimd.wait", attributes));
    }
}

/// What a settle that lost its fence would have written, for its history line: the state it
/// would have set (or the hand-off), the provider's status and its reason or answer.
fn fenced_out_detail(s: &Settlement, lost: &NewEvent<'_>) -> String {
    let mut what = match s.state {
        Some(state) => state.as_str().to_string(),
        None => format!("hand-off ({})", lost.outcome),
    };
    if let Some(status) = s.provider_status {
        what.push_str(&format!(" {status}"));
    }
    if let Some(text) = s.error.as_deref().or(s.provider_response.as_deref()) {
        what.push_str(": ");
        what.push_str(&crate::store::truncate(text, 1024));
    }
    format!("answer after the claim moved: {what}; not applied")
}

/// Escapes what a store refuses in a settlement's texts ([`storable`]), and cuts the
/// provider's answer to what is kept (it was read whole, up to
/// [`crate::provider::effect::MAX_READ_BYTES`], to be read by value).
fn make_storable(s: &mut Settlement) {
    if let Some(answer) = &mut s.provider_response
        && answer.len() > crate::provider::effect::MAX_RESPONSE_BYTES
    {
        *answer = crate::store::truncate(answer, crate::provider::effect::MAX_RESPONSE_BYTES);
    }
    for text in [&mut s.provider_response, &mut s.error]
        .into_iter()
        .flatten()
    {
        if let Cow::Owned(safe) = storable(text) {
            *text = safe;
        }
    }
}

/// Text as it can be stored in every dialect: PostgreSQL's `text` refuses the NUL character
/// (a provider's answer is any bytes), so each one is written as the escape `\0`. Other
/// control characters are stored as they came and escaped where they are shown.
pub fn storable(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\\0"))
    } else {
        Cow::Borrowed(text)
    }
}

/// `completed` with the provider's answer; `reconciled` when it came from the status endpoint.
pub fn completed(status: i32, response: String, reconciled: bool) -> Settlement {
    Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(status),
        provider_response: Some(response),
        reconciled,
        ..Default::default()
    }
}

/// How a `2xx` answer (the call's, or a "found" status lookup's) settles, with the name of its
/// history line: `completed` under `default_name`, unless the effect reads outcomes by value
/// (`[effect.outcome]`), when the value at its pointer in the object (at `object_pointer`
/// in the answer) decides: `completed`, `pending` (polled from `pending_poll` on), parked
/// for a person (`needs_attention`, or a value no list names: unknown, never completed) or
/// `failed` with the provider's reason. The provider's id of the object is kept either way.
pub fn by_answer(
    outcomes: Option<&ValueOutcomes>,
    object_pointer: &str,
    status: i32,
    response: String,
    reconciled: bool,
    default_name: &'static str,
) -> (Settlement, &'static str) {
    let Some(map) = outcomes else {
        return (completed(status, response, reconciled), default_name);
    };
    let reading = by_value::read_body(map, &response, object_pointer);
    by_reading(map, &reading, status, response, reconciled, default_name)
}

/// [`by_answer`] for an object already read ([`by_value::read`]): a provider event's object,
/// or an answer read once for several uses.
pub fn by_reading(
    map: &ValueOutcomes,
    reading: &Reading,
    status: i32,
    response: String,
    reconciled: bool,
    default_name: &'static str,
) -> (Settlement, &'static str) {
    let mut s = Settlement {
        provider_status: Some(status),
        provider_response: Some(response),
        reconciled,
        provider_id: reading.provider_id.clone(),
        ..Default::default()
    };
    let name = match reading.verdict {
        Some(Verdict::Completed) => {
            s.state = Some(ClaimState::Completed);
            default_name
        }
        Some(Verdict::Pending) => {
            s.state = Some(ClaimState::Pending);
            s.error = Some(reading.describe(map));
            s.lease_for = Some(map.pending_poll.0);
            "pending"
        }
        Some(Verdict::NeedsAttention) => {
            s.state = Some(ClaimState::NeedsAttention);
            s.error = Some(format!(
                "{}; a person or the customer must act",
                reading.describe(map)
            ));
            "needs_attention"
        }
        Some(Verdict::Failed) => {
            s.state = Some(ClaimState::Failed);
            s.error = Some(reading.describe(map));
            "failed"
        }
        None => {
            s.state = Some(ClaimState::NeedsAttention);
            s.error = Some(format!(
                "provider answered {status}; {}; the effect exists at the provider and is not sent again: check it there",
                reading.describe(map)
            ));
            "unmapped"
        }
    };
    (s, name)
}

/// `failed`: the provider refused the request for good.
pub fn failed(status: i32, response: String) -> Settlement {
    Settlement {
        state: Some(ClaimState::Failed),
        provider_status: Some(status),
        error: Some(format!("provider rejected the request with {status}")),
        provider_response: Some(response),
        ..Default::default()
    }
}

/// `failed` without a provider's answer: the claim was never sent (`send_deadline` passed).
pub fn never_sent(reason: String) -> Settlement {
    Settlement {
        state: Some(ClaimState::Failed),
        error: Some(reason),
        ..Default::default()
    }
}

/// `needs_attention`, with the reason a person reads.
pub fn park(reason: String, status: Option<i32>) -> Settlement {
    Settlement {
        state: Some(ClaimState::NeedsAttention),
        provider_status: status,
        error: Some(reason),
        ..Default::default()
    }
}

/// The error text an outcome leaves in the history and `last_error`.
pub fn error_of(outcome: &Outcome) -> String {
    match outcome {
        Outcome::NotApplied { error, .. } | Outcome::Unknown { error, .. } => error.clone(),
        Outcome::InProgress { status } => format!("provider answered {status}: still in progress"),
        Outcome::Applied { status, .. } | Outcome::Rejected { status, .. } => {
            format!("provider answered {status}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe() -> ValueOutcomes {
        ValueOutcomes {
            pointer: "/status".into(),
            completed: vec!["succeeded".into()],
            pending: vec!["processing".into()],
            needs_attention: vec!["requires_action".into()],
            failed: vec!["requires_payment_method".into()],
            id_pointer: "/id".into(),
            ..Default::default()
        }
    }

    #[test]
    fn without_a_mapping_a_2xx_completes_as_before() {
        let (s, name) = by_answer(None, "", 200, "{}".into(), false, "applied");
        assert_eq!(s.state, Some(ClaimState::Completed));
        assert_eq!(name, "applied");
        assert!(s.provider_id.is_none() && s.lease_for.is_none());
    }

    #[test]
    fn a_2xx_settles_by_the_value_in_it_and_never_completes_an_unknown_one() {
        let m = stripe();
        let settle = |status: &str| {
            by_answer(
                Some(&m),
                "",
                200,
                format!(r#"{{"id":"pi_7","status":"{status}"}}"#),
                false,
                "applied",
            )
        };
        let (s, name) = settle("succeeded");
        assert_eq!((s.state, name), (Some(ClaimState::Completed), "applied"));
        assert_eq!(s.provider_id.as_deref(), Some("pi_7"));
        let (s, name) = settle("processing");
        assert_eq!((s.state, name), (Some(ClaimState::Pending), "pending"));
        assert_eq!(s.lease_for, Some(m.pending_poll.0));
        let (s, _) = settle("requires_action");
        assert_eq!(s.state, Some(ClaimState::NeedsAttention));
        let (s, _) = settle("requires_payment_method");
        assert_eq!(s.state, Some(ClaimState::Failed));
        let (s, name) = settle("requires_confirmation");
        assert_eq!(
            (s.state, name),
            (Some(ClaimState::NeedsAttention), "unmapped")
        );
        assert!(s.error.unwrap().contains("not sent again"));
    }

    #[test]
    fn nul_characters_are_escaped_before_they_are_stored() {
        assert_eq!(storable("ok\0bin"), "ok\\0bin");
        assert!(matches!(
            storable("plain"),
            std::borrow::Cow::Borrowed("plain")
        ));
    }
}
