//! What a claim's history proves about its calls ([`Sends`]), and what follows for a claim
//! past `send_deadline`: "never sent" only from proof that the provider never received it.
//! Pure, like the rest of [`crate::engine::policy`].

use super::{Takeover, after_not_found};
use crate::config::OnUnknown;
use std::collections::BTreeMap;
use std::time::Duration;

/// What a claim's history says about whether its calls reached the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sends {
    /// No call may have reached it: every ended attempt handed off `not_applied`, and every
    /// answer proves non-receipt (no connection, a refused stream, a status in
    /// `effect.non_receipt_status`). Failing it as "never sent" is safe.
    NeverSent,
    /// Every call was answered "retry later with the same key", but some answers do not
    /// prove the provider never received it (a `503` may come from a proxy after the provider
    /// applied the call; a `409` says the provider holds the key): how many of each status.
    Unproven(BTreeMap<Option<i32>, u32>),
    /// A call may have applied (an unknown outcome, a re-send, a lookup that found it), or an
    /// attempt was cut without a hand-off (a crash mid-call leaves no line).
    MaybeApplied,
}

/// Reads a claim's history (`(attempt, action, outcome, provider status)` lines) for
/// [`Sends`]: every attempt before `attempt` must have ended in a `not_applied` hand-off, and
/// no line may show a call that may have applied. `proves` says whether a not-applied answer
/// with that status proves non-receipt ([`crate::provider::effect::Effect::proves_non_receipt`]); a
/// `409` (the provider is working on the key) never does.
pub fn read_sends<'a>(
    events: impl IntoIterator<Item = (i32, &'a str, &'a str, Option<i32>)>,
    attempt: i32,
    proves: impl Fn(Option<i32>) -> bool,
) -> Sends {
    let mut clean = std::collections::BTreeSet::new();
    let mut unproven = BTreeMap::new();
    let mut answer = |status: Option<i32>, busy: bool| {
        if busy || status == Some(409) || !proves(status) {
            *unproven.entry(status).or_insert(0) += 1;
        }
    };
    for (at, action, outcome, status) in events {
        match (action, outcome) {
            ("perform", "not_applied") => answer(status, false),
            ("perform", "in_progress") => answer(status, true),
            ("perform", _) | ("resend", _) | ("lookup", "found") => return Sends::MaybeApplied,
            ("handoff", "not_applied") => {
                clean.insert(at);
                // The last call of an attempt leaves its answer on the hand-off line; a
                // hand-off without a status made no call (held back, not built, not called).
                if status.is_some() {
                    answer(status, false);
                }
            }
            _ => {}
        }
    }
    if !(1..attempt).all(|a| clean.contains(&a)) {
        Sends::MaybeApplied
    } else if unproven.is_empty() {
        Sends::NeverSent
    } else {
        Sends::Unproven(unproven)
    }
}

