//! Fences on what a reader saw, on both drivers: every change of a claim bumps its version, so
//! a poll, a provider event or an operator's form prepared against `pending@N` or
//! `needs_attention@N` cannot land after the claim went away and came back to the same state
//! at the same attempt (ABA); a worker's answer that lost its fence is kept in the claim's
//! history; two claims of one key in one batch get one row between them.

use super::*;
use claimd::engine::claimer::AttemptEnd;
use claimd::engine::consumer::Slot;
use claimd::engine::metrics::Metrics;
use claimd::engine::settle::Settler;
use claimd::ops::operator_action::{Action, Target, act};
use std::sync::Arc;

fn settler(s: &Store, instance: &str) -> Settler {
    Settler::new(s.clone(), instance.into(), Arc::new(Metrics::new()))
}

fn moved(to: ClaimState, why: &str) -> Settlement {
    Settlement {
        state: Some(to),
        error: Some(why.into()),
        ..Default::default()
    }
}

async fn fresh(s: &Store, id: &str) -> claimd::domain::claim::Claim {
    s.get("payments", "", id).await.unwrap().unwrap()
}

/// A poller took a pending claim (pending at attempt 1) and asked the provider; meanwhile the
/// provider's events moved the claim pending -> needs_attention -> pending. The poller's
/// answer ("failed"), prepared against the claim it took, must not land on the claim that
/// came back: same state, same attempt, but not the claim the poller read.
async fn a_stale_poll_lands_nowhere(store: TestStore) {
    let s = open(&store).await;
    let ClaimOutcome::Created(c) = s
        .claim(&new_claim("aba1", Duration::from_secs(60)))
        .await
        .unwrap()
    else {
        panic!("new claim")
    };
    let pending = Settlement {
        state: Some(ClaimState::Pending),
        provider_status: Some(200),
        lease_for: Some(Duration::ZERO),
        ..Default::default()
    };
    assert!(s.settle(c.id, c.attempt, &pending, &ev()).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let taken = s
        .take_pending("payments", 10, "poller", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    let polled = taken[0].claim.clone();
    assert_eq!(polled.state, ClaimState::Pending);

    // The provider's events: it needs the customer, then it is processing again.
    let events = settler(&s, "event");
    let read = fresh(&s, "aba1").await;
    assert!(
        events
            .settle_from(
                &read,
                ClaimState::Pending,
                moved(ClaimState::NeedsAttention, "requires_action"),
                "event",
                "requires_action"
            )
            .await
            .unwrap()
    );
    let read = fresh(&s, "aba1").await;
    assert!(
        events
            .settle_from(
                &read,
                ClaimState::NeedsAttention,
                Settlement {
                    state: Some(ClaimState::Pending),
                    ..Default::default()
                },
                "event",
                "processing"
            )
            .await
            .unwrap()
    );
    let back = fresh(&s, "aba1").await;
    assert_eq!(
        (back.state, back.attempt),
        (ClaimState::Pending, polled.attempt)
    );

    // The poller's late answer, against the claim it took.
    let late = settler(&s, "poller")
        .settle_from(
            &polled,
            ClaimState::Pending,
            moved(ClaimState::Failed, "requires_payment_method"),
            "poll",
            "failed",
        )
        .await
        .unwrap();
    assert!(
        !late,
        "a poll prepared before the claim moved away and back must not land"
    );
    let now = fresh(&s, "aba1").await;
    assert_eq!(now.state, ClaimState::Pending, "{now:?}");
    assert!(now.processed_utc.is_none());
}

#[tokio::test]
async fn a_stale_poll_lands_nowhere_sqlite() {
    a_stale_poll_lands_nowhere(TestStore::sqlite()).await;
}

#[tokio::test]
async fn a_stale_poll_lands_nowhere_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    a_stale_poll_lands_nowhere(store).await;
}

/// An operator read a parked claim (needs_attention at attempt 1) and chose "resolve as
/// completed"; meanwhile the provider's events moved it needs_attention -> pending ->
/// needs_attention. The form is refused with the version it showed and the one now, and the
/// claim stays as the events left it.
async fn a_stale_form_is_refused(store: TestStore) {
    let s = open(&store).await;
    let ClaimOutcome::Created(c) = s
        .claim(&new_claim("aba2", Duration::from_secs(60)))
        .await
        .unwrap()
    else {
        panic!("new claim")
    };
    assert!(
        s.settle(
            c.id,
            c.attempt,
            &moved(ClaimState::NeedsAttention, "outcome unknown (timeout)"),
            &ev()
        )
        .await
        .unwrap()
    );
    let shown = fresh(&s, "aba2").await;
    let form = Target::of(&shown);

    let events = settler(&s, "event");
    for (from, to) in [
        (ClaimState::NeedsAttention, ClaimState::Pending),
        (ClaimState::Pending, ClaimState::NeedsAttention),
    ] {
        let read = fresh(&s, "aba2").await;
        assert!(
            events
                .settle_from(&read, from, moved(to, "event"), "event", to.as_str())
                .await
                .unwrap()
        );
    }
    let now = fresh(&s, "aba2").await;
    assert_eq!((now.state, now.attempt), (shown.state, shown.attempt));

    let outcome = act(s.as_ref(), Action::Complete, &form, "page:alice", "paid").await;
    assert!(!outcome.done(), "{outcome:?}");
    let said = outcome.describe();
    assert!(
        said.contains("the claim changed since you read it")
            && said.contains("(version ")
            && said.contains(", now ")
            && said.contains("reload"),
        "{said}"
    );
    let after = fresh(&s, "aba2").await;
    assert_eq!(after.state, ClaimState::NeedsAttention);
    assert!(
        s.events(c.id)
            .await
            .unwrap()
            .iter()
            .all(|e| e.actor != "page:alice"),
        "a refused action leaves no line"
    );
    // Read again, the same action goes through.
    let outcome = act(
        s.as_ref(),
        Action::Complete,
        &Target::of(&after),
        "page:alice",
        "paid",
    )
    .await;
    assert!(outcome.done(), "{outcome:?}");
}

#[tokio::test]
async fn a_stale_form_is_refused_sqlite() {
    a_stale_form_is_refused(TestStore::sqlite()).await;
}

#[tokio::test]
async fn a_stale_form_is_refused_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    a_stale_form_is_refused(store).await;
}

