//! The store contract on both drivers: fencing (I2), takeover exclusivity, operator
//! resolutions, and retention that never touches open claims (I7).

mod common;

use claimd::claim::{ClaimState, NewClaim, fingerprint};
use claimd::store::{ClaimOutcome, ClaimStore, NewEvent, Settlement, Store};
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
        claim_token: claimd::claim::new_claim_token(),
        mark_not_called: false,
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
        .take_stale("payments", 10, "sweeper", Duration::from_secs(60), far())
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].claim.attempt, 2);
    assert_eq!(&taken[0].claim.payload[..], b"f1");
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
            a.take_stale("payments", 15, "A", Duration::from_secs(60), far()),
            b.take_stale("payments", 15, "B", Duration::from_secs(60), far())
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
        .resolve("payments", "", "o1", ClaimState::Completed, "op", "n")
        .await
        .unwrap();
    assert!(matches!(r, Some(Err(ClaimState::Started))));
    assert!(matches!(
        s.redrive("payments", "", "o1", "op").await.unwrap(),
        Some(Err(ClaimState::Started))
    ));
    assert!(
        s.resolve("payments", "", "nope", ClaimState::Completed, "op", "n")
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
    let Some(Ok(r)) = s.redrive("payments", "", "o1", "op").await.unwrap() else {
        panic!()
    };
    assert_eq!(r.state, ClaimState::Started);
    assert_eq!(r.attempt, 2);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let taken = s
        .take_stale("payments", 10, "sw", Duration::from_secs(60), far())
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(
        taken[0].handoff,
        Some(claimd::store::Handoff::OperatorRedrive)
    );
    assert!(s.settle(c.id, 3, &park, &ev()).await.unwrap());
    let Some(Ok(done)) = s
        .resolve(
            "payments",
            "",
            "o1",
            ClaimState::Completed,
            "operator:alice",
            "paid per provider dashboard",
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
        .resolve("payments", "", "o1", ClaimState::Failed, "op", "n")
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

async fn age_everything(store: &TestStore, s: &Store) {
    // Make every row look two days old.
    match store {
        TestStore::Pg(_) => {
            let pg = claimd::store::postgres::PgStore::connect(&store.url(), 1)
                .await
                .unwrap();
            sqlx::query("UPDATE claims SET updated_utc = updated_utc - interval '2 days'")
                .execute(pg.pool())
                .await
                .unwrap();
        }
        TestStore::Sqlite(_) => {
            let lite = claimd::store::sqlite::SqliteStore::connect(&store.url(), 1)
                .await
                .unwrap();
            sqlx::query("UPDATE claims SET updated_utc = updated_utc - 172800000")
                .execute(lite.pool())
                .await
                .unwrap();
        }
    }
    let _ = s;
}

async fn retention(store: TestStore) {
    let s = open(&store).await;
    let states = [
        ClaimState::Completed,
        ClaimState::Failed,
        ClaimState::NeedsAttention,
        ClaimState::Started,
    ];
    for i in 0..40 {
        let ClaimOutcome::Created(c) = s
            .claim(&new_claim(&format!("r{i}"), Duration::from_secs(60)))
            .await
            .unwrap()
        else {
            panic!()
        };
        let st = states[i % 4];
        if st != ClaimState::Started {
            let set = Settlement {
                state: Some(st),
                error: Some("x".into()),
                ..Default::default()
            };
            assert!(s.settle(c.id, 1, &set, &ev()).await.unwrap());
        }
    }
    age_everything(&store, &s).await;
    let dry = s.prune(Duration::from_secs(86_400), 3, true).await.unwrap();
    assert_eq!(dry.deleted, 20);
    assert_eq!(
        s.list(&Default::default()).await.unwrap().len(),
        0,
        "limit 0 lists nothing"
    );
    let r = s
        .prune(Duration::from_secs(86_400), 3, false)
        .await
        .unwrap();
    assert_eq!(r.deleted, 20);
    assert!(
        r.batches >= 7,
        "deleted in batches of 3: {} batches",
        r.batches
    );
    let left = s
        .list(&claimd::store::ClaimFilter {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(left.len(), 20);
    assert!(
        left.iter()
            .all(|c| matches!(c.state, ClaimState::Started | ClaimState::NeedsAttention))
    );
    // Nothing newer than the window is touched.
    assert_eq!(
        s.prune(Duration::from_secs(3 * 86_400), 100, false)
            .await
            .unwrap()
            .deleted,
        0
    );
}

#[tokio::test]
async fn retention_deletes_only_old_terminal_claims_sqlite() {
    retention(TestStore::sqlite()).await;
}

#[tokio::test]
async fn retention_deletes_only_old_terminal_claims_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    retention(store).await;
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

/// Batched claims and settles answer exactly like the one-by-one calls: duplicates (also
/// within one batch) and mismatches are recognised and counted, and every settle is fenced on
/// its own attempt (I2).
async fn batches(store: TestStore) {
    use claimd::store::SettleItem;
    let s = open(&store).await;
    let lease = Duration::from_secs(60);
    assert!(matches!(
        s.claim(&new_claim("b0", lease)).await.unwrap(),
        ClaimOutcome::Created(_)
    ));
    let mut mismatch = new_claim("b0", lease);
    mismatch.fingerprint = fingerprint(b"other");
    let batch = vec![
        new_claim("b1", lease),
        new_claim("b0", lease),
        new_claim("b2", lease),
        new_claim("b1", lease),
        mismatch,
        new_claim("b3", lease),
    ];
    let out = s.claim_many(&batch).await.unwrap();
    let kinds: Vec<&str> = out.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "created",
            "duplicate",
            "created",
            "duplicate",
            "mismatch",
            "created"
        ]
    );
    let b0 = s.get("payments", "", "b0").await.unwrap().unwrap();
    assert_eq!((b0.duplicate_count, b0.mismatch_count), (1, 1));
    let ClaimOutcome::Created(b1) = &out[0] else {
        unreachable!()
    };
    assert_eq!(&b1.payload[..], b"b1");

    // b2 is taken over by a sweeper (attempt 2) before the batch settles it with attempt 1.
    take_over(&s, "b2").await;
    let settled = |c: &ClaimOutcome| {
        let ClaimOutcome::Created(c) = c else {
            unreachable!()
        };
        SettleItem {
            id: c.id,
            attempt: c.attempt,
            settlement: Settlement {
                state: Some(ClaimState::Completed),
                provider_status: Some(200),
                provider_response: Some(format!("ok {}", c.message_id)),
                ..Default::default()
            },
            event: ev(),
        }
    };
    let items = vec![settled(&out[0]), settled(&out[2]), settled(&out[5])];
    assert_eq!(s.settle_many(&items).await.unwrap(), [true, false, true]);
    let b1 = s.get("payments", "", "b1").await.unwrap().unwrap();
    assert_eq!(b1.state, ClaimState::Completed);
    assert!(b1.processed_utc.is_some());
    assert_eq!(b1.provider_response.as_deref(), Some("ok b1"));
    let b2 = s.get("payments", "", "b2").await.unwrap().unwrap();
    assert_eq!((b2.state, b2.attempt), (ClaimState::Started, 2));
    assert_eq!(s.events(b1.id).await.unwrap().len(), 1);
    // Only the hand-off line: the late batch recorded nothing for b2.
    assert_eq!(s.events(b2.id).await.unwrap().len(), 1);
    // Settling again changes nothing: the claims are no longer started.
    assert_eq!(s.settle_many(&items).await.unwrap(), [false, false, false]);
}

/// Expires `id`'s lease and lets a sweeper take it (attempt + 1).
async fn take_over(s: &Store, id: &str) {
    let c = s.get("payments", "", id).await.unwrap().unwrap();
    let released = Settlement {
        release_lease: true,
        ..Default::default()
    };
    assert!(s.settle(c.id, c.attempt, &released, &ev()).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let taken = s
        .take_stale("payments", 10, "sweeper", Duration::from_secs(60), far())
        .await
        .unwrap();
    assert!(taken.iter().any(|t| t.claim.message_id == id));
}

#[tokio::test]
async fn batched_claims_and_settles_sqlite() {
    batches(TestStore::sqlite()).await;
}

#[tokio::test]
async fn batched_claims_and_settles_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    batches(store).await;
}

/// What a claim came to, by kind.
fn kind(o: &ClaimOutcome) -> &'static str {
    match o {
        ClaimOutcome::Created(_) => "created",
        ClaimOutcome::Duplicate(_) => "duplicate",
        ClaimOutcome::Mismatch(_) => "mismatch",
    }
}

/// Group commit through the plain `claim` and `settle` calls: many callers at once (they are
/// written together), with duplicates and a mismatch of each other inside the batch, and
/// calls whose rows an earlier batch committed without its answer arriving (a lost batch,
/// retried with the same token). Each caller gets its own answer; every settle is fenced on
/// its own attempt.
async fn concurrent_calls(store: TestStore) {
    let s = open(&store).await;
    let lease = Duration::from_secs(60);
    // A batch that committed but whose callers never heard back.
    let lost = vec![new_claim("lost-1", lease), new_claim("lost-2", lease)];
    s.claim_many(&lost).await.unwrap();
    let mut calls: Vec<(NewClaim, &str)> = (0..30)
        .map(|i| (new_claim(&format!("c{i}"), lease), "created"))
        .collect();
    // The same messages again (other deliveries, other tokens), in the same batch.
    calls.push((new_claim("c1", lease), "duplicate"));
    calls.push((new_claim("c2", lease), "duplicate"));
    let mut other = new_claim("c3", lease);
    other.fingerprint = fingerprint(b"another payload");
    calls.push((other, "mismatch"));
    // The lost batch's calls, retried: their own rows, new claims, nothing counted.
    calls.extend(lost.iter().map(|n| (n.clone(), "created")));
    let tasks: Vec<_> = calls
        .iter()
        .map(|(n, _)| {
            let (s, n) = (s.clone(), n.clone());
            tokio::spawn(async move { s.claim(&n).await.unwrap() })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    // Which delivery of c1 (or c2) wins is the batch's order; each message is created once.
    for id in ["c1", "c2", "c3"] {
        let mut kinds: Vec<&str> = calls
            .iter()
            .zip(&outcomes)
            .filter(|((n, _), _)| n.message_id == id)
            .map(|(_, o)| kind(o))
            .collect();
        kinds.sort();
        let want: &[&str] = if id == "c3" {
            &["created", "mismatch"]
        } else {
            &["created", "duplicate"]
        };
        assert_eq!(kinds, want, "{id}");
    }
    for ((n, want), o) in calls.iter().zip(&outcomes) {
        if !["c1", "c2", "c3"].contains(&n.message_id.as_str()) {
            assert_eq!(kind(o), *want, "{}", n.message_id);
        }
        if let ClaimOutcome::Created(c) = o {
            assert_eq!(c.payload, n.payload, "{}: ready to perform", n.message_id);
        }
    }
    for (id, counts) in [
        ("c1", (1, 0)),
        ("c3", (0, 1)),
        ("c4", (0, 0)),
        ("lost-1", (0, 0)),
    ] {
        let c = s.get("payments", "", id).await.unwrap().unwrap();
        assert_eq!((c.duplicate_count, c.mismatch_count), counts, "{id}");
    }

    // Settles at once; c5 was taken over by a sweeper first, so its settle changes nothing.
    take_over(&s, "c5").await;
    let created: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            ClaimOutcome::Created(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(created.len(), 32);
    let tasks: Vec<_> = created
        .iter()
        .map(|c| {
            let (s, id, attempt) = (s.clone(), c.id, c.attempt);
            tokio::spawn(async move {
                let done = Settlement {
                    state: Some(ClaimState::Completed),
                    provider_status: Some(200),
                    ..Default::default()
                };
                s.settle(id, attempt, &done, &ev()).await.unwrap()
            })
        })
        .collect();
    for (c, t) in created.iter().zip(tasks) {
        assert_eq!(t.await.unwrap(), c.message_id != "c5", "{}", c.message_id);
    }
    let c5 = s.get("payments", "", "c5").await.unwrap().unwrap();
    assert_eq!((c5.state, c5.attempt), (ClaimState::Started, 2));
    let c6 = s.get("payments", "", "c6").await.unwrap().unwrap();
    assert_eq!(c6.state, ClaimState::Completed);
    assert_eq!(s.events(c6.id).await.unwrap().len(), 1, "one history line");
}

#[tokio::test]
async fn concurrent_claims_and_settles_are_committed_together_sqlite() {
    concurrent_calls(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_and_settles_are_committed_together_sqlite_threads() {
    concurrent_calls(TestStore::sqlite()).await;
}

#[tokio::test]
async fn concurrent_claims_and_settles_are_committed_together_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    concurrent_calls(store).await;
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

/// Issue 11.1: a claim whose commit's reply was lost (a batch that failed as a whole after
/// committing, a connection cut after the commit) is retried by the same call. The retry must
/// recognise the row as the call's own new claim, not as a duplicate that performs nothing.
async fn own_row_after_a_lost_reply(store: TestStore) {
    let s = open(&store).await;
    let n = new_claim("lost-reply", Duration::from_secs(60));
    assert!(matches!(
        s.claim(&n).await.unwrap(),
        ClaimOutcome::Created(_)
    ));
    // The same call again (same token): still this call's new claim, nothing counted.
    let again = s.claim(&n).await.unwrap();
    let ClaimOutcome::Created(c) = again else {
        panic!("the call's own row must come back as Created, got {again:?}")
    };
    assert_eq!(c.payload, n.payload, "with its payload, ready to perform");
    assert_eq!(c.duplicate_count, 0);
    // Another delivery of the same message (another token) is a duplicate, as before.
    let mut other = n.clone();
    other.claim_token = claimd::claim::new_claim_token();
    assert!(matches!(
        s.claim(&other).await.unwrap(),
        ClaimOutcome::Duplicate(_)
    ));
    // A delivery without a token is never taken for the row's own call.
    let mut untokened = n.clone();
    untokened.claim_token = String::new();
    assert!(matches!(
        s.claim(&untokened).await.unwrap(),
        ClaimOutcome::Duplicate(_)
    ));
    let c = s.get("payments", "", "lost-reply").await.unwrap().unwrap();
    assert_eq!(c.duplicate_count, 2);
}

#[tokio::test]
async fn a_call_recognises_its_own_claim_after_a_lost_reply_sqlite() {
    own_row_after_a_lost_reply(TestStore::sqlite()).await;
}

#[tokio::test]
async fn a_call_recognises_its_own_claim_after_a_lost_reply_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    own_row_after_a_lost_reply(store).await;
}

/// Issue 11.3: an operator re-drives a 20-day-old `failed` claim in a transaction that is still
/// open while retention runs its batch. Retention must not delete the claim, which is
/// `started` again when the operator commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_never_deletes_a_claim_an_operator_is_redriving_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let s = open(&store).await;
    let ClaimOutcome::Created(c) = s
        .claim(&new_claim("old-failed", Duration::from_secs(60)))
        .await
        .unwrap()
    else {
        panic!("new claim")
    };
    let failed = Settlement {
        state: Some(ClaimState::Failed),
        error: Some("provider rejected it".into()),
        ..Default::default()
    };
    assert!(s.settle(c.id, 1, &failed, &ev()).await.unwrap());
    let pg = claimd::store::postgres::PgStore::connect(&store.url(), 2)
        .await
        .unwrap();
    sqlx::query("UPDATE claims SET updated_utc = now() - interval '20 days'")
        .execute(pg.pool())
        .await
        .unwrap();
    // Session A: the operator's redrive, held open.
    let mut a = pg.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM claims WHERE id = $1 FOR UPDATE")
        .bind(c.id)
        .execute(&mut *a)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE claims SET state = 'started', attempt = attempt + 1, \
         lease_until = now() - interval '1 millisecond', updated_utc = now() WHERE id = $1",
    )
    .bind(c.id)
    .execute(&mut *a)
    .await
    .unwrap();
    // Session B: retention, while A is open.
    let pruner = s.clone();
    let prune = tokio::spawn(async move {
        pruner
            .prune(Duration::from_secs(14 * 86_400), 100, false)
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.commit().await.unwrap();
    let r = prune.await.unwrap().unwrap();
    assert_eq!(r.deleted, 0, "retention deleted {} claims", r.deleted);
    let c = s
        .get("payments", "", "old-failed")
        .await
        .unwrap()
        .expect("the re-driven claim must survive retention");
    assert_eq!(c.state, ClaimState::Started);
    assert_eq!(c.attempt, 2);
}

/// Issue 11.5: a prune that is cut off (its task dropped mid-batch) must not leave the
/// retention lock held on a pooled connection, or retention stops on every instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_prune_does_not_keep_the_retention_lock_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let a = open(&store).await;
    let pg = claimd::store::postgres::PgStore::connect(&store.url(), 2)
        .await
        .unwrap();
    // Enough old terminal claims that the prune is still working when it is cut off.
    sqlx::query(
        "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
         state, updated_utc) \
         SELECT 'payments', '', 'm' || g, 'm' || g, 'f', '\\x00', 'completed', \
                now() - interval '30 days' FROM generate_series(1, 200000) g",
    )
    .execute(pg.pool())
    .await
    .unwrap();
    let cut = tokio::time::timeout(
        Duration::from_millis(150),
        a.prune(Duration::from_secs(86_400), 10, false),
    )
    .await;
    assert!(
        cut.is_err(),
        "the prune should still be running when cut off"
    );
    // Another instance (its own pool) must be able to prune soon after.
    let b = open(&store).await;
    let mut last = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let r = b
            .prune(Duration::from_secs(86_400), 50_000, false)
            .await
            .unwrap();
        if !r.skipped_locked {
            last = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = last.expect("retention lock still held 10 s after the prune holding it was cut off");
    assert!(r.deleted > 0);
    // And the first instance can prune again too.
    let again = a
        .prune(Duration::from_secs(86_400), 50_000, false)
        .await
        .unwrap();
    assert!(!again.skipped_locked);
}
