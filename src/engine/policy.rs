//! What to do next, decided from facts alone: the provider's outcome, the consumer's
//! `on_unknown`, attempts and age. Pure, so every branch is tested here; the claimer and the
//! sweeper only carry the decisions out.

use crate::config::OnUnknown;
use crate::domain::claim::Handoff;
use crate::provider::effect::Outcome;
use std::time::Duration;

#[path = "policy/sends.rs"]
mod sends;
pub use sends::{
    Sends, never_sent_quiet, not_found_past_deadline, read_sends, unproven_past_deadline,
};

/// The next step after one call to the provider, within an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Settle `completed`.
    Complete,
    /// Settle `failed`: a permanent rejection.
    Fail,
    /// Try again later with the same key: nothing was applied (or the provider is busy on it).
    Retry {
        /// The provider's wish, if it said one.
        retry_after: Option<Duration>,
    },
    /// The outcome is unknown and the consumer allows re-sending with the same key.
    Resend,
    /// The outcome is unknown: ask the status endpoint.
    Reconcile,
    /// The outcome is unknown and nothing may decide it: hand it to a person.
    Park(String),
    /// The call was not made, and as the claim stands never can be (a value would send it to
    /// another path): `failed` "never sent" when no earlier call may have reached the
    /// provider, else a person's. Carries why.
    NotSent(String),
}

/// Decides the step after `outcome` (invariant I6 for unknown outcomes).
pub fn after_outcome(outcome: &Outcome, on_unknown: OnUnknown, can_reconcile: bool) -> Step {
    match outcome {
        Outcome::Applied { .. } => Step::Complete,
        Outcome::Rejected { .. } => Step::Fail,
        Outcome::InProgress { .. } => Step::Retry { retry_after: None },
        Outcome::NotApplied {
            status: None,
            error,
            ..
        } if error.starts_with(crate::provider::effect::NOT_BUILT_URL_VALUE) => Step::NotSent(
            error
                .trim_start_matches(crate::provider::effect::NOT_BUILT)
                .trim_start_matches(": ")
                .to_string(),
        ),
        Outcome::NotApplied { retry_after, .. } => Step::Retry {
            retry_after: *retry_after,
        },
        Outcome::Unknown { error, .. } => match on_unknown {
            OnUnknown::Redrive => Step::Resend,
            OnUnknown::Reconcile if can_reconcile => Step::Reconcile,
            OnUnknown::Reconcile => Step::Park(format!(
                "outcome unknown ({error}) and the effect has no status endpoint to reconcile with"
            )),
            OnUnknown::Park => {
                Step::Park(format!("outcome unknown ({error}); on_unknown = \"park\""))
            }
        },
    }
}

/// What the sweeper does with a claim it took over.
#[derive(Debug, Clone, PartialEq)]
pub enum Takeover {
    /// Perform again with the same key. `resend` when the previous attempt's outcome is
    /// unknown (counted as a re-send in the report).
    Perform {
        /// The previous attempt may have applied the effect.
        resend: bool,
    },
    /// Ask the status endpoint before anything else.
    Reconcile,
    /// Hand it to a person, with the reason.
    Park(String),
    /// Settle `failed` with the reason: the claim was provably never sent and waited past
    /// `send_deadline` (safe to submit again).
    Fail(String),
    /// Read the claim's history first: whether it was ever sent decides
    /// ([`read_sends`], then [`on_takeover`] again with [`TakeoverFacts::proven_unsent`], or
    /// [`unproven_past_deadline`]).
    CheckSent,
}

