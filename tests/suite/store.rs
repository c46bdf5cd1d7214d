//! The store contract on both drivers: fencing (I2), takeover exclusivity, operator
//! resolutions, and retention that never touches open claims (I7). By role: `batches` (group
//! commit, a lost reply), `fences` (versions: what a reader saw, answers that lost),
//! `retention`, `unread_pending` (pending claims of a consumer that no longer reads outcomes).

#[path = "store/archive.rs"]
mod archive;
#[path = "store/batches.rs"]
mod batches;
#[path = "store/fences.rs"]
mod fences;
#[path = "store/retention.rs"]
mod retention;
#[path = "store/unread_pending.rs"]
mod unread_pending;

use crate::common;
use claimd::domain::claim::{ClaimState, NewClaim, fingerprint};
use claimd::store::{ClaimOutcome, ClaimStore, NewEvent, Seen, Settlement, Store};
use common::*;
use std::collections::HashSet;
use std::time::Duration;

fn new_claim(id: &str, lease: Duration) -> NewClaim {
    NewClaim {
        consumer: "payments".into(),
        tenant: String::new(),
        message_id: id.into(),
        idem_key: id.into(),
        fingerprint: fingerprint(id.as_bytes()),
        payload: id.as_bytes().to_vec().into(),
        content_type: "text/plain".into(),
        worker: "w1".into(),
        lease,
        claim_token: claimd::domain::claim::new_claim_token(),
        mark_not_called: false,
        order_key: None,
        not_before: None,
        trace_parent: None,
        priority: 0,
    }
}

fn far() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() + chrono::Duration::hours(1)
}

fn ev() -> NewEvent<'static> {
    NewEvent {
        actor: "test",
        action: "perform",
        outcome: "applied",
        provider_status: Some(200),
        detail: None,
    }
}

async fn open(store: &TestStore) -> Store {
    let s = claimd::store::open(&store.url(), 8).await.unwrap();
    s.migrate().await.unwrap();
    s
}

async fn fencing(store: TestStore) {
    let s = open(&store).await;
    let ClaimOutcome::Created(c) = s.claim(&new_claim("f1", Duration::ZERO)).await.unwrap() else {
        panic!("new claim")
    };
    assert_eq!(c.attempt, 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // A sweeper takes it over: attempt 2.
    let taken = s
        .take_stale(
            "payments",
            10,
            "sweeper",
            Duration::from_secs(60),
            far(),
            true,
        )
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].claim.attempt, 2);
    assert_eq!(&taken[0].claim.payload[..], b"f1");
    // The takeover says whose lease ran out (the worker that claimed it), and the sweeper's
    // lease is now the one on the row.
    assert_eq!(taken[0].held_by.as_deref(), Some("w1"));
    assert_eq!(taken[0].claim.lease_owner.as_deref(), Some("sweeper"));
    // The original worker wakes up late and tries to settle with attempt 1: nothing changes.
    let late = Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        ..Default::default()
    };
    assert!(
        !s.settle(c.id, 1, &late, &ev()).await.unwrap(),
        "a fenced-out settle must change nothing"
    );
    let now = s.get("payments", "", "f1").await.unwrap().unwrap();
    assert_eq!(now.state, ClaimState::Started);
    assert_eq!(now.attempt, 2);
    assert!(now.processed_utc.is_none());
    assert!(
        s.events(c.id).await.unwrap().is_empty(),
        "no history line for a fenced-out settle"
    );
    // The holder of attempt 2 settles.
    assert!(s.settle(c.id, 2, &late, &ev()).await.unwrap());
    let done = s.get("payments", "", "f1").await.unwrap().unwrap();
    assert_eq!(done.state, ClaimState::Completed);
    assert!(done.processed_utc.is_some());
    // A settled claim cannot be settled again.
    assert!(!s.settle(c.id, 2, &late, &ev()).await.unwrap());
}

#[tokio::test]
async fn a_late_worker_changes_nothing_sqlite() {
    fencing(TestStore::sqlite()).await;
}

#[tokio::test]
async fn a_late_worker_changes_nothing_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    fencing(store).await;
}

async fn duplicates_and_mismatches(store: TestStore) {
    let s = open(&store).await;
    assert!(matches!(
        s.claim(&new_claim("d1", Duration::from_secs(60)))
            .await
            .unwrap(),
        ClaimOutcome::Created(_)
    ));
    assert!(matches!(
        s.claim(&new_claim("d1", Duration::from_secs(60)))
            .await
            .unwrap(),
        ClaimOutcome::Duplicate(_)
    ));
    let mut changed = new_claim("d1", Duration::from_secs(60));
    changed.fingerprint = fingerprint(b"other");
    changed.payload = b"other".to_vec().into();
    assert!(matches!(
        s.claim(&changed).await.unwrap(),
        ClaimOutcome::Mismatch(_)
    ));
    let mut other_tenant = changed.clone();
    other_tenant.tenant = "acme".into();
    assert!(matches!(
        s.claim(&other_tenant).await.unwrap(),
        ClaimOutcome::Created(_)
    ));
    let c = s.get("payments", "", "d1").await.unwrap().unwrap();
    assert_eq!((c.duplicate_count, c.mismatch_count), (1, 1));
    let counts = s.counts(None).await.unwrap();
    assert_eq!(counts.len(), 1);
    assert_eq!(counts[0].received, 4);
    assert_eq!(counts[0].duplicates, 1);
    assert_eq!(counts[0].payload_mismatches, 1);
    assert_eq!(counts[0].started, 2);
}

