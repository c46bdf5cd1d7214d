//! A claim that vanished from the store while its worker performed it (what a failover to an
//! asynchronous standby that had not received it leaves): the worker's fenced settle finds no
//! row, raises the alarm (`claimd_claims_vanished_total`) and writes the claim back with the
//! outcome it got and a `restore` history line; a claim that merely moved, or that a re-sent
//! message created again, is left as it is.
//! And the two store operations on both drivers: a claim's key found whatever its id, a claim
//! written back with its outcome event, never over a claim of its key created meanwhile.

use crate::common;

use claimd::domain::claim::{Claim, ClaimState};
use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use claimd::service::run::Running;
use claimd::store::{ClaimOutcome, NewEvent, Settlement, Store};
use common::*;
use std::time::Duration;

/// Runs `statement` on the store's database as an administrator would, outside claimd.
async fn sql(store: &TestStore, statement: &str) {
    use sqlx::Connection;
    let statement = sqlx::AssertSqlSafe(statement.to_string());
    match store {
        TestStore::Sqlite(_) => {
            let mut c = sqlx::SqliteConnection::connect(&store.url()).await.unwrap();
            sqlx::query(statement).execute(&mut c).await.unwrap();
        }
        TestStore::Pg(_) => {
            let mut c = sqlx::PgConnection::connect(&store.url()).await.unwrap();
            sqlx::query(statement).execute(&mut c).await.unwrap();
        }
    }
}

/// Deletes message `id`'s claim and its history, as a failover that lost it does.
async fn lose(store: &TestStore, id: &str) {
    sql(
        store,
        &format!(
            "DELETE FROM claim_events WHERE claim_id IN \
             (SELECT id FROM claims WHERE message_id = '{id}')"
        ),
    )
    .await;
    sql(
        store,
        &format!("DELETE FROM claims WHERE message_id = '{id}'"),
    )
    .await;
}

/// A worker whose provider takes 1.5 s to apply an effect (keys are the message ids).
async fn slow_worker(store: &TestStore) -> (Sandbox, Running, Store) {
    let (sb, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(1500),
        ..Default::default()
    })
    .await;
    let consumer = consumer_toml(
        "payments",
        &provider,
        "lease = \"10s\"\nkey = \"{message_id}\"",
    )
    .replace("timeout = \"1s\"", "timeout = \"5s\"");
    let running = start(&config_toml(&store.url(), &consumer)).await;
    let handle = claimd::store::open(&store.url(), 2).await.unwrap();
    (sb, running, handle)
}

/// Posts message `id` and waits until its call is at the provider; the claim as committed.
async fn post_and_wait_for_the_call(running: &Running, sb: &Sandbox, s: &Store, id: &str) -> Claim {
    let r = client()
        .post(format!("http://{}/v1/messages/payments", running.http_addr))
        .header("Idempotency-Key", id)
        .body("{\"amount\":1250}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    assert!(
        eventually(Duration::from_secs(5), || async { sb.requests() >= 1 }).await,
        "the call never reached the provider"
    );
    s.get("payments", "", id).await.unwrap().unwrap()
}

