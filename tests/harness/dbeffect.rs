//! A contended database effect in the run: a consumer `ledger` with `kind = "sql"` whose
//! statement, in the claims' own database, inserts a row keyed by the message id with the
//! payload's amount and adds one to a single shared counter row (every transaction of the
//! consumer waits for that row's lock, which each holds 50 ms, so that terminated backends and
//! kills often land inside an effect's transaction). The write commits with the claim's settle, or not at
//! all, so at the end a row exists if and only if its claim is `completed`, never two rows for
//! one message, and the counter equals the number of completed claims.

use super::*;
use claimd::domain::claim::ClaimState;

/// The table of the rows (a terminated backend whose statement names it was in an effect).
pub(super) const TABLE: &str = "chaos_rows";

/// The tables the statement writes, made before the workers start.
const TABLES: [&str; 3] = [
    // No unique key on purpose: a doubled write must show as two rows, not as a refusal.
    "CREATE TABLE chaos_rows (message_id TEXT NOT NULL, amount BIGINT NOT NULL, \
     at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE chaos_counter (id INT PRIMARY KEY, n BIGINT NOT NULL)",
    "INSERT INTO chaos_counter VALUES (1, 0)",
];

/// Makes the tables of the statement.
pub(super) async fn create_tables(db_url: &str) {
    let pool = sqlx::PgPool::connect(db_url).await.unwrap();
    for t in TABLES {
        sqlx::query(t).execute(&pool).await.unwrap();
    }
    pool.close().await;
}

/// The `ledger` consumer of the workers' configuration.
pub(super) fn consumer_toml() -> String {
    format!(
        r#"[[consumers]]
name = "ledger"
source = "http"
concurrency = 4
lease = "{lease_ms}ms"
max_attempts = 20
redrive_within = "1h"
key = "{{message_id}}"
[consumers.effect]
kind = "sql"
timeout = "1s"
statement = "WITH w AS (INSERT INTO chaos_rows (message_id, amount) VALUES (:message_id, :amount) RETURNING 1), u AS (UPDATE chaos_counter SET n = n + (SELECT count(*) FROM w) WHERE id = 1 RETURNING 1) SELECT pg_sleep(0.05) FROM u"
"#,
        lease_ms = WORKER_LEASE_MS,
    )
}

/// The ledger's messages: `n` of them, each once (ids `d{seed}-{k}`).
pub(super) fn messages(seed: u64, n: usize) -> Vec<Send_> {
    let mut r = rng(seed ^ 0xdbef);
    (0..n)
        .map(|k| Send_::Message {
            consumer: "ledger",
            tenant: "",
            id: format!("d{seed}-{k}"),
            body: format!("{{\"amount\":{}}}", r.u32(1..100_000)),
        })
        .collect()
}

/// The database-effect checks of a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct DbEffectCheck {
    /// `ledger` claims `completed`; rows written; the counter.
    pub completed: usize,
    pub rows: usize,
    pub counter: i64,
    /// `ledger` claims `failed` or parked: every message is valid, so each is a write lost
    /// to a fault claimd should have survived.
    pub not_completed: usize,
    /// Messages with a row and no completed claim, or a completed claim and no row.
    pub row_without_claim: usize,
    pub claim_without_row: usize,
    /// Messages with two rows or more.
    pub doubled: usize,
}

/// Compares the rows and the counter with the `ledger` claims; prints each claim a check
/// counts, with its reason.
pub(super) async fn check(db_url: &str, store: &Store) -> DbEffectCheck {
    let claims = store
        .list(&ClaimFilter {
            consumer: Some("ledger".into()),
            limit: 10_000_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let pool = sqlx::PgPool::connect(db_url).await.unwrap();
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT message_id, count(*) FROM chaos_rows GROUP BY message_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let counter: i64 = sqlx::query_scalar("SELECT n FROM chaos_counter WHERE id = 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    let rows: HashMap<String, i64> = rows.into_iter().collect();
    let completed: HashSet<&str> = claims
        .iter()
        .filter(|c| c.state == ClaimState::Completed)
        .map(|c| c.message_id.as_str())
        .collect();
    let mut not_completed = 0;
    for c in claims.iter().filter(|c| c.state != ClaimState::Completed) {
        not_completed += 1;
        if not_completed <= 10 {
            eprintln!(
                "ledger: {} {} attempt {}: {}",
                c.message_id,
                c.state,
                c.attempt,
                c.last_error.as_deref().unwrap_or("")
            );
        }
    }
    let row_without_claim = rows
        .keys()
        .filter(|id| !completed.contains(id.as_str()))
        .count();
    let claim_without_row = completed
        .iter()
        .filter(|id| !rows.contains_key(**id))
        .count();
    DbEffectCheck {
        completed: completed.len(),
        rows: rows.values().sum::<i64>() as usize,
        counter,
        not_completed,
        row_without_claim,
        claim_without_row,
        doubled: rows.values().filter(|n| **n > 1).count(),
    }
}
