//! Row mapping, once for every dialect: a [`Claim`] and a [`TakenClaim`] from the columns the
//! statements select (`claim_cols!`, plus `payload`, `age_ms` and the hand-off columns).

use super::dialect::SqlRow;
use super::sealing;
use super::{StoreError, StoreResult, TakenClaim};
use crate::domain::claim::{Claim, ClaimState, Handoff, SCHEDULE_OWNER};
use std::str::FromStr;
use std::time::Duration;

/// A claim from a row selecting the claim columns (and, optionally, `payload`).
pub(crate) fn claim_from_row(row: &impl SqlRow) -> StoreResult<Claim> {
    let state = row.text("state")?;
    let id = row.i64("id")?;
    let what = || format!("claim {id}");
    Ok(Claim {
        id,
        consumer: row.text("consumer")?,
        tenant: row.text("tenant")?,
        message_id: row.text("message_id")?,
        idem_key: row.text("idem_key")?,
        fingerprint: row.text("fingerprint")?,
        payload: sealing::open_bytes(row.bytes_or_empty("payload"), &what).into(),
        content_type: row.text("content_type")?,
        state: ClaimState::from_str(&state).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        attempt: row.i32("attempt")?,
        lease_owner: row.opt_text("lease_owner")?,
        lease_until: row.opt_time("lease_until")?,
        received_utc: row.time("received_utc")?,
        started_utc: row.time("started_utc")?,
        processed_utc: row.opt_time("processed_utc")?,
        last_error: sealing::open_text(row.opt_text("last_error")?, &what),
        provider_status: row.opt_i32("provider_status")?,
        provider_response: sealing::open_text(row.opt_text("provider_response")?, &what),
        duplicate_count: row.i64("duplicate_count")?,
        mismatch_count: row.i64("mismatch_count")?,
        reconciled: row.boolean("reconciled")?,
        resent_count: row.i32("resent_count")?,
        waits: row.i32("waits")?,
        claim_token: row.opt_text("claim_token")?,
        provider_id: row.opt_text("provider_id")?,
        pending_utc: row.opt_time("pending_utc")?,
        version: row.i64("version")?,
        order_key: row.opt_text("order_key")?,
        not_before: row.opt_time("not_before")?,
        trace_parent: row.opt_text("trace_parent")?,
        erased_utc: row.opt_time("erased_utc")?,
    })
}

/// A waiting claim a pickup took ([`taken_from_row`]), with the priority its take returns.
pub(crate) fn taken_with_priority(row: &impl SqlRow) -> StoreResult<TakenClaim> {
    let mut taken = taken_from_row(row, 0)?;
    let priority = row.opt_i64("priority")?.unwrap_or(0);
    taken.priority = i16::try_from(priority).unwrap_or(crate::domain::priority::DEFAULT);
    Ok(taken)
}

/// A taken (or peeked) claim: the claim, how its previous attempt let go, and its age.
pub(crate) fn taken_from_row(
    row: &impl SqlRow,
    shown_attempt_offset: i32,
) -> StoreResult<TakenClaim> {
    let mut claim = claim_from_row(row)?;
    claim.attempt += shown_attempt_offset;
    let kind = row.opt_text("handoff")?;
    let at = row.opt_i32("handoff_attempt")?;
    let held_by = row.opt_text("held_by")?;
    // A take of a scheduled claim moved its "not called" marker to the attempt it made
    // (`take_stale`): the marker is this attempt's, and still says nothing was sent.
    let from_schedule = held_by.as_deref() == Some(SCHEDULE_OWNER);
    let handoff = kind
        .filter(|k| {
            at.is_some_and(|a| {
                a == claim.attempt - 1 || (from_schedule && k == "not_called" && a == claim.attempt)
            })
        })
        .and_then(|k| Handoff::parse(&k));
    let age_ms = row.opt_i64("age_ms")?.unwrap_or(0).max(0);
    Ok(TakenClaim {
        claim,
        handoff,
        age: Duration::from_millis(age_ms as u64),
        held_by,
        priority: crate::domain::priority::DEFAULT,
        went_ahead_of: None,
    })
}