#[tokio::test]
async fn duplicates_and_mismatches_are_counted_sqlite() {
    duplicates_and_mismatches(TestStore::sqlite()).await;
}

#[tokio::test]
async fn duplicates_and_mismatches_are_counted_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    duplicates_and_mismatches(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweepers_never_take_the_same_claim_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let a = open(&store).await;
    let b = claimd::store::open(&store.url(), 8).await.unwrap();
    for i in 0..400 {
        a.claim(&new_claim(&format!("s{i}"), Duration::ZERO))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut seen_a = HashSet::new();
    let mut seen_b = HashSet::new();
    // Many small concurrent passes from two pools (two "processes").
    for _ in 0..20 {
        let (ra, rb) = tokio::join!(
            a.take_stale("payments", 15, "A", Duration::from_secs(60), far(), true),
            b.take_stale("payments", 15, "B", Duration::from_secs(60), far(), true)
        );
        for t in ra.unwrap() {
            assert!(seen_a.insert(t.claim.message_id.clone()));
            assert_eq!(t.claim.attempt, 2);
        }
        for t in rb.unwrap() {
            assert!(seen_b.insert(t.claim.message_id.clone()));
            assert_eq!(t.claim.attempt, 2);
        }
    }
    assert!(
        seen_a.is_disjoint(&seen_b),
        "a claim was taken by both sweepers"
    );
    assert_eq!(seen_a.len() + seen_b.len(), 400);
    assert!(
        !seen_a.is_empty() && !seen_b.is_empty(),
        "both sweepers should get work"
    );
}

async fn operator_actions(store: TestStore) {
    let s = open(&store).await;
    let ClaimOutcome::Created(c) = s
        .claim(&new_claim("o1", Duration::from_secs(60)))
        .await
        .unwrap()
    else {
        panic!()
    };
    // Started claims cannot be resolved or redriven by hand.
    let r = s
        .resolve("payments", "", "o1", ClaimState::Completed, "op", "n", None)
        .await
        .unwrap();
    assert!(matches!(r, Some(Err(ClaimState::Started))));
    assert!(matches!(
        s.redrive("payments", "", "o1", "op", None).await.unwrap(),
        Some(Err(ClaimState::Started))
    ));
    assert!(
        s.resolve(
            "payments",
            "",
            "nope",
            ClaimState::Completed,
            "op",
            "n",
            None
        )
        .await
        .unwrap()
        .is_none()
    );
    let park = Settlement {
        state: Some(ClaimState::NeedsAttention),
        error: Some("outcome unknown".into()),
        ..Default::default()
    };
    assert!(s.settle(c.id, 1, &park, &ev()).await.unwrap());
    // Redrive: started again, new attempt, expired lease, operator hand-off.
    let Some(Ok(r)) = s.redrive("payments", "", "o1", "op", None).await.unwrap() else {
        panic!()
    };
    assert_eq!(r.state, ClaimState::Started);
    assert_eq!(r.attempt, 2);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let taken = s
        .take_stale("payments", 10, "sw", Duration::from_secs(60), far(), true)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(
        taken[0].handoff,
        Some(claimd::store::Handoff::OperatorRedrive)
    );
    // The redrive's attempt is the one the sweeper sends: a redrive counts once.
    assert_eq!(taken[0].claim.attempt, 2);
    assert!(s.settle(c.id, 2, &park, &ev()).await.unwrap());
    // An operator who saw it failed (someone else's view, now stale) moves nothing; nor does
    // one who saw it parked at its first attempt (it was redriven and parked again since).
    let stale = Some(Seen {
        state: ClaimState::Failed,
        attempt: None,
        version: None,
    });
    assert!(matches!(
        s.redrive("payments", "", "o1", "op", stale).await.unwrap(),
        Some(Err(ClaimState::NeedsAttention))
    ));
    assert!(matches!(
        s.resolve(
            "payments",
            "",
            "o1",
            ClaimState::Completed,
            "op",
            "n",
            stale
        )
        .await
        .unwrap(),
        Some(Err(ClaimState::NeedsAttention))
    ));
    let first_parking = Some(Seen {
        state: ClaimState::NeedsAttention,
        attempt: Some(1),
        version: None,
    });
    assert!(matches!(
        s.redrive("payments", "", "o1", "op", first_parking)
            .await
            .unwrap(),
        Some(Err(ClaimState::NeedsAttention))
    ));
    let Some(Ok(done)) = s
        .resolve(
            "payments",
            "",
            "o1",
            ClaimState::Completed,
            "operator:alice",
            "paid per provider dashboard",
            Some(Seen {
                state: ClaimState::NeedsAttention,
                attempt: Some(2),
                version: None,
            }),
        )
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(done.state, ClaimState::Completed);
    assert!(done.processed_utc.is_some());
    let history = s.events(c.id).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(last.action, "resolve");
    assert_eq!(last.actor, "operator:alice");
    assert_eq!(last.detail.as_deref(), Some("paid per provider dashboard"));
    // Completed is final.
    let again = s
        .resolve("payments", "", "o1", ClaimState::Failed, "op", "n", None)
        .await
        .unwrap();
    assert!(matches!(again, Some(Err(ClaimState::Completed))));
}

#[tokio::test]
async fn operator_actions_are_checked_and_recorded_sqlite() {
    operator_actions(TestStore::sqlite()).await;
}

#[tokio::test]
async fn operator_actions_are_checked_and_recorded_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    operator_actions(store).await;
}

