//! Outcome events (the transactional outbox and its relay), response replay and
//! `Prefer: wait`, against the real parts: PostgreSQL and SQLite stores, RabbitMQ on
//! 127.0.0.1:5672, an HTTP receiver on loopback whose deliveries the independent
//! `standardwebhooks` package (PyPI) verifies, and `claimd` run in-process or as a process
//! that is SIGKILLed.
//!
//! By role: `store` (an event exactly when a settle commits, in order per claim, relays that
//! never take the same rows), `amqp` (RabbitMQ: every settle one event, a relay killed or its
//! connection closed loses none), `webhooks` (Standard Webhooks to HTTP, a receiver that is
//! down or failing loses none), `destinations` (RabbitMQ, a webhook and NATS on one consumer:
//! one down and a SIGKILL delay only that one), `down_log` (a destination that is down logged once per change), `answers` (replay, `Prefer: wait`, a client that hangs up).

use crate::common;

mod amqp;
mod answers;
mod destinations;
mod down_log;
mod store;
mod webhooks;

use common::{TestStore, client, config_toml, consumer_toml, eventually};
use std::time::Duration;

/// A consumer section with an `[consumers.outcomes]` table (`outcomes`: its lines).
pub fn consumer_with_outcomes(name: &str, provider: &str, extra: &str, outcomes: &str) -> String {
    format!(
        "{}\n[consumers.outcomes]\n{outcomes}\npoll = \"50ms\"\n",
        consumer_toml(name, provider, extra)
    )
}

/// Posts `n` messages `{prefix}-{i}` to `consumer`; each must be taken (202 or 200).
pub async fn post_many(base: &str, consumer: &str, prefix: &str, n: usize) {
    let c = client();
    for i in 0..n {
        let r = c
            .post(format!("{base}/v1/messages/{consumer}"))
            .header("Idempotency-Key", format!("{prefix}-{i}"))
            .header("Content-Type", "application/json")
            .body(format!(r#"{{"amount":{i}}}"#))
            .send()
            .await
            .expect("post");
        assert!(
            r.status() == 202 || r.status() == 200,
            "message {i}: {}",
            r.status()
        );
    }
}

/// Waits until `n` claims of `consumer` are `completed`.
pub async fn all_completed(store: &claimd::store::Store, consumer: &str, n: i64) -> bool {
    eventually(Duration::from_secs(60), || async {
        store
            .counts(None)
            .await
            .unwrap()
            .iter()
            .find(|c| c.consumer == consumer)
            .is_some_and(|c| c.completed == n)
    })
    .await
}

/// Every outcome event row of the store: (seq, claim id, state, sent).
pub async fn event_rows(url: &str) -> Vec<(String, i64, String, bool)> {
    use sqlx::Row;
    // The event id as the relay makes it (`evt_<claim>_<version>`; `evt_<row>` for a row
    // written before destinations had names).
    let sql = "SELECT CASE WHEN claim_version IS NULL THEN 'evt_' || id \
               ELSE 'evt_' || claim_id || '_' || claim_version END AS event_id, \
               claim_id, state, sent_utc IS NOT NULL AS sent FROM outcome_events ORDER BY id";
    if url.starts_with("sqlite") {
        let pool = sqlx::SqlitePool::connect(url).await.unwrap();
        let rows = sqlx::query(sql).fetch_all(&pool).await.unwrap();
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get::<bool, _>(3)))
            .collect()
    } else {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        let rows = sqlx::query(sql).fetch_all(&pool).await.unwrap();
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get::<bool, _>(3)))
            .collect()
    }
}

/// The whole configuration of one worker: store, an ephemeral port, consumers.
pub fn config(store: &TestStore, consumers: &str) -> String {
    config_toml(&store.url(), consumers)
}