/// Facts about a claim the sweeper just took over.
#[derive(Debug, Clone, Copy)]
pub struct TakeoverFacts {
    /// The attempt number after the takeover.
    pub attempt: i32,
    /// Attempts that ended waiting rather than deciding (not counted towards `max_attempts`).
    pub waits: i32,
    /// The consumer's `max_attempts`.
    pub max_attempts: u32,
    /// Time since the claim was received (database clock).
    pub age: Duration,
    /// The consumer's `redrive_within`.
    pub redrive_within: Duration,
    /// The consumer's `on_unknown`.
    pub on_unknown: OnUnknown,
    /// How the previous attempt let go, if on purpose.
    pub handoff: Option<Handoff>,
    /// The effect has a status endpoint.
    pub can_reconcile: bool,
    /// The consumer's `send_deadline`: how long a claim that was never sent may wait.
    pub send_deadline: Duration,
    /// The effect commits with its settle (a database effect): an attempt that left the
    /// claim `started` applied nothing, so it is performed again, never asked about.
    pub atomic: bool,
    /// What the history says ([`read_sends`] is [`Sends::NeverSent`]), once read: `Some(true)` when no call may have
    /// reached the provider. `None`: not read yet.
    pub proven_unsent: Option<bool>,
}

/// Decides a takeover. A stale claim's last attempt may have been cut anywhere (crash,
/// timeout), so its outcome is unknown unless the previous holder handed it off on purpose.
/// Only attempts that could have decided count towards `max_attempts` (`attempt - waits`):
/// a provider that is down, rate limited or slow to answer lookups makes a claim wait, never
/// brings it closer to a person.
pub fn on_takeover(f: TakeoverFacts) -> Takeover {
    if f.handoff == Some(Handoff::OperatorRedrive) {
        return Takeover::Perform { resend: false };
    }
    // `attempt` is the takeover about to start; the last one that ran was `attempt - 1`.
    let counted = i64::from(f.attempt) - i64::from(f.waits.max(0));
    if counted > i64::from(f.max_attempts) {
        if f.atomic {
            // A database effect has no provider: its attempts are transactions.
            let waited = if f.waits > 0 {
                format!(
                    " and {} more waited (for a call slot or a store connection)",
                    f.waits
                )
            } else {
                String::new()
            };
            let runs = counted - 1;
            let s = if runs == 1 { "" } else { "s" };
            return Takeover::Park(format!(
                "attempts exhausted: {runs} attempt{s} at the database effect's transaction ended without a commit (max_attempts = {}){waited}; nothing was applied (its history has each reason)",
                f.max_attempts
            ));
        }
        let waited = if f.waits > 0 {
            format!(" and {} more waited for the provider", f.waits)
        } else {
            String::new()
        };
        return Takeover::Park(format!(
            "attempts exhausted: {} attempts ended without a decision (max_attempts = {}){waited}",
            counted - 1,
            f.max_attempts
        ));
    }
    if f.atomic {
        return Takeover::Perform { resend: false };
    }
    let within = f.age <= f.redrive_within;
    let unsent = match f.handoff {
        // Nothing was ever sent under the key: the marker proves it.
        Some(Handoff::NotCalled) => Some(true),
        // The last attempt's answers prove it applied nothing; earlier ones may not have.
        Some(Handoff::NotApplied) if within && f.age <= f.send_deadline => {
            return Takeover::Perform { resend: false };
        }
        Some(Handoff::NotApplied) => match f.proven_unsent {
            None => return Takeover::CheckSent,
            known => known,
        },
        _ => None,
    };
    if unsent == Some(true) {
        // A first send, whatever the key window, until the deadline; then `failed`, which is
        // safe to submit again: the provider never saw the key.
        return if f.age > f.send_deadline {
            Takeover::Fail(never_sent_reason(f.send_deadline))
        } else {
            Takeover::Perform { resend: false }
        };
    }
    if within && f.handoff == Some(Handoff::NotApplied) {
        return Takeover::Perform { resend: false };
    }
    match f.on_unknown {
        OnUnknown::Redrive if within => Takeover::Perform { resend: true },
        OnUnknown::Park => Takeover::Park(
            "previous attempt ended without an answer (crash or timeout); on_unknown = \"park\""
                .into(),
        ),
        _ if f.can_reconcile => Takeover::Reconcile,
        OnUnknown::Reconcile => Takeover::Park(
            "outcome unknown and the effect has no status endpoint to reconcile with".into(),
        ),
        OnUnknown::Redrive => Takeover::Park(format!(
            "outcome unknown and the claim is older than redrive_within ({}s): the provider may have forgotten the key",
            f.redrive_within.as_secs()
        )),
    }
}

