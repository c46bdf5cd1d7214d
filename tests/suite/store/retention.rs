//! Retention on both drivers: only old terminal claims go (I7), never a claim an operator is
//! re-driving, and a prune cut off mid-batch does not keep the lock.

use super::*;
use claimd::store::RetentionWindows;

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
    let dry = s
        .prune(
            &RetentionWindows::uniform(Duration::from_secs(86_400)),
            3,
            true,
        )
        .await
        .unwrap();
    assert_eq!(dry.deleted, 20);
    assert_eq!(
        s.list(&Default::default()).await.unwrap().len(),
        0,
        "limit 0 lists nothing"
    );
    let r = s
        .prune(
            &RetentionWindows::uniform(Duration::from_secs(86_400)),
            3,
            false,
        )
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
        s.prune(
            &RetentionWindows::uniform(Duration::from_secs(3 * 86_400)),
            100,
            false
        )
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
            .prune(
                &RetentionWindows::uniform(Duration::from_secs(14 * 86_400)),
                100,
                false,
            )
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
        a.prune(
            &RetentionWindows::uniform(Duration::from_secs(86_400)),
            10,
            false,
        ),
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
            .prune(
                &RetentionWindows::uniform(Duration::from_secs(86_400)),
                50_000,
                false,
            )
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
        .prune(
            &RetentionWindows::uniform(Duration::from_secs(86_400)),
            50_000,
            false,
        )
        .await
        .unwrap();
    assert!(!again.skipped_locked);
}

/// `[retention] keep_completed_for` / `keep_failed_for`: each terminal state goes by its own
/// window; a dry run counts each.
async fn windows_per_state(store: TestStore) {
    let s = open(&store).await;
    for i in 0..6 {
        let ClaimOutcome::Created(c) = s
            .claim(&new_claim(&format!("w{i}"), Duration::from_secs(60)))
            .await
            .unwrap()
        else {
            panic!()
        };
        let set = Settlement {
            state: Some(if i % 2 == 0 {
                ClaimState::Completed
            } else {
                ClaimState::Failed
            }),
            ..Default::default()
        };
        assert!(s.settle(c.id, 1, &set, &ev()).await.unwrap());
    }
    age_everything(&store, &s).await;
    let day = Duration::from_secs(86_400);
    let w = RetentionWindows {
        completed: day,
        failed: 3 * day,
        ..RetentionWindows::uniform(day)
    };
    let dry = s.prune(&w, 100, true).await.unwrap();
    assert_eq!(
        (dry.deleted_completed, dry.deleted_failed),
        (3, 0),
        "{dry:?}"
    );
    let r = s.prune(&w, 100, false).await.unwrap();
    assert_eq!(
        (r.deleted_completed, r.deleted_failed, r.deleted),
        (3, 0, 3),
        "{r:?}"
    );
    let left = s
        .list(&claimd::store::ClaimFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(left.len(), 3);
    assert!(left.iter().all(|c| c.state == ClaimState::Failed));
    let r = s
        .prune(&RetentionWindows { failed: day, ..w }, 100, false)
        .await
        .unwrap();
    assert_eq!((r.deleted_completed, r.deleted_failed), (0, 3), "{r:?}");
}

#[tokio::test]
async fn each_terminal_state_keeps_its_own_window_sqlite() {
    windows_per_state(TestStore::sqlite()).await;
}

#[tokio::test]
async fn each_terminal_state_keeps_its_own_window_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    windows_per_state(store).await;
}
