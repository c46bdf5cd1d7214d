//! What each statement of the one body binds ([`Arg`]s in the order its `Statements` field
//! documents), and the rules the rows are read by that more than one write path shares: what
//! a key already taken means for a claim ([`repeat_outcome`]), and which states an operator may
//! move a claim from ([`operator_from_states`]).

use super::dialect::Arg;
use super::{ClaimOutcome, Settlement};
use crate::domain::claim::{Claim, ClaimState, Handoff, NewClaim};
use std::time::Duration;

/// Milliseconds of a duration, saturating.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A claim's identity, as the statements that look one up bind it.
pub(crate) fn key_args<'a>(
    consumer: &'a str,
    tenant: &'a str,
    message_id: &'a str,
) -> [Arg<'a>; 3] {
    [
        Arg::Text(consumer),
        Arg::Text(tenant),
        Arg::Text(message_id),
    ]
}

/// How many parameters `insert_claim` binds ([`insert_args`]).
pub(crate) const INSERT_PARAMS: usize = 16;

/// The arguments of the `insert_claim` statement.
pub(crate) fn insert_args(new: &NewClaim) -> [Arg<'_>; INSERT_PARAMS] {
    [
        Arg::Text(&new.consumer),
        Arg::Text(&new.tenant),
        Arg::Text(&new.message_id),
        Arg::Text(&new.idem_key),
        Arg::Text(&new.fingerprint),
        Arg::SealedBytes(&new.payload),
        Arg::Text(&new.content_type),
        Arg::OptText(new.lease_owner()),
        Arg::I64(ms(new.lease)),
        Arg::Text(&new.claim_token),
        Arg::Bool(new.not_called()),
        Arg::OptText(new.order_key.as_deref()),
        Arg::OptTime(new.not_before),
        Arg::I32(new.first_attempt()),
        Arg::OptText(new.trace_parent.as_deref()),
        Arg::I32(i32::from(new.priority)),
    ]
}

/// The arguments of the `count_repeat` statement.
pub(crate) fn repeat_args(new: &NewClaim) -> [Arg<'_>; 5] {
    [
        Arg::Text(&new.consumer),
        Arg::Text(&new.tenant),
        Arg::Text(&new.message_id),
        Arg::Text(&new.fingerprint),
        Arg::Text(&new.claim_token),
    ]
}

/// How many parameters `settle` binds ([`settle_args`]).
pub(crate) const SETTLE_PARAMS: usize = 12;

/// The arguments of the fenced `settle` statement (I2: the attempt held; the worker's own
/// attempt needs no version).
pub(crate) fn settle_args(id: i64, attempt: i32, s: &Settlement) -> [Arg<'_>; SETTLE_PARAMS] {
    settle_from_args(id, attempt, None, ClaimState::Started, s)
}

/// [`settle_args`] fenced on another state than `started` (a poll or a provider event), and
/// on the version read when one is given.
pub(crate) fn settle_from_args(
    id: i64,
    attempt: i32,
    version: Option<i64>,
    from: ClaimState,
    s: &Settlement,
) -> [Arg<'_>; SETTLE_PARAMS] {
    [
        Arg::I64(id),
        Arg::I32(attempt),
        Arg::OptText(s.state.map(ClaimState::as_str)),
        Arg::OptI32(s.provider_status),
        Arg::SealedText(s.provider_response.as_deref()),
        Arg::SealedText(s.error.as_deref()),
        Arg::Bool(s.reconciled),
        Arg::OptText(s.handoff.map(Handoff::as_str)),
        Arg::OptI64(s.lease_for.map(ms)),
        Arg::OptText(s.provider_id.as_deref()),
        Arg::Text(from.as_str()),
        Arg::OptI64(version),
    ]
}

/// How many parameters `restore_claim` binds ([`restore_args`]).
pub(crate) const RESTORE_PARAMS: usize = 22;