async fn vanished_series(running: &Running) -> Option<f64> {
    let text = client()
        .get(format!("http://{}/metrics", running.http_addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with("claimd_claims_vanished_total{consumer=\"payments\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn vanished_during_the_call_is_written_back_completed(store: TestStore) {
    let (sb, running, s) = slow_worker(&store).await;
    assert_eq!(
        vanished_series(&running).await,
        Some(0.0),
        "at zero from start"
    );
    let before = post_and_wait_for_the_call(&running, &sb, &s, "order-1").await;
    assert_eq!(before.state, ClaimState::Started);
    lose(&store, "order-1").await;
    assert!(s.get("payments", "", "order-1").await.unwrap().is_none());

    let back = eventually(Duration::from_secs(10), || async {
        s.get("payments", "", "order-1")
            .await
            .unwrap()
            .is_some_and(|c| c.state == ClaimState::Completed)
    })
    .await;
    assert!(back, "the vanished claim was not written back completed");
    let c = s.get("payments", "", "order-1").await.unwrap().unwrap();
    assert_eq!(c.idem_key, "order-1");
    assert_eq!(c.payload, before.payload);
    assert_eq!(c.fingerprint, before.fingerprint);
    assert_eq!(c.attempt, before.attempt);
    assert_eq!(c.provider_status, Some(200));
    assert_eq!(c.received_utc, before.received_utc);
    let events = s.events(c.id).await.unwrap();
    let restore = events
        .iter()
        .find(|e| e.action == "restore")
        .unwrap_or_else(|| panic!("no restore line: {events:?}"));
    assert_eq!(restore.outcome, "completed");
    assert!(
        restore
            .detail
            .as_deref()
            .is_some_and(|d| d.starts_with(&format!(
                "restored after it vanished from the store: claim {} (attempt 1)",
                before.id
            ))),
        "{restore:?}"
    );
    let effects = sb.effects();
    let applied: Vec<_> = effects.iter().filter(|e| e.key == "order-1").collect();
    assert_eq!(applied.len(), 1, "{effects:?}");
    assert_eq!(applied[0].applied, 1, "the provider applied the key once");
    assert_eq!(vanished_series(&running).await, Some(1.0));
    // The written-back claim is an ordinary one: a re-sent message is its duplicate.
    let r = client()
        .post(format!("http://{}/v1/messages/payments", running.http_addr))
        .header("Idempotency-Key", "order-1")
        .body("{\"amount\":1250}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    running.shutdown(Duration::from_secs(2)).await;
}

async fn a_claim_that_moved_is_not_written_back(store: TestStore) {
    let (sb, running, s) = slow_worker(&store).await;
    let before = post_and_wait_for_the_call(&running, &sb, &s, "order-2").await;
    // Moved during the call (as a takeover or a person would move it): parked.
    sql(
        &store,
        "UPDATE claims SET state = 'needs_attention', last_error = 'parked by hand', \
         lease_owner = NULL, version = version + 1 WHERE message_id = 'order-2'",
    )
    .await;
    let fenced_out = eventually(Duration::from_secs(10), || async {
        s.events(before.id)
            .await
            .unwrap()
            .iter()
            .any(|e| e.outcome == "fenced_out")
    })
    .await;
    assert!(fenced_out, "the worker's answer never lost its fence");
    let c = s.get("payments", "", "order-2").await.unwrap().unwrap();
    assert_eq!(c.id, before.id);
    assert_eq!(c.state, ClaimState::NeedsAttention);
    assert_eq!(c.last_error.as_deref(), Some("parked by hand"));
    let events = s.events(c.id).await.unwrap();
    assert!(!events.iter().any(|e| e.action == "restore"), "{events:?}");
    assert_eq!(vanished_series(&running).await, Some(0.0));
    running.shutdown(Duration::from_secs(2)).await;
}

async fn created_again_meanwhile_is_counted_and_left_as_it_is(store: TestStore) {
    let (sb, running, s) = slow_worker(&store).await;
    let before = post_and_wait_for_the_call(&running, &sb, &s, "order-3").await;
    lose(&store, "order-3").await;
    // The producer sends the message again: a new claim of the key, under a new id.
    let r = client()
        .post(format!("http://{}/v1/messages/payments", running.http_addr))
        .header("Idempotency-Key", "order-3")
        .body("{\"amount\":1250}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let again = s.get("payments", "", "order-3").await.unwrap().unwrap();
    assert_ne!(again.id, before.id);
    let counted = eventually(Duration::from_secs(10), || async {
        vanished_series(&running).await == Some(1.0)
    })
    .await;
    assert!(counted, "the lost claim was not counted");
    let c = s.get("payments", "", "order-3").await.unwrap().unwrap();
    assert_eq!(c.id, again.id, "the claim created again is left as it is");
    let events = s.events(c.id).await.unwrap();
    assert!(!events.iter().any(|e| e.action == "restore"), "{events:?}");
    let effects = sb.effects();
    let applied: Vec<_> = effects.iter().filter(|e| e.key == "order-3").collect();
    assert_eq!(applied.len(), 1, "{effects:?}");
    assert_eq!(applied[0].applied, 1, "the provider applied the key once");
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_claim_created_again_after_it_vanished_is_counted_and_left_as_it_is() {
    created_again_meanwhile_is_counted_and_left_as_it_is(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_claim_created_again_after_it_vanished_is_counted_and_left_as_it_is() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    created_again_meanwhile_is_counted_and_left_as_it_is(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_claim_that_vanished_during_the_call_is_written_back_completed() {
    vanished_during_the_call_is_written_back_completed(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_claim_that_vanished_during_the_call_is_written_back_completed() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    vanished_during_the_call_is_written_back_completed(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_claim_that_moved_during_the_call_is_not_written_back() {
    a_claim_that_moved_is_not_written_back(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_claim_that_moved_during_the_call_is_not_written_back() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    a_claim_that_moved_is_not_written_back(store).await;
}

fn restore_event() -> NewEvent<'static> {
    NewEvent {
        actor: "w1",
        action: "restore",
        outcome: "completed",
        provider_status: Some(200),
        detail: Some("restored after it vanished from the store: test"),
    }
}

async fn store_finds_and_writes_back_claims(store: TestStore) {
    let s = claimd::store::open(&store.url(), 4).await.unwrap();
    s.migrate().await.unwrap();
    s.set_outcome_destinations(vec![("payments".into(), "hooks".into())]);
    let ClaimOutcome::Created(claim) = s
        .claim(&orphan_claim("payments", "", "m1", "k1"))
        .await
        .unwrap()
    else {
        panic!("not created")
    };
    assert_eq!(
        s.locate_claim("payments", "", "m1").await.unwrap(),
        Some((claim.id, ClaimState::Started))
    );
    lose(&store, "m1").await;
    assert_eq!(s.locate_claim("payments", "", "m1").await.unwrap(), None);

    let done = Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        provider_response: Some("{\"ok\":true}".into()),
        ..Default::default()
    };
    let id = s
        .restore_claim(&claim, &done, ClaimState::Completed, &restore_event())
        .await
        .unwrap()
        .expect("written back");
    let back = s.get("payments", "", "m1").await.unwrap().unwrap();
    assert_eq!(back.id, id);
    assert_eq!(back.state, ClaimState::Completed);
    assert_eq!(
        (back.attempt, back.idem_key.as_str()),
        (claim.attempt, "k1")
    );
    assert_eq!(back.payload, claim.payload);
    assert_eq!(back.received_utc, claim.received_utc);
    assert_eq!(back.provider_response.as_deref(), Some("{\"ok\":true}"));
    assert!(back.processed_utc.is_some() && back.lease_owner.is_none());
    let events = s.events(id).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0].action.as_str(), events[0].actor.as_str()),
        ("restore", "w1")
    );
    // Its outcome event, as a settle writes one.
    let due = s.due_outcomes("payments", "hooks", 10).await.unwrap();
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!((due[0].claim_id, due[0].state.as_str()), (id, "completed"));
    assert_eq!(due[0].action, "restore");

    // A claim of its key exists: nothing is written, nothing overwritten.
    let parked = Settlement {
        state: Some(ClaimState::NeedsAttention),
        error: Some("other".into()),
        ..Default::default()
    };
    assert_eq!(
        s.restore_claim(
            &claim,
            &parked,
            ClaimState::NeedsAttention,
            &restore_event()
        )
        .await
        .unwrap(),
        None
    );
    let still = s.get("payments", "", "m1").await.unwrap().unwrap();
    assert_eq!((still.id, still.state), (id, ClaimState::Completed));
    assert_eq!(s.events(id).await.unwrap().len(), 1);

    // Left started: written back held by its worker with its lease over, for the next sweep;
    // no outcome event.
    let ClaimOutcome::Created(open) = s
        .claim(&orphan_claim("payments", "", "m2", "k2"))
        .await
        .unwrap()
    else {
        panic!("not created")
    };
    lose(&store, "m2").await;
    let waiting = Settlement {
        error: Some("provider answered 503".into()),
        ..Default::default()
    };
    let id2 = s
        .restore_claim(&open, &waiting, ClaimState::Started, &restore_event())
        .await
        .unwrap()
        .expect("written back");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let stale = s.peek_stale("payments", 10).await.unwrap();
    assert_eq!(
        stale.iter().map(|t| t.claim.id).collect::<Vec<_>>(),
        vec![id2]
    );
    assert_eq!(stale[0].claim.lease_owner.as_deref(), Some("w1"));
    assert_eq!(
        stale[0].claim.last_error.as_deref(),
        Some("provider answered 503")
    );
    assert_eq!(
        s.due_outcomes("payments", "hooks", 10).await.unwrap().len(),
        1
    );
}

#[tokio::test]
async fn sqlite_the_store_finds_a_claim_by_its_key_and_writes_a_vanished_one_back() {
    store_finds_and_writes_back_claims(TestStore::sqlite()).await;
}

#[tokio::test]
async fn postgres_the_store_finds_a_claim_by_its_key_and_writes_a_vanished_one_back() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    store_finds_and_writes_back_claims(store).await;
}

/// A database effect whose claim vanished during its transaction: the settle in the effect's
/// transaction finds no row, so nothing is applied; the claim is written back `started`, and
/// the sweeper runs it again, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_database_effects_claim_that_vanished_is_written_back_and_applied_once() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    sql(
        &store,
        "CREATE TABLE invoices (order_id TEXT NOT NULL, amount_cents BIGINT NOT NULL)",
    )
    .await;
    let consumer = r#"
[[consumers]]
name = "ledger"
source = "http"
key = "{message_id}"
lease = "6s"
redrive_within = "1h"
[consumers.effect]
kind = "sql"
timeout = "3s"
statement = "INSERT INTO invoices (order_id, amount_cents) VALUES (:order_id, :amount_cents) RETURNING pg_sleep(1)"
"#;
    let running = start(&config_toml(&store.url(), consumer)).await;
    let s = claimd::store::open(&store.url(), 2).await.unwrap();
    let pool = sqlx::PgPool::connect(&store.url()).await.unwrap();
    let count = |q: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(q)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let r = client()
        .post(format!("http://{}/v1/messages/ledger", running.http_addr))
        .header("Idempotency-Key", "inv-1")
        .header("Content-Type", "application/json")
        .body("{\"order_id\":\"inv-1\",\"amount_cents\":1250}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let before = s.get("ledger", "", "inv-1").await.unwrap().unwrap();
    let in_flight = eventually(Duration::from_secs(5), || async {
        count(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE state = 'active' AND query LIKE 'INSERT INTO invoices%'",
        )
        .await
            >= 1
    })
    .await;
    assert!(in_flight, "the effect's statement never ran");
    lose(&store, "inv-1").await;

    let done = eventually(Duration::from_secs(15), || async {
        s.get("ledger", "", "inv-1")
            .await
            .unwrap()
            .is_some_and(|c| c.state == ClaimState::Completed)
    })
    .await;
    assert!(done, "the written-back claim was not completed");
    assert_eq!(
        count("SELECT count(*) FROM invoices").await,
        1,
        "applied once"
    );
    let c = s.get("ledger", "", "inv-1").await.unwrap().unwrap();
    assert_ne!(c.id, before.id);
    let events = s.events(c.id).await.unwrap();
    let restore = events
        .iter()
        .find(|e| e.action == "restore")
        .unwrap_or_else(|| panic!("no restore line: {events:?}"));
    assert_eq!(restore.outcome, "started");
    let metrics = client()
        .get(format!("http://{}/metrics", running.http_addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("claimd_claims_vanished_total{consumer=\"ledger\"} 1"),
        "{metrics}"
    );
    running.shutdown(Duration::from_secs(2)).await;
}