/// A provider event settles a claim while its own call is still in flight; the worker's
/// answer (a decline) then loses its fence. It changes nothing, and it is in the claim's
/// history: what the provider said to that attempt, and what the claim had become.
async fn a_fenced_out_answer_is_kept(store: TestStore) {
    let s = open(&store).await;
    let ClaimOutcome::Created(c) = s
        .claim(&new_claim("late1", Duration::from_secs(60)))
        .await
        .unwrap()
    else {
        panic!("new claim")
    };
    assert!(
        settler(&s, "event")
            .settle_from(
                &c,
                ClaimState::Started,
                Settlement {
                    state: Some(ClaimState::Completed),
                    ..Default::default()
                },
                "event",
                "payment_intent.succeeded"
            )
            .await
            .unwrap()
    );
    let declined = Settlement {
        state: Some(ClaimState::Failed),
        provider_status: Some(402),
        provider_response: Some(r#"{"error":{"code":"card_declined"}}"#.into()),
        error: Some("card_declined: Your card was declined.".into()),
        ..Default::default()
    };
    let end = settler(&s, "w1")
        .settle(&mut Slot::none(), &c, None, declined, "perform", "failed")
        .await;
    assert_eq!(end, AttemptEnd::Lost);
    let now = fresh(&s, "late1").await;
    assert_eq!(now.state, ClaimState::Completed);
    let history = s.events(c.id).await.unwrap();
    let line = history
        .iter()
        .find(|e| e.actor == "w1")
        .unwrap_or_else(|| panic!("the worker's answer is in the history: {history:?}"));
    assert_eq!(line.attempt, 1);
    assert_eq!(line.outcome, "fenced_out");
    assert_eq!(line.provider_status, Some(402));
    let detail = line.detail.as_deref().unwrap_or_default();
    assert!(
        detail.starts_with("answer after the claim moved: failed 402: card_declined")
            && detail.contains("; not applied (claim was completed@v"),
        "{detail}"
    );
}

#[tokio::test]
async fn a_fenced_out_answer_is_kept_sqlite() {
    a_fenced_out_answer_is_kept(TestStore::sqlite()).await;
}

#[tokio::test]
async fn a_fenced_out_answer_is_kept_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    a_fenced_out_answer_is_kept(store).await;
}

/// Two deliveries of one key with different claim tokens in one batch: one is the claim, the
/// other a duplicate, and the claim goes to the delivery whose token the row carries.
async fn one_row_for_one_key_in_a_batch(store: TestStore) {
    let s = open(&store).await;
    let lease = Duration::from_secs(60);
    let (first, second) = (new_claim("k1", lease), new_claim("k1", lease));
    assert_ne!(first.claim_token, second.claim_token);
    let out = s
        .claim_many(&[first.clone(), second.clone(), new_claim("k2", lease)])
        .await
        .unwrap();
    let created: Vec<usize> = out
        .iter()
        .take(2)
        .enumerate()
        .filter(|(_, o)| matches!(o, ClaimOutcome::Created(_)))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(created.len(), 1, "{out:?}");
    let row = fresh(&s, "k1").await;
    let mine = [&first, &second][created[0]];
    assert_eq!(row.claim_token.as_deref(), Some(mine.claim_token.as_str()));
    assert_eq!(row.duplicate_count, 1);
    assert!(matches!(out[2], ClaimOutcome::Created(_)));
}

#[tokio::test]
async fn one_row_for_one_key_in_a_batch_sqlite() {
    one_row_for_one_key_in_a_batch(TestStore::sqlite()).await;
}

#[tokio::test]
async fn one_row_for_one_key_in_a_batch_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    one_row_for_one_key_in_a_batch(store).await;
}