/// The reason a never-sent claim ends `failed` with.
pub fn never_sent_reason(send_deadline: Duration) -> String {
    format!(
        "never sent: the provider could not take the call for send_deadline ({}); every answer proved it never received it (no connection, a refused stream, a non-receipt status), so submitting it again is safe",
        crate::domain::duration::Dur(send_deadline)
    )
}

/// How long a claim that waits (its destination down or rate limited, a lookup without an
/// answer) is left before the sweeper takes it again: doubling from 0.5 s with each wait,
/// capped at `cap`.
pub fn wait_backoff(waits: i32, cap: Duration) -> Duration {
    let exp = waits.clamp(0, 16) as u32;
    Duration::from_millis(500u64 << exp).min(cap)
}

/// The longest wait between two polls of a `pending` claim.
pub const PENDING_POLL_CAP: Duration = Duration::from_secs(3600);

/// What the sweeper does with a `pending` claim whose next poll is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PendingStep {
    /// Ask the provider's status endpoint; if still pending, ask again after the `Duration`.
    Poll(Duration),
    /// No status endpoint: wait for the provider's event, at most the `Duration` more.
    Wait(Duration),
    /// Pending longer than `pending_for`: a person looks (the reason).
    Park(String),
}

/// The next step for a pending claim that has been pending for `pending_age`: polled
/// (or, without a status endpoint, left to its events) at a wait that grows with its age —
/// a quarter of it, never less than `pending_poll` nor more than [`PENDING_POLL_CAP`] — and
/// parked once it has been pending longer than `pending_for`.
pub fn on_pending(
    pending_age: Duration,
    pending_poll: Duration,
    pending_for: Duration,
    can_poll: bool,
) -> PendingStep {
    if pending_age >= pending_for {
        return PendingStep::Park(format!(
            "still pending after {} (pending_for = {}): the provider accepted it and has not said how it ended; check it there",
            crate::domain::duration::Dur(Duration::from_secs(pending_age.as_secs())),
            crate::domain::duration::Dur(pending_for)
        ));
    }
    let left = pending_for - pending_age;
    if !can_poll {
        return PendingStep::Wait(left);
    }
    let next = (pending_age / 4).clamp(pending_poll, PENDING_POLL_CAP.max(pending_poll));
    PendingStep::Poll(next.min(left))
}

/// After a status lookup said "not found": perform again only within `redrive_within`.
pub fn after_not_found(age: Duration, redrive_within: Duration) -> Takeover {
    if age <= redrive_within {
        Takeover::Perform { resend: false }
    } else {
        Takeover::Park(format!(
            "provider has no record of the key, but the claim is older than redrive_within ({}s); a person must decide",
            redrive_within.as_secs()
        ))
    }
}

/// Within one attempt, before repeating a send whose effect may have happened (an unknown
/// outcome, or a "not found" lookup that may lag the send): allowed only while the provider
/// keeps the key (I6). `Err` carries the reason to park with.
pub fn resend_within_window(age: Duration, redrive_within: Duration) -> Result<(), String> {
    if age <= redrive_within {
        Ok(())
    } else {
        Err(format!(
            "outcome unknown and the claim is older than redrive_within ({}s): sending again could apply it twice; a person must decide",
            redrive_within.as_secs()
        ))
    }
}

/// Whether intake may claim ahead of a free call slot: only when the sweeper can settle a
/// claim that a crash orphans without a person — by re-sending it (`redrive`) or asking the
/// provider (`reconcile` with a status endpoint). Otherwise an orphan is parked, and claims
/// waiting for a slot would add to what a crash leaves for a person.
pub fn claims_ahead(on_unknown: OnUnknown, can_reconcile: bool) -> bool {
    match on_unknown {
        OnUnknown::Park => false,
        OnUnknown::Redrive => true,
        OnUnknown::Reconcile => can_reconcile,
    }
}

