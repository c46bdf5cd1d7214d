//! Property tests for the pure parts: the state machine, key templates, fingerprints, id
//! validation and the classification of provider answers (CONTRACT.md, provider protocol).

use claimd::config::OnUnknown;
use claimd::domain::claim::{ClaimState, KeyTemplate, fingerprint, validate_message_id};
use claimd::engine::policy::{Step, Takeover, TakeoverFacts, after_outcome, on_takeover};
use claimd::provider::effect::{Outcome, StatusClass, classify_status};
use proptest::prelude::*;
use std::time::Duration;

fn state() -> impl Strategy<Value = ClaimState> {
    prop::sample::select(ClaimState::ALL.to_vec())
}

fn on_unknown() -> impl Strategy<Value = OnUnknown> {
    prop::sample::select(vec![
        OnUnknown::Redrive,
        OnUnknown::Reconcile,
        OnUnknown::Park,
    ])
}

proptest! {
    /// Walks of the state machine never leave `completed`, and only reach terminal states or
    /// `needs_attention` from `started` or by an operator.
    #[test]
    fn state_walks_only_take_legal_moves(moves in prop::collection::vec(state(), 1..30)) {
        let mut current = ClaimState::Started;
        for to in moves {
            if current.can_move_to(to) {
                prop_assert!(
                    current != ClaimState::Completed || to == ClaimState::NeedsAttention,
                    "completed is final but for a person's look"
                );
                current = to;
            }
        }
        prop_assert!(ClaimState::ALL.contains(&current));
    }

    #[test]
    fn completed_never_moves_but_to_a_person(to in state()) {
        prop_assert_eq!(
            ClaimState::Completed.can_move_to(to),
            to == ClaimState::NeedsAttention
        );
    }

    /// The key depends only on the stored identity: same inputs, same key; different message
    /// ids, different keys.
    #[test]
    fn key_templates_are_stable_and_injective_in_the_message_id(
        consumer in "[a-z]{1,8}", tenant in "[a-z0-9]{0,8}",
        a in "[!-~]{1,40}", b in "[!-~]{1,40}",
    ) {
        for t in ["{message_id}", "{consumer}:{tenant}:{message_id}", "k-{tenant}/{message_id}"] {
            let t: KeyTemplate = t.parse().unwrap();
            prop_assert_eq!(t.render(&consumer, &tenant, &a), t.render(&consumer, &tenant, &a));
            if a != b {
                prop_assert_ne!(t.render(&consumer, &tenant, &a), t.render(&consumer, &tenant, &b));
            }
        }
    }

    /// Two tenants never share a key, whatever bytes their ids and tenant names hold.
    #[test]
    fn distinct_identities_never_share_a_key(
        ta in "[!-~]{0,6}", tb in "[!-~]{0,6}", ma in "[!-~]{1,6}", mb in "[!-~]{1,6}",
    ) {
        for t in ["{consumer}:{tenant}:{message_id}", "{message_id}:{tenant}", "{tenant}/{message_id}"] {
            let t: KeyTemplate = t.parse().unwrap();
            if (ta.as_str(), ma.as_str()) != (tb.as_str(), mb.as_str()) {
                prop_assert_ne!(t.render("pay", &ta, &ma), t.render("pay", &tb, &mb));
            }
        }
    }

    #[test]
    fn fingerprints_are_stable_and_tell_payloads_apart(a in prop::collection::vec(any::<u8>(), 0..256), b in prop::collection::vec(any::<u8>(), 0..256)) {
        prop_assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        prop_assert_eq!(fingerprint(&a).len(), 64);
        if a != b {
            prop_assert_ne!(fingerprint(&a), fingerprint(&b));
        }
    }

    #[test]
    fn message_ids_are_accepted_exactly_when_1_to_255_visible_ascii(id in prop::collection::vec(any::<u8>(), 0..300)) {
        let ok = !id.is_empty() && id.len() <= 255 && id.iter().all(|b| (0x21..=0x7e).contains(b));
        prop_assert_eq!(validate_message_id(&id).is_ok(), ok);
    }

    /// Every status code maps to the class CONTRACT.md gives it.
    #[test]
    fn every_status_is_classified_as_the_contract_says(status in 100u16..600) {
        let class = classify_status(status);
        let want = if (200..300).contains(&status) {
            StatusClass::Applied
        } else if status == 409 {
            StatusClass::InProgress
        } else if [408, 425, 429, 503].contains(&status) {
            StatusClass::NotApplied
        } else if (400..500).contains(&status) {
            StatusClass::Rejected
        } else {
            StatusClass::Unknown
        };
        prop_assert_eq!(class, want);
    }

    /// An unknown outcome is never settled as completed or failed, whatever the policy.
    #[test]
    fn unknown_outcomes_are_never_settled_by_guess(policy in on_unknown(), can in any::<bool>(), status in prop::option::of(500i32..600)) {
        let step = after_outcome(&Outcome::Unknown { status, error: "x".into() }, policy, can);
        prop_assert!(!matches!(step, Step::Complete | Step::Fail));
        if policy == OnUnknown::Park {
            prop_assert!(matches!(step, Step::Park(_)));
        }
    }

    /// A takeover never re-sends blindly past `redrive_within` (the provider may have forgotten
    /// the key), unless an operator asked for it or the history proves the claim was never
    /// sent; waits never count towards `max_attempts`; a claim that may have been sent is never
    /// failed as "never sent".
    #[test]
    fn takeovers_never_resend_past_the_redrive_window(
        attempt in 1i32..40, waits in 0i32..20, max in 1u32..10, age_s in 0u64..10_000, window_s in 1u64..5_000,
        deadline_s in 1u64..10_000, unsent in prop::option::of(any::<bool>()),
        policy in on_unknown(), can in any::<bool>(),
        handoff in prop::option::of(prop::sample::select(vec![claimd::store::Handoff::NotApplied, claimd::store::Handoff::Undecided])),
    ) {
        let waits = waits.min(attempt - 1);
        let t = on_takeover(TakeoverFacts {
            attempt, waits, max_attempts: max, age: Duration::from_secs(age_s),
            redrive_within: Duration::from_secs(window_s), on_unknown: policy, handoff, can_reconcile: can, atomic: false,
            send_deadline: Duration::from_secs(deadline_s), proven_unsent: unsent,
        });
        if age_s > window_s && matches!(t, Takeover::Perform { .. }) {
            prop_assert!(handoff == Some(claimd::store::Handoff::NotApplied) && unsent == Some(true), "{:?}", t);
        }
        if matches!(t, Takeover::Fail(_)) {
            prop_assert!(unsent == Some(true) && age_s > deadline_s, "{:?}", t);
        }
        if i64::from(attempt - waits) > i64::from(max) {
            prop_assert!(matches!(t, Takeover::Park(_)));
        } else if let Takeover::Park(reason) = &t {
            prop_assert!(!reason.contains("exhausted"), "{}", reason);
        }
    }
}
