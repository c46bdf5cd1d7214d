//! Polling `pending` claims: a claim the provider accepted without finishing (a SEPA debit at
//! the bank) is settled by the provider's event, or, when none comes, by asking its status
//! endpoint again. Each sweeper pass takes the pending claims whose next poll is due (their
//! lease, leased to this instance meanwhile), asks, and settles by the value in the answer
//! ([`crate::engine::settle::by_reading`]), or leaves them pending until a later poll
//! ([`policy::on_pending`]: less often as they age, parked past `pending_for`). Nothing is
//! ever sent again: the effect exists at the provider. A poll is a request to the provider
//! like any other: it passes the destination's breaker and pace.
//!
//! A consumer whose `[effect.outcome]` section was removed while claims were pending can no
//! longer read the provider's answers by value, so nothing can settle those claims: they
//! wait out `pending_for` (its default) and are then parked for a person.

use crate::config::ValueOutcomes;
use crate::domain::claim::{Claim, ClaimState};
use crate::engine::claimer::lookup::LOOKUP_WAIT;
use crate::engine::claimer::{Claimer, Consumer};
use crate::engine::policy::{self, PendingStep};
use crate::engine::settle::{self, by_reading};
use crate::engine::sweeper::SweepItem;
use crate::provider::effect::Lookup;
use crate::provider::effect::by_value::{self, Verdict};
use crate::store::{Settlement, StoreError, TakenClaim};
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, info, warn};

/// Polls up to `batch` of `consumer`'s pending claims whose next poll is due, at most its
/// `concurrency` at a time. A consumer whose destination is open (its provider failing) is
/// left alone. One whose effect no longer reads outcomes by value (its claims became pending
/// under an earlier configuration) is not asked anything: its claims are parked past
/// `pending_for`.
pub(crate) async fn poll_consumer(
    claimer: &Arc<Claimer>,
    consumer: &Arc<Consumer>,
    batch: u32,
) -> Result<Vec<SweepItem>, StoreError> {
    if consumer.destination.open_until().is_some() {
        return Ok(Vec::new());
    }
    let cfg = &consumer.config;
    // Long enough for one lookup, with its wait for the destination: another instance's
    // sweeper may poll the claim only after that.
    let lease = cfg.effect.timeout() + LOOKUP_WAIT + Duration::from_secs(5);
    let mut items = Vec::new();
    let mut remaining = batch;
    while remaining > 0 {
        let chunk = remaining.min(cfg.concurrency);
        let taken = claimer
            .store()
            .take_pending(&cfg.name, chunk, claimer.instance(), lease)
            .await?;
        if taken.is_empty() {
            break;
        }
        remaining = remaining.saturating_sub(taken.len() as u32);
        let mut tasks = tokio::task::JoinSet::new();
        for t in taken {
            let claimer = claimer.clone();
            let consumer = consumer.clone();
            let span = tracing::info_span!(
                "poll",
                consumer = %t.claim.consumer,
                tenant = %t.claim.tenant,
                message_id = %t.claim.message_id,
                attempt = t.claim.attempt
            );
            tasks.spawn(async move { poll_one(&claimer, &consumer, t).await }.instrument(span));
        }
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(item) => items.push(item),
                Err(e) => warn!(error = %e, "pending poll task failed"),
            }
        }
    }
    if !items.is_empty() {
        info!(consumer = %cfg.name, polled = items.len(), "pending claims polled");
    }
    Ok(items)
}