/// A claim an operator resolved hours later must not move p50/p95 (they measure the provider
/// and claimd); a redrive makes the claim claimd's again.
async fn operator_resolves_and_percentiles(store: TestStore) {
    let s = open(&store).await;
    let done = Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        ..Default::default()
    };
    let park = Settlement {
        state: Some(ClaimState::NeedsAttention),
        error: Some("outcome unknown".into()),
        ..Default::default()
    };
    let mut ids = Vec::new();
    for id in ["p1", "p2", "p3", "p4"] {
        let ClaimOutcome::Created(c) = s
            .claim(&new_claim(id, Duration::from_secs(60)))
            .await
            .unwrap()
        else {
            panic!("new claim {id}")
        };
        ids.push(c.id);
    }
    assert!(s.settle(ids[0], 1, &done, &ev()).await.unwrap());
    assert!(s.settle(ids[1], 1, &done, &ev()).await.unwrap());
    assert!(s.settle(ids[2], 1, &park, &ev()).await.unwrap());
    assert!(s.settle(ids[3], 1, &park, &ev()).await.unwrap());
    // The person decides 1.5 s later: p3 completed by hand, p4 failed by hand then redriven.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let resolved = s
        .resolve(
            "payments",
            "",
            "p3",
            ClaimState::Completed,
            "op",
            "paid",
            None,
        )
        .await
        .unwrap();
    assert!(matches!(resolved, Some(Ok(_))));
    let counts = |s: Store| async move {
        let all = s.counts(None).await.unwrap();
        all.into_iter().find(|c| c.consumer == "payments").unwrap()
    };
    let c = counts(s.clone()).await;
    assert_eq!(
        c.completed, 3,
        "the resolved claim is still counted as completed"
    );
    let p95 = c.p95_complete_s.expect("p95 of two timed claims");
    assert!(
        p95 < 1.0,
        "p95 {p95} s must leave out the claim resolved by hand after 1.5 s"
    );
    assert!(
        s.resolve("payments", "", "p4", ClaimState::Failed, "op", "no", None)
            .await
            .unwrap()
            .is_some_and(|r| r.is_ok())
    );
    let Some(Ok(again)) = s.redrive("payments", "", "p4", "op", None).await.unwrap() else {
        panic!("redrive of a failed claim")
    };
    assert!(s.settle(ids[3], again.attempt, &done, &ev()).await.unwrap());
    let c = counts(s.clone()).await;
    assert_eq!(c.completed, 4);
    let p95 = c.p95_complete_s.expect("p95 of three timed claims");
    assert!(
        p95 >= 1.0,
        "p95 {p95} s: a redriven claim that completed is claimd's outcome and counts"
    );
}

#[tokio::test]
async fn operator_resolves_stay_out_of_the_percentiles_sqlite() {
    operator_resolves_and_percentiles(TestStore::sqlite()).await;
}

#[tokio::test]
async fn operator_resolves_stay_out_of_the_percentiles_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    operator_resolves_and_percentiles(store).await;
}

#[tokio::test]
async fn sql_in_ids_is_stored_verbatim() {
    let store = TestStore::sqlite();
    let s = open(&store).await;
    let evil = "x'); DROP TABLE claims; --";
    let mut n = new_claim(evil, Duration::from_secs(60));
    n.tenant = "t' OR '1'='1".into();
    assert!(matches!(
        s.claim(&n).await.unwrap(),
        ClaimOutcome::Created(_)
    ));
    let c = s
        .get("payments", "t' OR '1'='1", evil)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.message_id, evil);
    assert!(
        s.get("payments", "", evil).await.unwrap().is_none(),
        "tenants do not see each other"
    );
    let _: &dyn ClaimStore = s.as_ref();
}

/// Regression: two workers starting together on a fresh database both migrate; an index built
/// CONCURRENTLY deadlocked against the other's migration lock and one worker exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_migrating_at_once_both_start_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    for _ in 0..3 {
        let a = claimd::store::open(&store.url(), 2).await.unwrap();
        let b = claimd::store::open(&store.url(), 2).await.unwrap();
        let (ra, rb) = tokio::join!(a.migrate(), b.migrate());
        ra.unwrap();
        rb.unwrap();
    }
}
