//! Pending claims of a consumer whose `[effect.outcome]` section was removed from the
//! configuration, on both drivers: nothing can read the provider's answers by value any more,
//! so a sweeper pass parks them once `pending_for` (its default, 7 days) has passed, and
//! leaves younger ones pending.

use super::*;
use claimd::engine::sweeper::Sweeper;

/// Makes the pending claim `id` look pending for `days` days.
async fn pending_for_days(store: &TestStore, id: i64, days: i64) {
    match store {
        TestStore::Pg(_) => {
            let pg = claimd::store::postgres::PgStore::connect(&store.url(), 1)
                .await
                .unwrap();
            sqlx::query("UPDATE claims SET pending_utc = now() - make_interval(days => $1::int) WHERE id = $2")
                .bind(days as i32)
                .bind(id)
                .execute(pg.pool())
                .await
                .unwrap();
        }
        TestStore::Sqlite(_) => {
            let lite = claimd::store::sqlite::SqliteStore::connect(&store.url(), 1)
                .await
                .unwrap();
            sqlx::query("UPDATE claims SET pending_utc = pending_utc - ?1 WHERE id = ?2")
                .bind(days * 86_400_000)
                .bind(id)
                .execute(lite.pool())
                .await
                .unwrap();
        }
    }
}

async fn parked_once_pending_for_has_passed(store: TestStore) {
    // The consumer as it is configured now: no `[consumers.effect.outcome]`.
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", "http://127.0.0.1:9", ""),
    );
    let app = claimd::service::app::App::open(load(&toml), true)
        .await
        .unwrap();
    let s = app.store.clone();
    // Two claims that became pending while it still read outcomes by value.
    let mut ids = Vec::new();
    for id in ["old-1", "young-1"] {
        let ClaimOutcome::Created(c) = s
            .claim(&orphan_claim("payments", "", id, id))
            .await
            .unwrap()
        else {
            panic!("new claim")
        };
        let pending = Settlement {
            state: Some(ClaimState::Pending),
            provider_status: Some(200),
            provider_id: Some(format!("pi_{id}")),
            lease_for: Some(Duration::ZERO),
            ..Default::default()
        };
        assert!(s.settle(c.id, c.attempt, &pending, &ev()).await.unwrap());
        ids.push(c.id);
    }
    pending_for_days(&store, ids[0], 8).await;
    pending_for_days(&store, ids[1], 1).await;
    tokio::time::sleep(Duration::from_millis(20)).await;

    let pass = Sweeper::new(app.claimer.clone(), 10)
        .pass(false)
        .await
        .unwrap();
    let old = s.get("payments", "", "old-1").await.unwrap().unwrap();
    assert_eq!(old.state, ClaimState::NeedsAttention, "{pass:?}");
    let reason = old.last_error.unwrap_or_default();
    assert!(
        reason.starts_with("still pending after ")
            && reason.contains(
                "the consumer no longer reads outcomes by value, so nothing can settle it"
            ),
        "{reason}"
    );
    let young = s.get("payments", "", "young-1").await.unwrap().unwrap();
    assert_eq!(young.state, ClaimState::Pending);
    // Looked at again when its `pending_for` ends, not at every pass.
    let next = young.lease_until.expect("a next look");
    assert!(
        next > chrono::Utc::now() + chrono::Duration::days(5),
        "{next}"
    );
}

#[tokio::test]
async fn pending_claims_without_outcomes_are_parked_sqlite() {
    parked_once_pending_for_has_passed(TestStore::sqlite()).await;
}

#[tokio::test]
async fn pending_claims_without_outcomes_are_parked_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    parked_once_pending_for_has_passed(store).await;
}