/// One due pending claim: parked past `pending_for`, else asked (or, without a status
/// endpoint, left to its events) and settled or left pending.
async fn poll_one(claimer: &Claimer, consumer: &Consumer, t: TakenClaim) -> SweepItem {
    let claim = &t.claim;
    let Some(map) = consumer.effect.outcomes() else {
        return unread(claimer, claim, t.age).await;
    };
    let step = policy::on_pending(
        t.age,
        map.pending_poll.0,
        map.pending_for.0,
        consumer.effect.can_reconcile(),
    );
    let (s, name, result) = match step {
        PendingStep::Park(reason) => (
            settle::park(reason, None),
            "expired",
            "parked: still pending".to_string(),
        ),
        PendingStep::Wait(left) => (
            still_pending(left, None),
            "waiting",
            "no status endpoint: waits for the provider's event".to_string(),
        ),
        PendingStep::Poll(next) => match claimer.lookup(consumer, claim).await {
            Some(Lookup::Found {
                status, response, ..
            }) => {
                let reading = by_value::read_body(map, &response, consumer.effect.lookup_object());
                if reading.verdict == Some(Verdict::Pending) {
                    let mut s = still_pending(next, Some(status));
                    s.provider_id = reading.provider_id.clone();
                    (s, "pending", "still pending".to_string())
                } else {
                    let (s, name) = by_reading(map, &reading, status, response, true, "found");
                    let result = format!("settled: {}", s.state.map_or("?", ClaimState::as_str));
                    (s, name, result)
                }
            }
            // The lookup wrote its own history line (a "not found" of an object the provider
            // accepted is its search lagging; no answer is no decision).
            _ => (
                still_pending(next, None),
                "undecided",
                "no decision from the status endpoint; asks again later".to_string(),
            ),
        },
    };
    record(claimer, claim, s, name, result).await
}

/// A pending claim of a consumer that no longer reads outcomes by value: nothing can read
/// the provider's answers, so it is parked once `pending_for` (its default) has passed, and
/// until then left pending, next looked at when that time is up.
async fn unread(claimer: &Claimer, claim: &Claim, age: Duration) -> SweepItem {
    let pending_for = ValueOutcomes::default().pending_for.0;
    let (s, name, result) = match age.checked_sub(pending_for) {
        Some(_) => {
            let reason = format!(
                "still pending after {} (pending_for = {}); the consumer no longer reads outcomes by value, so nothing can settle it: check the provider, then resolve",
                crate::domain::duration::Dur(Duration::from_secs(age.as_secs())),
                crate::domain::duration::Dur(pending_for)
            );
            (
                settle::park(reason, None),
                "expired",
                "parked: still pending, outcomes no longer read".to_string(),
            )
        }
        None => (
            still_pending(pending_for - age, None),
            "unread",
            "outcomes no longer read: parked once pending_for has passed".to_string(),
        ),
    };
    record(claimer, claim, s, name, result).await
}

/// Writes what a poll decided, fenced on the state, attempt and version the claim was taken
/// at; an answer that lost the fence goes to the claim's history.
async fn record(
    claimer: &Claimer,
    claim: &Claim,
    s: Settlement,
    name: &str,
    result: String,
) -> SweepItem {
    let settler = claimer.settler();
    let shown = s.clone();
    match settler
        .settle_from(claim, ClaimState::Pending, s, "poll", name)
        .await
    {
        Ok(true) => item(claim, result),
        Ok(false) => {
            let lost = crate::store::NewEvent {
                actor: claimer.instance(),
                action: "poll",
                outcome: name,
                provider_status: shown.provider_status,
                detail: shown.error.as_deref(),
            };
            settler.fenced_out(claim, &shown, "poll", &lost).await;
            item(
                claim,
                "settled meanwhile (an event, an operator or another poller)".into(),
            )
        }
        Err(e) => {
            warn!(error = %e, "could not record the poll; the claim is polled again after its lease");
            item(claim, format!("not recorded ({e})"))
        }
    }
}

/// Left `pending`, next polled `next` from now.
fn still_pending(next: Duration, status: Option<i32>) -> Settlement {
    Settlement {
        state: Some(ClaimState::Pending),
        provider_status: status,
        lease_for: Some(next),
        ..Default::default()
    }
}

fn item(claim: &Claim, result: String) -> SweepItem {
    SweepItem {
        consumer: claim.consumer.clone(),
        tenant: claim.tenant.clone(),
        message_id: claim.message_id.clone(),
        attempt: claim.attempt,
        action: "poll".into(),
        result,
    }
}