/// A claim past `send_deadline` whose calls were all answered "retry later" without proof
/// that the provider never received them: never failed as "never sent" (a producer would
/// submit it again under a new key). Its status endpoint decides when it has one and the
/// consumer lets unknown outcomes be reconciled; otherwise a person, told what was answered.
pub fn unproven_past_deadline(
    answers: &BTreeMap<Option<i32>, u32>,
    key: &str,
    send_deadline: Duration,
    on_unknown: OnUnknown,
    can_reconcile: bool,
) -> Takeover {
    if can_reconcile && on_unknown != OnUnknown::Park {
        return Takeover::Reconcile;
    }
    let calls: u32 = answers.values().sum();
    let list = answers
        .iter()
        .map(|(status, n)| match status {
            Some(s) => format!("{s} \u{d7}{n}"),
            None => format!("no answer \u{d7}{n}"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut why = Vec::new();
    if answers.keys().any(|s| *s == Some(409)) {
        why.push("a 409 says the provider holds the key");
    }
    if answers.keys().any(|s| *s != Some(409)) {
        why.push("a 503 (or 408, 425) may come from a proxy after the provider applied the call");
    }
    Takeover::Park(format!(
        "not sent within send_deadline ({}), and not proven never received: {calls} answers without proof ({list}); {}; look it up at the provider by key {key}",
        crate::domain::duration::Dur(send_deadline),
        why.join("; ")
    ))
}

/// How long a claim past `send_deadline` must have been quiet (no call that may have applied)
/// before its status endpoint's "not found" ends it `failed` "never sent": `not_found_after`,
/// and never less than three times the effect's `timeout`. A call the client gave up on may
/// still sit in the provider's queue and be applied after the first lookup; the conclusion
/// "submitting it again is safe" must not be drawn from a lookup that raced it.
pub fn never_sent_quiet(not_found_after: Duration, timeout: Duration) -> Duration {
    not_found_after.max(timeout.saturating_mul(3))
}

/// After a trusted "not found" (asked `not_found_after` past the last call) for a claim past
/// `send_deadline`, which is sent no more: the provider's own record proves nothing was
/// applied, so it ends `failed` "never sent" within `redrive_within`; past it the provider may
/// have forgotten the key, so a person decides ([`after_not_found`]).
pub fn not_found_past_deadline(age: Duration, redrive_within: Duration, key: &str) -> Takeover {
    match after_not_found(age, redrive_within) {
        Takeover::Perform { .. } => Takeover::Fail(format!(
            "never sent: past send_deadline, and the provider's status endpoint has no record of key {key} (asked after not_found_after); submitting it again is safe"
        )),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_not_found_proves_never_sent_only_after_three_timeouts_of_quiet() {
        let s = Duration::from_secs;
        assert_eq!(never_sent_quiet(Duration::ZERO, s(10)), s(30));
        assert_eq!(never_sent_quiet(s(120), s(10)), s(120));
        assert_eq!(never_sent_quiet(s(5), Duration::from_millis(1500)), s(5));
    }

    #[test]
    fn only_clean_not_applied_hand_offs_prove_a_claim_never_sent() {
        let any = |_: Option<i32>| true;
        let clean = [
            (1, "perform", "not_applied", None),
            (1, "handoff", "not_applied", None),
            (2, "lookup", "unknown", None),
            (2, "handoff", "not_applied", None),
        ];
        assert_eq!(read_sends(clean, 3, any), Sends::NeverSent);
        // Attempt 2 was cut (a crash mid-call leaves no line): nothing proven.
        assert_eq!(
            read_sends(clean[..2].iter().copied(), 3, any),
            Sends::MaybeApplied
        );
        let unknown = [
            (1, "perform", "unknown", Some(500)),
            (1, "handoff", "not_applied", None),
        ];
        assert_eq!(read_sends(unknown, 2, any), Sends::MaybeApplied);
        let resent = [
            (1, "resend", "takeover", None),
            (1, "handoff", "not_applied", None),
        ];
        assert_eq!(read_sends(resent, 2, any), Sends::MaybeApplied);
    }

    #[test]
    fn answers_that_only_say_retry_later_never_prove_a_claim_never_sent() {
        // As the HTTP effect reads them by default: no answer and 429 prove non-receipt.
        let proof = |s: Option<i32>| s.is_none() || s == Some(429);
        let refused = [
            (1, "perform", "not_applied", None),
            (1, "perform", "not_applied", Some(429)),
            (1, "handoff", "not_applied", None),
        ];
        assert_eq!(read_sends(refused, 2, proof), Sends::NeverSent);
        // A 503 that ends an attempt is on its hand-off line only; it still counts.
        let unavailable = [
            (1, "perform", "not_applied", Some(503)),
            (1, "handoff", "not_applied", Some(503)),
            (2, "handoff", "not_applied", Some(503)),
        ];
        assert_eq!(
            read_sends(unavailable, 3, proof),
            Sends::Unproven(BTreeMap::from([(Some(503), 3)]))
        );
        // A 409 is the provider holding the key: never proof, whatever the effect says.
        let busy = [
            (1, "perform", "in_progress", Some(409)),
            (1, "handoff", "not_applied", Some(409)),
        ];
        assert_eq!(
            read_sends(busy, 2, |_| true),
            Sends::Unproven(BTreeMap::from([(Some(409), 2)]))
        );
    }

    #[test]
    fn an_unproven_claim_past_its_deadline_is_looked_up_or_parked_with_the_evidence() {
        let answers = BTreeMap::from([(Some(503), 5)]);
        let day = Duration::from_secs(86_400);
        assert_eq!(
            unproven_past_deadline(&answers, "k1", day, OnUnknown::Redrive, true),
            Takeover::Reconcile
        );
        let Takeover::Park(why) =
            unproven_past_deadline(&answers, "k1", day, OnUnknown::Redrive, false)
        else {
            panic!("parked without a status endpoint");
        };
        assert!(why.contains("503 \u{d7}5"), "{why}");
        assert!(why.contains("proxy"), "{why}");
        assert!(why.contains("by key k1"), "{why}");
        assert!(matches!(
            unproven_past_deadline(&answers, "k1", day, OnUnknown::Park, true),
            Takeover::Park(_)
        ));
        // The provider's own "not found" is proof, within the key window.
        assert!(matches!(
            not_found_past_deadline(Duration::from_secs(10), day, "k1"),
            Takeover::Fail(r) if r.starts_with("never sent") && r.contains("k1")
        ));
        assert!(matches!(
            not_found_past_deadline(day * 2, day, "k1"),
            Takeover::Park(_)
        ));
    }
}