/// The arguments of the `restore_claim` statement: `claim` as its worker held it, with what
/// the settlement `s` it could not write says (its answer, reason and provider id over the
/// claim's), in `state`. A `started` claim is held by `owner` with its lease ending now, so
/// the next sweep takes it over; a `pending` one is polled after `s.lease_for`.
pub(crate) fn restore_args<'a>(
    claim: &'a Claim,
    s: &'a Settlement,
    state: ClaimState,
    owner: &'a str,
) -> [Arg<'a>; RESTORE_PARAMS] {
    let last_error = match state {
        ClaimState::Completed => None,
        _ => s.error.as_deref().or(claim.last_error.as_deref()),
    };
    let lease_ms = match state {
        ClaimState::Started => Some(0),
        ClaimState::Pending => Some(s.lease_for.map_or(0, ms)),
        _ => None,
    };
    let started = state == ClaimState::Started;
    [
        Arg::Text(&claim.consumer),
        Arg::Text(&claim.tenant),
        Arg::Text(&claim.message_id),
        Arg::Text(&claim.idem_key),
        Arg::Text(&claim.fingerprint),
        Arg::SealedBytes(&claim.payload),
        Arg::Text(&claim.content_type),
        Arg::Text(state.as_str()),
        Arg::I32(claim.attempt),
        Arg::OptI32(s.provider_status.or(claim.provider_status)),
        Arg::SealedText(
            s.provider_response
                .as_deref()
                .or(claim.provider_response.as_deref()),
        ),
        Arg::SealedText(last_error),
        Arg::Bool(s.reconciled || claim.reconciled),
        Arg::OptText(s.provider_id.as_deref().or(claim.provider_id.as_deref())),
        Arg::OptI64(lease_ms),
        Arg::Time(claim.received_utc),
        Arg::I32(claim.resent_count),
        Arg::OptText(claim.order_key.as_deref()),
        Arg::OptText(claim.trace_parent.as_deref()),
        Arg::I32(claim.waits + i32::from(s.handoff.is_some())),
        Arg::OptText(s.handoff.filter(|_| started).map(Handoff::as_str)),
        Arg::OptText(started.then_some(owner)),
    ]
}

/// A new claim as its caller gets it: with its payload, ready to perform.
pub(crate) fn created(new: &NewClaim, mut claim: Claim) -> ClaimOutcome {
    claim.payload = new.payload.clone();
    ClaimOutcome::Created(claim)
}

/// What a claim whose key was already taken is to `new`: its own row (a commit whose reply
/// was lost), a duplicate, or a mismatch. The repeat was counted by `count_repeat`.
pub(crate) fn repeat_outcome(new: &NewClaim, claim: Claim) -> ClaimOutcome {
    if new.inserted(&claim) {
        // This call's own row: its commit's reply was lost (or its batch failed as a whole
        // after committing). It is new, not a duplicate.
        created(new, claim)
    } else if claim.fingerprint == new.fingerprint
        || super::sealing::fingerprint_matches(&claim.fingerprint, &new.payload)
    {
        ClaimOutcome::Duplicate(claim)
    } else {
        ClaimOutcome::Mismatch(claim)
    }
}

/// The states an operator may move a claim from to reach `to` (at most two, repeated to fill
/// both parameters): the rule is the claim model's, narrowed to `expected` when the operator
/// acts on what they saw (a claim moved since by someone else is then left alone).
pub(crate) fn operator_from_states(
    to: ClaimState,
    expected: Option<ClaimState>,
) -> Option<[&'static str; 2]> {
    // Parking is the provider's or the sweeper's move (failed -> needs_attention when the
    // provider contradicts a failure), never an operator's.
    if to == ClaimState::NeedsAttention {
        return None;
    }
    let from: Vec<&'static str> = [ClaimState::NeedsAttention, ClaimState::Failed]
        .into_iter()
        .filter(|s| s.can_move_to(to) && expected.is_none_or(|e| e == *s))
        .map(ClaimState::as_str)
        .collect();
    match from.as_slice() {
        [] => None,
        [one] => Some([one, one]),
        [a, b, ..] => Some([a, b]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_move_claims_only_from_the_states_the_model_allows() {
        assert_eq!(
            operator_from_states(ClaimState::Completed, None),
            Some(["needs_attention", "failed"])
        );
        // failed -> failed is no move.
        assert_eq!(
            operator_from_states(ClaimState::Failed, None),
            Some(["needs_attention", "needs_attention"])
        );
        assert_eq!(
            operator_from_states(ClaimState::Started, None),
            Some(["needs_attention", "failed"])
        );
        assert_eq!(operator_from_states(ClaimState::NeedsAttention, None), None);
    }

    #[test]
    fn an_expected_state_narrows_the_move_to_it() {
        let parked = Some(ClaimState::NeedsAttention);
        assert_eq!(
            operator_from_states(ClaimState::Completed, parked),
            Some(["needs_attention", "needs_attention"])
        );
        assert_eq!(
            operator_from_states(ClaimState::Started, Some(ClaimState::Failed)),
            Some(["failed", "failed"])
        );
        // failed -> failed is no move, whatever was seen; nothing moves from started.
        assert_eq!(
            operator_from_states(ClaimState::Failed, Some(ClaimState::Failed)),
            None
        );
        assert_eq!(
            operator_from_states(ClaimState::Completed, Some(ClaimState::Started)),
            None
        );
    }
}
