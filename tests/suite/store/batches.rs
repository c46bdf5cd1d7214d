//! Writes committed together (group commit) answer like the one-by-one calls on both drivers:
//! duplicates and mismatches inside a batch, settles fenced per row, a call that recognises
//! its own row after a lost reply or a lost batch.

use super::*;

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
    mismatch.payload = b"other".to_vec().into();
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
    let taken = release_and_take(s, &[id]).await;
    assert!(taken.iter().any(|t| t.claim.message_id == id));
}

/// Expires the leases of `ids` and lets a sweeper take every stuck claim: what it found.
async fn release_and_take(s: &Store, ids: &[&str]) -> Vec<claimd::store::TakenClaim> {
    let released = Settlement {
        lease_for: Some(Duration::ZERO),
        ..Default::default()
    };
    for id in ids {
        let c = s.get("payments", "", id).await.unwrap().unwrap();
        assert!(s.settle(c.id, c.attempt, &released, &ev()).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    s.take_stale(
        "payments",
        100,
        "sweeper",
        Duration::from_secs(60),
        far(),
        true,
    )
    .await
    .unwrap()
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
    other.payload = b"another payload".to_vec().into();
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
    other.claim_token = claimd::domain::claim::new_claim_token();
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

/// A park consumer's "not called yet" markers, cleared by many workers at once (written
/// together): each cleared only while its worker still holds the claim (fenced on the attempt
/// like a settle), each caller told whether it did.
async fn concurrent_marks(store: TestStore) {
    let s = open(&store).await;
    let lease = Duration::from_secs(60);
    let mut created = Vec::new();
    for i in 0..20 {
        let mut n = new_claim(&format!("m{i}"), lease);
        n.mark_not_called = true;
        let ClaimOutcome::Created(c) = s.claim(&n).await.unwrap() else {
            panic!("m{i} is new")
        };
        created.push(c);
    }
    // m3 was taken over by a sweeper before its worker got to the call.
    take_over(&s, "m3").await;
    let tasks: Vec<_> = created
        .iter()
        .map(|c| {
            let (s, id, attempt) = (s.clone(), c.id, c.attempt);
            tokio::spawn(async move { s.mark_called(id, attempt).await.unwrap() })
        })
        .collect();
    for (c, t) in created.iter().zip(tasks) {
        assert_eq!(t.await.unwrap(), c.message_id != "m3", "{}", c.message_id);
    }
    let m3 = s.get("payments", "", "m3").await.unwrap().unwrap();
    assert_eq!(m3.attempt, 2, "the sweeper's attempt, untouched");
    // What a sweeper finds after the others' leases lapse: no "not called" marker left (it
    // would perform them as first sends instead of treating their outcome as unknown).
    let others: Vec<&str> = created
        .iter()
        .map(|c| c.message_id.as_str())
        .filter(|id| *id != "m3")
        .collect();
    let taken = release_and_take(&s, &others).await;
    assert_eq!(taken.len(), 19);
    assert!(
        taken.iter().all(|t| t.handoff.is_none()),
        "{:?}",
        taken.iter().map(|t| &t.handoff).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_called_markers_are_cleared_together_and_fenced_sqlite() {
    concurrent_marks(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_called_markers_are_cleared_together_and_fenced_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    concurrent_marks(store).await;
}

/// Claims, repeats of finished claims and settles from many callers at once (on PostgreSQL
/// written together, one statement and one commit for both kinds): each caller its own
/// answer, each repeat counted once, each settle fenced on its own attempt and writing its
/// history line and its outcome events with it.
async fn claims_and_settles_together(store: TestStore) {
    let s = open(&store).await;
    s.set_outcome_destinations(vec![
        ("payments".into(), "hooks".into()),
        ("payments".into(), "bus".into()),
    ]);
    let lease = Duration::from_secs(60);
    let done = Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        ..Default::default()
    };
    // Finished claims, delivered again below.
    for i in 0..10 {
        let ClaimOutcome::Created(c) = s
            .claim(&new_claim(&format!("old{i}"), lease))
            .await
            .unwrap()
        else {
            panic!("old{i} is new")
        };
        assert!(s.settle(c.id, c.attempt, &done, &ev()).await.unwrap());
    }
    let mut open_claims = Vec::new();
    for i in 0..20 {
        let ClaimOutcome::Created(c) = s
            .claim(&new_claim(&format!("open{i}"), lease))
            .await
            .unwrap()
        else {
            panic!("open{i} is new")
        };
        open_claims.push(c);
    }
    // open7 was taken over by a sweeper: its worker's settle changes nothing.
    take_over(&s, "open7").await;
    let settles: Vec<_> = open_claims
        .iter()
        .map(|c| {
            let (s, id, attempt, done) = (s.clone(), c.id, c.attempt, done.clone());
            tokio::spawn(async move { s.settle(id, attempt, &done, &ev()).await.unwrap() })
        })
        .collect();
    let mut calls: Vec<(NewClaim, &str)> = (0..20)
        .map(|i| (new_claim(&format!("new{i}"), lease), "created"))
        .collect();
    calls.extend((0..10).map(|i| (new_claim(&format!("old{i}"), lease), "duplicate")));
    let mut other = new_claim("old3", lease);
    other.fingerprint = fingerprint(b"another payload");
    other.payload = b"another payload".to_vec().into();
    calls.push((other, "mismatch"));
    let claims: Vec<_> = calls
        .iter()
        .map(|(n, _)| {
            let (s, n) = (s.clone(), n.clone());
            tokio::spawn(async move { s.claim(&n).await.unwrap() })
        })
        .collect();
    for (c, t) in open_claims.iter().zip(settles) {
        assert_eq!(
            t.await.unwrap(),
            c.message_id != "open7",
            "{}",
            c.message_id
        );
    }
    let mut old3 = Vec::new();
    for ((n, want), t) in calls.iter().zip(claims) {
        let got = kind(&t.await.unwrap());
        if n.message_id == "old3" {
            old3.push(got);
        } else {
            assert_eq!(got, *want, "{}", n.message_id);
        }
    }
    old3.sort();
    assert_eq!(old3, ["duplicate", "mismatch"]);
    for i in 0..10 {
        let id = format!("old{i}");
        let c = s.get("payments", "", &id).await.unwrap().unwrap();
        let want = if i == 3 { (1, 1) } else { (1, 0) };
        assert_eq!((c.duplicate_count, c.mismatch_count), want, "{id}");
    }
    for c in &open_claims {
        let now = s.get("payments", "", &c.message_id).await.unwrap().unwrap();
        if c.message_id == "open7" {
            assert_eq!((now.state, now.attempt), (ClaimState::Started, 2));
        } else {
            assert_eq!(now.state, ClaimState::Completed, "{}", c.message_id);
            assert_eq!(s.events(c.id).await.unwrap().len(), 1, "{}", c.message_id);
        }
    }
    // Each completed claim's outcome event, once per destination: the 10 old and 19 open.
    for destination in ["hooks", "bus"] {
        assert!(
            s.hold_outcome_relay("payments", destination, "relay", lease)
                .await
                .unwrap()
        );
        let due = s.due_outcomes("payments", destination, 1000).await.unwrap();
        assert_eq!(due.len(), 29, "{destination}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_settles_written_together_answer_each_caller_sqlite() {
    claims_and_settles_together(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_settles_written_together_answer_each_caller_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    claims_and_settles_together(store).await;
}

/// A claim PostgreSQL refuses (a NUL in its key) fails its own caller only: the claims and
/// settles that waited in the same batch are written again by themselves, each answered as
/// if alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_claim_fails_no_other_caller_of_its_batch_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let s = open(&store).await;
    let lease = Duration::from_secs(60);
    let done = Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        ..Default::default()
    };
    let mut open_claims = Vec::new();
    for i in 0..10 {
        let ClaimOutcome::Created(c) = s
            .claim(&new_claim(&format!("open{i}"), lease))
            .await
            .unwrap()
        else {
            panic!("open{i} is new")
        };
        open_claims.push(c);
    }
    for round in 0..5 {
        let settles: Vec<_> = open_claims
            .iter()
            .filter(|c| c.message_id.ends_with(&round.to_string()) || round == 4)
            .map(|c| {
                let (s, id, attempt, done) = (s.clone(), c.id, c.attempt, done.clone());
                tokio::spawn(async move { s.settle(id, attempt, &done, &ev()).await.unwrap() })
            })
            .collect();
        let bad = new_claim(&format!("bad\0{round}"), lease);
        let bad = {
            let s = s.clone();
            tokio::spawn(async move { s.claim(&bad).await })
        };
        let good: Vec<_> = (0..5)
            .map(|i| {
                let (s, n) = (s.clone(), new_claim(&format!("good{round}-{i}"), lease));
                tokio::spawn(async move { s.claim(&n).await.unwrap() })
            })
            .collect();
        assert!(bad.await.unwrap().is_err(), "round {round}");
        for t in good {
            assert_eq!(kind(&t.await.unwrap()), "created", "round {round}");
        }
        for t in settles {
            // Round 4 settles them all again: those settled before are no longer started.
            let settled = t.await.unwrap();
            assert!(settled || round == 4, "round {round}");
        }
    }
    for c in &open_claims {
        let now = s.get("payments", "", &c.message_id).await.unwrap().unwrap();
        assert_eq!(now.state, ClaimState::Completed, "{}", c.message_id);
        assert_eq!(s.events(c.id).await.unwrap().len(), 1, "{}", c.message_id);
    }
}
