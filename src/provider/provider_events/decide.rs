//! What a verified provider event does to the claim it names (whether it names it is
//! [`evidence`](super::evidence)'s question): pure, so every pair of (claim state, what the
//! event's object says) is tested here. An event settles a claim that is not final yet with
//! the same fenced transitions as everything else; on a final claim it changes nothing unless
//! it contradicts the final state (then a person looks: nothing flips silently); a stale event
//! (an earlier status arriving late) is only recorded.

use crate::domain::claim::ClaimState;
use crate::provider::effect::by_value::Verdict;

/// What to do with one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventMove {
    /// Move the claim to the state the event's object says (fenced on the state read).
    Settle(ClaimState),
    /// The provider contradicts the claim's final state: park it for a person, with both
    /// sides in the reason.
    Flag(Contradiction),
    /// Nothing to change (a repeat of what the claim already says, a late earlier status, a
    /// value the effect does not map, a contradiction of a completed claim); the event goes
    /// into the claim's history.
    Record(Recorded),
}

/// Why an event changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The claim already is where the event says.
    Same,
    /// The event says less than the claim knows (`pending` for a final claim).
    Stale,
    /// The object's value is not mapped: unknown, never completed.
    Unmapped,
    /// The provider reports a `completed` claim's object needs the customer: an earlier
    /// status arriving late (counted as a conflict, in the history).
    Contradicts,
}

/// Which final state the provider contradicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contradiction {
    /// The claim `failed`; the provider now reports its object succeeded.
    DoneAfterFailed,
    /// The claim `completed`; the provider now reports its object failed.
    FailedAfterDone,
}

impl EventMove {
    /// The result name in responses, history and `claimd_provider_events_total{result}`.
    pub fn result(self) -> &'static str {
        match self {
            EventMove::Settle(_) => "settled",
            EventMove::Flag(_) => "conflict",
            EventMove::Record(Recorded::Same) => "same",
            EventMove::Record(Recorded::Stale) => "stale",
            EventMove::Record(Recorded::Unmapped) => "unmapped",
            EventMove::Record(Recorded::Contradicts) => "conflict",
        }
    }
}

/// The move for a claim in `current` given the event's `verdict` (`None`: unmapped).
pub fn on_event(current: ClaimState, verdict: Option<Verdict>) -> EventMove {
    use ClaimState as S;
    let Some(verdict) = verdict else {
        return EventMove::Record(Recorded::Unmapped);
    };
    let reported = match verdict {
        Verdict::Completed => S::Completed,
        Verdict::Pending => S::Pending,
        Verdict::NeedsAttention => S::NeedsAttention,
        Verdict::Failed => S::Failed,
    };
    match (current, reported) {
        (a, b) if a == b => EventMove::Record(Recorded::Same),
        // Not final yet: the provider's word decides.
        (S::Started | S::Pending | S::NeedsAttention, to) => EventMove::Settle(to),
        // Final: an earlier status arriving late says nothing new.
        (S::Completed | S::Failed, S::Pending) => EventMove::Record(Recorded::Stale),
        // A failed claim the provider now reports done: money moved although claimd said it
        // did not (the customer retried with another card, say). A person decides.
        (S::Failed, S::Completed) => EventMove::Flag(Contradiction::DoneAfterFailed),
        // A completed claim whose own object the provider now reports failed: one of the two
        // reports is wrong about money. A person decides, with both in the reason.
        (S::Completed, S::Failed) => EventMove::Flag(Contradiction::FailedAfterDone),
        // A failed claim that now needs the customer: still not paid; recorded.
        (S::Failed, S::NeedsAttention) => EventMove::Record(Recorded::Stale),
        (S::Completed, _) => EventMove::Record(Recorded::Contradicts),
        (S::Failed, _) => EventMove::Record(Recorded::Same),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ClaimState as S;

    #[test]
    fn an_open_claim_takes_the_providers_word() {
        for from in [S::Started, S::Pending, S::NeedsAttention] {
            assert_eq!(
                on_event(from, Some(Verdict::Completed)),
                EventMove::Settle(S::Completed)
            );
            assert_eq!(
                on_event(from, Some(Verdict::Failed)),
                EventMove::Settle(S::Failed)
            );
        }
        assert_eq!(
            on_event(S::Started, Some(Verdict::Pending)),
            EventMove::Settle(S::Pending)
        );
        assert_eq!(
            on_event(S::Pending, Some(Verdict::NeedsAttention)),
            EventMove::Settle(S::NeedsAttention)
        );
    }

    #[test]
    fn duplicates_and_late_events_change_nothing() {
        assert_eq!(
            on_event(S::Completed, Some(Verdict::Completed)),
            EventMove::Record(Recorded::Same)
        );
        assert_eq!(
            on_event(S::Pending, Some(Verdict::Pending)),
            EventMove::Record(Recorded::Same)
        );
        for final_state in [S::Completed, S::Failed] {
            assert_eq!(
                on_event(final_state, Some(Verdict::Pending)),
                EventMove::Record(Recorded::Stale)
            );
        }
    }

    #[test]
    fn success_after_failure_is_flagged_never_flipped() {
        assert_eq!(
            on_event(S::Failed, Some(Verdict::Completed)),
            EventMove::Flag(Contradiction::DoneAfterFailed)
        );
        assert_eq!(
            on_event(S::Completed, Some(Verdict::Failed)),
            EventMove::Flag(Contradiction::FailedAfterDone)
        );
        assert_eq!(
            on_event(S::Completed, Some(Verdict::NeedsAttention)),
            EventMove::Record(Recorded::Contradicts)
        );
    }

    #[test]
    fn every_settle_is_a_move_the_state_machine_allows() {
        let verdicts = [
            None,
            Some(Verdict::Completed),
            Some(Verdict::Pending),
            Some(Verdict::NeedsAttention),
            Some(Verdict::Failed),
        ];
        for from in ClaimState::ALL {
            for v in verdicts {
                match on_event(from, v) {
                    EventMove::Settle(to) => assert!(from.can_move_to(to), "{from} -> {to}"),
                    EventMove::Flag(_) => {
                        assert!(from.can_move_to(S::NeedsAttention), "{from} flagged")
                    }
                    EventMove::Record(_) => {}
                }
            }
        }
        assert_eq!(
            on_event(S::Pending, None),
            EventMove::Record(Recorded::Unmapped)
        );
    }
}