/// How long after its receipt a waiting claim's take may also clear its "not called yet"
/// marker (`None`: never; the taker clears it just before the call). Only for a consumer that
/// claims ahead: a worker that dies between the take and the call leaves the claim to a
/// takeover when its lease ends, which re-sends or reconciles it only while it is within
/// `redrive_within` (an older claim without the marker is parked): so a claim older than
/// `redrive_within - lease` keeps its marker through the take.
pub fn clear_marker_within(
    claims_ahead: bool,
    redrive_within: Duration,
    lease: Duration,
) -> Option<Duration> {
    if !claims_ahead {
        return None;
    }
    redrive_within.checked_sub(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_clears_the_marker_only_of_claims_a_takeover_would_still_resend() {
        let (hour, minute) = (Duration::from_secs(3600), Duration::from_secs(60));
        assert_eq!(
            clear_marker_within(true, hour, minute),
            Some(Duration::from_secs(3540))
        );
        assert_eq!(
            clear_marker_within(false, hour, minute),
            None,
            "parks orphans"
        );
        assert_eq!(
            clear_marker_within(true, minute, hour),
            None,
            "lease past the window"
        );
    }

    #[test]
    fn a_claim_never_called_is_performed_even_under_park_and_past_the_window() {
        let f = TakeoverFacts {
            attempt: 2,
            max_attempts: 8,
            age: Duration::from_secs(90_000),
            redrive_within: Duration::from_secs(60),
            on_unknown: OnUnknown::Park,
            handoff: Some(Handoff::NotCalled),
            can_reconcile: false,
            atomic: false,
            waits: 0,
            send_deadline: Duration::from_secs(7 * 86_400),
            proven_unsent: None,
        };
        assert_eq!(on_takeover(f), Takeover::Perform { resend: false });
        let exhausted = TakeoverFacts { attempt: 9, ..f };
        assert!(matches!(on_takeover(exhausted), Takeover::Park(r)
            if r == "attempts exhausted: 8 attempts ended without a decision (max_attempts = 8)"));
    }

    #[test]
    fn a_send_that_may_have_applied_is_repeated_only_within_the_key_window() {
        let window = Duration::from_secs(60);
        assert!(resend_within_window(Duration::from_secs(59), window).is_ok());
        assert!(resend_within_window(window, window).is_ok());
        let why = resend_within_window(Duration::from_secs(61), window).unwrap_err();
        assert!(why.contains("redrive_within (60s)"), "{why}");
    }

    #[test]
    fn only_consumers_that_settle_orphans_alone_claim_ahead() {
        assert!(claims_ahead(OnUnknown::Redrive, false));
        assert!(claims_ahead(OnUnknown::Reconcile, true));
        assert!(!claims_ahead(OnUnknown::Reconcile, false));
        assert!(!claims_ahead(OnUnknown::Park, true));
    }

    fn unknown() -> Outcome {
        Outcome::Unknown {
            status: Some(500),
            error: "boom".into(),
        }
    }

    #[test]
    fn outcomes_map_to_steps() {
        let ok = Outcome::Applied {
            status: 200,
            response: String::new(),
        };
        assert_eq!(after_outcome(&ok, OnUnknown::Park, false), Step::Complete);
        let no = Outcome::Rejected {
            status: 400,
            response: String::new(),
        };
        assert_eq!(after_outcome(&no, OnUnknown::Redrive, true), Step::Fail);
        let busy = Outcome::NotApplied {
            status: Some(429),
            retry_after: Some(Duration::from_secs(2)),
            error: String::new(),
        };
        assert_eq!(
            after_outcome(&busy, OnUnknown::Park, false),
            Step::Retry {
                retry_after: Some(Duration::from_secs(2))
            }
        );
        assert_eq!(
            after_outcome(&Outcome::InProgress { status: 409 }, OnUnknown::Park, false),
            Step::Retry { retry_after: None }
        );
    }

    #[test]
    fn a_request_that_can_never_be_built_is_not_sent_and_not_retried() {
        let not_built = |error: &str| Outcome::NotApplied {
            status: None,
            retry_after: None,
            error: error.into(),
        };
        let dot = not_built("could not build the request: URL field account is \"..\": a dot");
        assert_eq!(
            after_outcome(&dot, OnUnknown::Redrive, true),
            Step::NotSent("URL field account is \"..\": a dot".into())
        );
        // A missing field may come back with the configuration that had it: retried.
        let missing = not_built("could not build the request: the payload has no field \"a\"");
        assert_eq!(
            after_outcome(&missing, OnUnknown::Park, false),
            Step::Retry { retry_after: None }
        );
    }

    #[test]
    fn unknown_outcomes_are_never_guessed() {
        assert_eq!(
            after_outcome(&unknown(), OnUnknown::Redrive, false),
            Step::Resend
        );
        assert_eq!(
            after_outcome(&unknown(), OnUnknown::Reconcile, true),
            Step::Reconcile
        );
        assert!(matches!(
            after_outcome(&unknown(), OnUnknown::Reconcile, false),
            Step::Park(_)
        ));
        assert!(matches!(
            after_outcome(&unknown(), OnUnknown::Park, true),
            Step::Park(_)
        ));
    }

    fn facts() -> TakeoverFacts {
        TakeoverFacts {
            attempt: 2,
            max_attempts: 8,
            age: Duration::from_secs(60),
            redrive_within: Duration::from_secs(3600),
            on_unknown: OnUnknown::Reconcile,
            handoff: None,
            can_reconcile: true,
            atomic: false,
            waits: 0,
            send_deadline: Duration::from_secs(86_400),
            proven_unsent: None,
        }
    }

    #[test]
    fn takeover_respects_policy_window_and_attempts() {
        assert_eq!(on_takeover(facts()), Takeover::Reconcile);
        let redrive = TakeoverFacts {
            on_unknown: OnUnknown::Redrive,
            ..facts()
        };
        assert_eq!(on_takeover(redrive), Takeover::Perform { resend: true });
        let late = TakeoverFacts {
            age: Duration::from_secs(7200),
            ..redrive
        };
        assert_eq!(on_takeover(late), Takeover::Reconcile);
        let late_no_status = TakeoverFacts {
            can_reconcile: false,
            atomic: false,
            ..late
        };
        assert!(
            matches!(on_takeover(late_no_status), Takeover::Park(r) if r.contains("redrive_within"))
        );
        let park = TakeoverFacts {
            on_unknown: OnUnknown::Park,
            ..facts()
        };
        assert!(matches!(on_takeover(park), Takeover::Park(_)));
        let exhausted = TakeoverFacts {
            attempt: 9,
            ..facts()
        };
        assert!(matches!(on_takeover(exhausted), Takeover::Park(r) if r.contains("exhausted")));
    }

    #[test]
    fn a_clean_hand_off_may_be_performed_even_under_park() {
        let f = TakeoverFacts {
            on_unknown: OnUnknown::Park,
            handoff: Some(Handoff::NotApplied),
            ..facts()
        };
        assert_eq!(on_takeover(f), Takeover::Perform { resend: false });
        let late = TakeoverFacts {
            age: Duration::from_secs(7200),
            ..f
        };
        // Past the key window the history decides: sent before (maybe applied) parks.
        assert_eq!(on_takeover(late), Takeover::CheckSent);
        let sent_before = TakeoverFacts {
            proven_unsent: Some(false),
            ..late
        };
        assert!(matches!(on_takeover(sent_before), Takeover::Park(_)));
        let never_sent = TakeoverFacts {
            proven_unsent: Some(true),
            ..late
        };
        assert_eq!(on_takeover(never_sent), Takeover::Perform { resend: false });
        let operator = TakeoverFacts {
            handoff: Some(Handoff::OperatorRedrive),
            attempt: 20,
            ..late
        };
        assert_eq!(on_takeover(operator), Takeover::Perform { resend: false });
    }

    #[test]
    fn waits_never_count_towards_max_attempts() {
        // A provider down for a long time: 40 takeovers, 38 of them waits.
        let waited = TakeoverFacts {
            attempt: 41,
            waits: 38,
            handoff: Some(Handoff::NotApplied),
            ..facts()
        };
        assert_eq!(on_takeover(waited), Takeover::Perform { resend: false });
        let undecided = TakeoverFacts {
            handoff: Some(Handoff::Undecided),
            ..waited
        };
        assert_eq!(on_takeover(undecided), Takeover::Reconcile);
        // Nine attempts that could have decided, whatever the waits.
        let exhausted = TakeoverFacts {
            attempt: 48,
            waits: 38,
            handoff: None,
            ..facts()
        };
        assert!(matches!(on_takeover(exhausted), Takeover::Park(r)
            if r == "attempts exhausted: 9 attempts ended without a decision (max_attempts = 8) and 38 more waited for the provider"));
    }

    #[test]
    fn a_claim_never_sent_ends_failed_at_its_deadline_never_parked() {
        let day = Duration::from_secs(86_400);
        let unsent = TakeoverFacts {
            age: day + Duration::from_secs(1),
            redrive_within: day,
            send_deadline: day,
            on_unknown: OnUnknown::Park,
            handoff: Some(Handoff::NotApplied),
            ..facts()
        };
        assert_eq!(on_takeover(unsent), Takeover::CheckSent);
        let proven = TakeoverFacts {
            proven_unsent: Some(true),
            ..unsent
        };
        assert!(matches!(on_takeover(proven), Takeover::Fail(r) if r.starts_with("never sent")));
        let marker = TakeoverFacts {
            handoff: Some(Handoff::NotCalled),
            ..unsent
        };
        assert!(matches!(on_takeover(marker), Takeover::Fail(_)));
        // Sent once with an unknown outcome: never failed as "never sent".
        let maybe = TakeoverFacts {
            proven_unsent: Some(false),
            ..unsent
        };
        assert!(matches!(on_takeover(maybe), Takeover::Park(_)));
    }

    #[test]
    fn waits_back_off_to_a_cap() {
        let cap = Duration::from_secs(30);
        assert_eq!(wait_backoff(0, cap), Duration::from_millis(500));
        assert_eq!(wait_backoff(3, cap), Duration::from_secs(4));
        assert_eq!(wait_backoff(10, cap), cap);
        assert_eq!(wait_backoff(i32::MAX, cap), cap);
    }

    #[test]
    fn not_found_is_redriven_only_within_the_window() {
        let w = Duration::from_secs(10);
        assert_eq!(
            after_not_found(Duration::from_secs(5), w),
            Takeover::Perform { resend: false }
        );
        assert!(matches!(
            after_not_found(Duration::from_secs(11), w),
            Takeover::Park(_)
        ));
    }

    #[test]
    fn a_pending_claim_is_polled_less_often_as_it_ages_and_parked_past_pending_for() {
        let poll = Duration::from_secs(30);
        let week = Duration::from_secs(7 * 86400);
        let at = |s: u64| on_pending(Duration::from_secs(s), poll, week, true);
        assert_eq!(at(0), PendingStep::Poll(poll));
        assert_eq!(at(60), PendingStep::Poll(poll));
        assert_eq!(at(400), PendingStep::Poll(Duration::from_secs(100)));
        assert_eq!(at(86400), PendingStep::Poll(PENDING_POLL_CAP));
        assert_eq!(
            at(7 * 86400 - 10),
            PendingStep::Poll(Duration::from_secs(10))
        );
        assert!(
            matches!(at(7 * 86400), PendingStep::Park(r) if r.contains("still pending after 7d"))
        );
        assert_eq!(
            on_pending(Duration::from_secs(100), poll, week, false),
            PendingStep::Wait(week - Duration::from_secs(100))
        );
    }

    #[test]
    fn a_database_effect_taken_over_is_performed_again_under_every_policy() {
        for on_unknown in [OnUnknown::Park, OnUnknown::Reconcile, OnUnknown::Redrive] {
            let f = TakeoverFacts {
                atomic: true,
                on_unknown,
                age: Duration::from_secs(10 * 86_400),
                ..facts()
            };
            assert_eq!(on_takeover(f), Takeover::Perform { resend: false });
        }
        let spent = TakeoverFacts {
            atomic: true,
            attempt: 10,
            waits: 1,
            ..facts()
        };
        let Takeover::Park(why) = on_takeover(spent) else {
            panic!("parks once its attempts are spent")
        };
        assert!(why.contains("attempts exhausted: 8 attempts"), "{why}");
        assert!(
            !why.contains("provider"),
            "a database effect has none: {why}"
        );
    }
}
