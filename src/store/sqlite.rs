//! SQLite driver: the embedded, single-node default. One process, WAL mode, writes serialised
//! by SQLite itself, `synchronous = FULL` so an acknowledged claim survives a power cut.
//! Times are INTEGER milliseconds from SQLite's clock.

use super::{
    ClaimEvent, ClaimFilter, ClaimOutcome, ClaimStore, ConsumerCounts, CountsByConsumer, Handoff,
    NewEvent, PruneResult, Settlement, StoreError, StoreResult, TakenClaim,
};
use crate::claim::{Claim, ClaimState, NewClaim};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlitePool};
use std::str::FromStr;
use std::time::Duration;
use tokio::sync::Mutex;
use tracing::instrument;

/// SQLite's clock in milliseconds since the Unix epoch.
macro_rules! now_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

macro_rules! cols {
    () => {
        "id, consumer, tenant, message_id, idem_key, fingerprint, content_type, state, attempt, \
         lease_owner, lease_until, received_utc, started_utc, processed_utc, last_error, \
         provider_status, provider_response, duplicate_count, mismatch_count, reconciled, \
         resent_count, handoff, handoff_attempt, claim_token"
    };
}

const INSERT_CLAIM: &str = concat!(
    "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
     content_type, lease_owner, claim_token, lease_until, received_utc, started_utc, \
     updated_utc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULLIF(?10, ''), ",
    now_ms!(),
    " + ?9, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ", ",
    now_ms!(),
    ") ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING ",
    cols!()
);

/// Counts a repeat delivery, unless the row is this call's own (its token: a commit whose
/// reply was lost), which is no repeat.
const COUNT_REPEAT: &str = concat!(
    "UPDATE claims SET \
       duplicate_count = duplicate_count + CASE WHEN claim_token = NULLIF(?5, '') THEN 0 \
                                                WHEN fingerprint = ?4 THEN 1 ELSE 0 END, \
       mismatch_count = mismatch_count + CASE WHEN claim_token = NULLIF(?5, '') THEN 0 \
                                              WHEN fingerprint = ?4 THEN 0 ELSE 1 END \
     WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3 RETURNING ",
    cols!()
);

const GET_CLAIM: &str = concat!(
    "SELECT ",
    cols!(),
    ", payload FROM claims WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3"
);

/// Fenced settle (I2); its history line follows in the same transaction.
const SETTLE: &str = concat!(
    "UPDATE claims SET \
       state = COALESCE(?3, state), \
       provider_status = COALESCE(?4, provider_status), \
       provider_response = COALESCE(?5, provider_response), \
       last_error = COALESCE(?6, last_error), \
       reconciled = reconciled OR ?7, \
       handoff = CASE WHEN ?8 THEN 'not_applied' ELSE handoff END, \
       handoff_attempt = CASE WHEN ?8 THEN attempt ELSE handoff_attempt END, \
       processed_utc = CASE WHEN ?3 = 'completed' THEN ",
    now_ms!(),
    " ELSE processed_utc END, \
       lease_owner = CASE WHEN ?3 IS NULL OR ?3 = 'started' THEN lease_owner END, \
       lease_until = CASE WHEN ?9 THEN ",
    now_ms!(),
    " WHEN ?3 IS NULL OR ?3 = 'started' THEN lease_until END, \
       updated_utc = ",
    now_ms!(),
    " WHERE id = ?1 AND attempt = ?2 AND state = 'started'"
);

const INSERT_EVENT: &str = concat!(
    "INSERT INTO claim_events (claim_id, attempt, at_utc, actor, action, outcome, \
     provider_status, detail) VALUES (?1, ?2, ",
    now_ms!(),
    ", ?3, ?4, ?5, ?6, ?7)"
);

const NOTE_RESENT: &str = "\
    UPDATE claims SET resent_count = resent_count + 1 \
    WHERE id = ?1 AND attempt = ?2 AND state = 'started'";

const LIST_CLAIMS: &str = concat!(
    "SELECT ",
    cols!(),
    " FROM claims \
     WHERE (?1 IS NULL OR state = ?1) \
       AND (?2 IS NULL OR consumer = ?2) \
       AND (NOT ?3 OR (state = 'started' AND lease_until < ",
    now_ms!(),
    ")) AND (?4 IS NULL OR received_utc >= ?4) \
     ORDER BY received_utc DESC, id DESC LIMIT ?5"
);

const LIST_EVENTS: &str = "\
    SELECT attempt, at_utc, actor, action, outcome, provider_status, detail \
    FROM claim_events WHERE claim_id = ?1 ORDER BY id";

/// Takeover: SQLite runs one writer at a time, so the statement alone is atomic.
const TAKE_STALE: &str = concat!(
    "UPDATE claims SET attempt = attempt + 1, lease_owner = ?3, lease_until = ",
    now_ms!(),
    " + ?4, started_utc = ",
    now_ms!(),
    ", updated_utc = ",
    now_ms!(),
    " WHERE id IN (SELECT id FROM claims WHERE consumer = ?1 AND state = 'started' \
       AND lease_until < MIN(?5, ",
    now_ms!(),
    ") ORDER BY lease_until LIMIT ?2) RETURNING ",
    cols!(),
    ", payload, (",
    now_ms!(),
    " - received_utc) AS age_ms"
);

const PEEK_STALE: &str = concat!(
    "SELECT ",
    cols!(),
    ", (",
    now_ms!(),
    " - received_utc) AS age_ms FROM claims WHERE consumer = ?1 AND state = 'started' AND lease_until < ",
    now_ms!(),
    " ORDER BY lease_until LIMIT ?2"
);

const RESOLVE: &str = concat!(
    "UPDATE claims SET state = ?4, \
       processed_utc = CASE WHEN ?4 = 'completed' THEN COALESCE(processed_utc, ",
    now_ms!(),
    ") ELSE processed_utc END, \
       lease_owner = NULL, lease_until = NULL, updated_utc = ",
    now_ms!(),
    " WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3 \
       AND state IN ('needs_attention', 'failed') AND NOT (state = 'failed' AND ?4 = 'failed') \
     RETURNING ",
    cols!()
);

const REDRIVE: &str = concat!(
    "UPDATE claims SET state = 'started', attempt = attempt + 1, lease_owner = NULL, \
       lease_until = ",
    now_ms!(),
    " - 1, handoff = 'operator_redrive', handoff_attempt = attempt + 1, updated_utc = ",
    now_ms!(),
    " WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3 \
       AND state IN ('needs_attention', 'failed') RETURNING ",
    cols!()
);

const STATE_OF: &str =
    "SELECT state FROM claims WHERE consumer = ?1 AND tenant = ?2 AND message_id = ?3";

const COUNT_OPEN: &str = concat!(
    "SELECT consumer, state, COUNT(*) AS n, \
       SUM(CASE WHEN lease_until < ",
    now_ms!(),
    " THEN 1 ELSE 0 END) AS stuck, (",
    now_ms!(),
    " - MIN(received_utc)) AS oldest_ms \
     FROM claims WHERE state IN ('started', 'needs_attention') GROUP BY consumer, state"
);

const COUNT_WINDOW: &str = "\
    SELECT consumer, COUNT(*) AS claims, \
      COALESCE(SUM(duplicate_count), 0) AS duplicates, \
      COALESCE(SUM(mismatch_count), 0) AS mismatches, \
      SUM(CASE WHEN state = 'completed' THEN 1 ELSE 0 END) AS completed, \
      SUM(CASE WHEN state = 'failed' THEN 1 ELSE 0 END) AS failed, \
      SUM(CASE WHEN resent_count > 0 THEN 1 ELSE 0 END) AS resent \
    FROM claims WHERE received_utc >= ?1 GROUP BY consumer";

/// The k-th smallest receive-to-complete time (SQLite has no percentile function).
const COMPLETE_TIME_AT: &str = "\
    SELECT processed_utc - received_utc FROM claims \
    WHERE consumer = ?1 AND state = 'completed' AND received_utc >= ?2 \
    ORDER BY 1 LIMIT 1 OFFSET ?3";

const INSERT_DEAD_LETTER: &str = concat!(
    "INSERT INTO dead_letters (consumer, reason, message_id, at_utc) VALUES (?1, ?2, ?3, ",
    now_ms!(),
    ")"
);

const COUNT_DEAD_LETTERS: &str =
    "SELECT consumer, COUNT(*) AS n FROM dead_letters WHERE at_utc >= ?1 GROUP BY consumer";

const PRUNE_DEAD_LETTERS: &str = concat!(
    "DELETE FROM dead_letters WHERE id IN (SELECT id FROM dead_letters WHERE at_utc < ",
    now_ms!(),
    " - ?1 ORDER BY at_utc LIMIT ?2)"
);

const PRUNE_DEAD_LETTERS_COUNT: &str = concat!(
    "SELECT COUNT(*) FROM dead_letters WHERE at_utc < ",
    now_ms!(),
    " - ?1"
);

const MARK_SWEEP: &str = concat!(
    "INSERT INTO claimd_heartbeats (name, instance, at_utc) VALUES ('sweeper', ?1, ",
    now_ms!(),
    ") ON CONFLICT (name) DO UPDATE SET instance = excluded.instance, at_utc = excluded.at_utc"
);

const LAST_SWEEP: &str = "SELECT at_utc FROM claimd_heartbeats WHERE name = 'sweeper'";

const NOW: &str = concat!("SELECT ", now_ms!());

/// One batch of retention; the predicate is repeated on the DELETE itself, as in the
/// PostgreSQL driver, so a row is deleted only if it is terminal when it is deleted (I7).
const PRUNE_BATCH: &str = concat!(
    "DELETE FROM claims WHERE id IN (SELECT id FROM claims \
       WHERE state IN ('completed', 'failed') AND updated_utc < ",
    now_ms!(),
    " - ?1 ORDER BY updated_utc LIMIT ?2) \
     AND state IN ('completed', 'failed') AND updated_utc < ",
    now_ms!(),
    " - ?1"
);

const PRUNE_COUNT: &str = concat!(
    "SELECT COUNT(*) FROM claims WHERE state IN ('completed', 'failed') AND updated_utc < ",
    now_ms!(),
    " - ?1"
);

/// The SQLite claim store.
#[derive(Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// One pruner at a time within the (single) process.
    prune_lock: Mutex<()>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database named by `url`.
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::from_sqlx("connect", e))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(|e| StoreError::from_sqlx("connect", e))?;
        Ok(SqliteStore {
            pool,
            prune_lock: Mutex::new(()),
        })
    }

    /// The pool, for tests and benchmarks that need raw SQL.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

fn err(query: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::from_sqlx(query, e)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn time(ms: i64) -> StoreResult<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("time {ms} ms is out of range")))
}

fn opt_time(ms: Option<i64>) -> StoreResult<Option<DateTime<Utc>>> {
    ms.map(time).transpose()
}

fn claim_from_row(row: &SqliteRow) -> StoreResult<Claim> {
    let get = |e: sqlx::Error| StoreError::Corrupt(e.to_string());
    let state: String = row.try_get("state").map_err(get)?;
    Ok(Claim {
        id: row.try_get("id").map_err(get)?,
        consumer: row.try_get("consumer").map_err(get)?,
        tenant: row.try_get("tenant").map_err(get)?,
        message_id: row.try_get("message_id").map_err(get)?,
        idem_key: row.try_get("idem_key").map_err(get)?,
        fingerprint: row.try_get("fingerprint").map_err(get)?,
        payload: row.try_get("payload").unwrap_or_default(),
        content_type: row.try_get("content_type").map_err(get)?,
        state: ClaimState::from_str(&state).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        attempt: row.try_get("attempt").map_err(get)?,
        lease_owner: row.try_get("lease_owner").map_err(get)?,
        lease_until: opt_time(row.try_get("lease_until").map_err(get)?)?,
        received_utc: time(row.try_get("received_utc").map_err(get)?)?,
        started_utc: time(row.try_get("started_utc").map_err(get)?)?,
        processed_utc: opt_time(row.try_get("processed_utc").map_err(get)?)?,
        last_error: row.try_get("last_error").map_err(get)?,
        provider_status: row.try_get("provider_status").map_err(get)?,
        provider_response: row.try_get("provider_response").map_err(get)?,
        duplicate_count: row.try_get("duplicate_count").map_err(get)?,
        mismatch_count: row.try_get("mismatch_count").map_err(get)?,
        reconciled: row.try_get("reconciled").map_err(get)?,
        resent_count: row.try_get("resent_count").map_err(get)?,
        claim_token: row.try_get("claim_token").map_err(get)?,
    })
}

fn handoff_for(row: &SqliteRow, attempt: i32) -> Option<Handoff> {
    let kind: Option<String> = row.try_get("handoff").ok().flatten();
    let at: Option<i32> = row.try_get("handoff_attempt").ok().flatten();
    kind.filter(|_| at.is_some_and(|a| a == attempt - 1))
        .and_then(|k| Handoff::parse(&k))
}

impl SqliteStore {
    async fn state_of(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<ClaimState>> {
        let state: Option<String> = sqlx::query_scalar(STATE_OF)
            .bind(consumer)
            .bind(tenant)
            .bind(message_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(err("state_of"))?;
        state
            .map(|s| ClaimState::from_str(&s).map_err(|e| StoreError::Corrupt(e.to_string())))
            .transpose()
    }

    async fn complete_time_at(
        &self,
        consumer: &str,
        since: i64,
        offset: i64,
    ) -> StoreResult<Option<f64>> {
        let v: Option<i64> = sqlx::query_scalar(COMPLETE_TIME_AT)
            .bind(consumer)
            .bind(since)
            .bind(offset)
            .fetch_optional(&self.pool)
            .await
            .map_err(err("complete_time_at"))?;
        Ok(v.map(|ms| ms as f64 / 1000.0))
    }
}

#[async_trait]
impl ClaimStore for SqliteStore {
    fn dialect(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> StoreResult<()> {
        sqlx::migrate!("migrations/sqlite").run(&self.pool).await?;
        Ok(())
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(err("ping"))?;
        Ok(())
    }

    async fn now(&self) -> StoreResult<DateTime<Utc>> {
        let ms: i64 = sqlx::query_scalar(NOW)
            .fetch_one(&self.pool)
            .await
            .map_err(err("now"))?;
        time(ms)
    }

    #[instrument(skip_all, fields(consumer = %new.consumer, tenant = %new.tenant, message_id = %new.message_id))]
    async fn claim(&self, new: &NewClaim) -> StoreResult<ClaimOutcome> {
        for _ in 0..3 {
            let inserted = sqlx::query(INSERT_CLAIM)
                .bind(&new.consumer)
                .bind(&new.tenant)
                .bind(&new.message_id)
                .bind(&new.idem_key)
                .bind(&new.fingerprint)
                .bind(&new.payload)
                .bind(&new.content_type)
                .bind(&new.worker)
                .bind(ms(new.lease))
                .bind(&new.claim_token)
                .fetch_optional(&self.pool)
                .await
                .map_err(err("insert_claim"))?;
            if let Some(row) = inserted {
                let mut claim = claim_from_row(&row)?;
                claim.payload = new.payload.clone();
                return Ok(ClaimOutcome::Created(claim));
            }
            let existing = sqlx::query(COUNT_REPEAT)
                .bind(&new.consumer)
                .bind(&new.tenant)
                .bind(&new.message_id)
                .bind(&new.fingerprint)
                .bind(&new.claim_token)
                .fetch_optional(&self.pool)
                .await
                .map_err(err("count_repeat"))?;
            if let Some(row) = existing {
                let mut claim = claim_from_row(&row)?;
                if new.inserted(&claim) {
                    // This call's own row: its commit's reply was lost (or its batch failed
                    // as a whole after committing). It is new, not a duplicate.
                    claim.payload = new.payload.clone();
                    return Ok(ClaimOutcome::Created(claim));
                }
                return Ok(if claim.fingerprint == new.fingerprint {
                    ClaimOutcome::Duplicate(claim)
                } else {
                    ClaimOutcome::Mismatch(claim)
                });
            }
        }
        Err(StoreError::Corrupt(format!(
            "claim {}/{} neither inserted nor found after 3 tries",
            new.consumer, new.message_id
        )))
    }

    async fn get(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<Claim>> {
        let row = sqlx::query(GET_CLAIM)
            .bind(consumer)
            .bind(tenant)
            .bind(message_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(err("get_claim"))?;
        row.as_ref().map(claim_from_row).transpose()
    }

    #[instrument(skip_all, fields(claim_id = id, attempt))]
    async fn settle(
        &self,
        id: i64,
        attempt: i32,
        s: &Settlement,
        event: &NewEvent<'_>,
    ) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await.map_err(err("begin"))?;
        let done = sqlx::query(SETTLE)
            .bind(id)
            .bind(attempt)
            .bind(s.state.map(|st| st.as_str()))
            .bind(s.provider_status)
            .bind(s.provider_response.as_deref())
            .bind(s.error.as_deref())
            .bind(s.reconciled)
            .bind(s.handoff_not_applied)
            .bind(s.release_lease)
            .execute(&mut *tx)
            .await
            .map_err(err("settle"))?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query(INSERT_EVENT)
            .bind(id)
            .bind(attempt)
            .bind(event.actor)
            .bind(event.action)
            .bind(event.outcome)
            .bind(event.provider_status)
            .bind(event.detail)
            .execute(&mut *tx)
            .await
            .map_err(err("insert_event"))?;
        tx.commit().await.map_err(err("commit"))?;
        Ok(true)
    }

    async fn record_event(&self, id: i64, attempt: i32, e: &NewEvent<'_>) -> StoreResult<()> {
        sqlx::query(INSERT_EVENT)
            .bind(id)
            .bind(attempt)
            .bind(e.actor)
            .bind(e.action)
            .bind(e.outcome)
            .bind(e.provider_status)
            .bind(e.detail)
            .execute(&self.pool)
            .await
            .map_err(err("insert_event"))?;
        Ok(())
    }

    async fn note_resent(&self, id: i64, attempt: i32) -> StoreResult<bool> {
        let done = sqlx::query(NOTE_RESENT)
            .bind(id)
            .bind(attempt)
            .execute(&self.pool)
            .await
            .map_err(err("note_resent"))?;
        Ok(done.rows_affected() == 1)
    }

    async fn list(&self, f: &ClaimFilter) -> StoreResult<Vec<Claim>> {
        let rows = sqlx::query(LIST_CLAIMS)
            .bind(f.state.map(|s| s.as_str()))
            .bind(f.consumer.as_deref())
            .bind(f.stuck)
            .bind(f.since.map(|t| t.timestamp_millis()))
            .bind(i64::from(f.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(err("list_claims"))?;
        rows.iter().map(claim_from_row).collect()
    }

    async fn events(&self, id: i64) -> StoreResult<Vec<ClaimEvent>> {
        let rows = sqlx::query(LIST_EVENTS)
            .bind(id)
            .fetch_all(&self.pool)
            .await
            .map_err(err("list_events"))?;
        rows.iter()
            .map(|r| {
                let get = |e: sqlx::Error| StoreError::Corrupt(e.to_string());
                Ok(ClaimEvent {
                    attempt: r.try_get("attempt").map_err(get)?,
                    at_utc: time(r.try_get("at_utc").map_err(get)?)?,
                    actor: r.try_get("actor").map_err(get)?,
                    action: r.try_get("action").map_err(get)?,
                    outcome: r.try_get("outcome").map_err(get)?,
                    provider_status: r.try_get("provider_status").map_err(get)?,
                    detail: r.try_get("detail").map_err(get)?,
                })
            })
            .collect()
    }

    #[instrument(skip(self))]
    async fn take_stale(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        expired_before: DateTime<Utc>,
    ) -> StoreResult<Vec<TakenClaim>> {
        let rows = sqlx::query(TAKE_STALE)
            .bind(consumer)
            .bind(i64::from(limit))
            .bind(owner)
            .bind(ms(lease))
            .bind(expired_before.timestamp_millis())
            .fetch_all(&self.pool)
            .await
            .map_err(err("take_stale"))?;
        rows.iter()
            .map(|row| {
                let claim = claim_from_row(row)?;
                let age_ms: i64 = row.try_get("age_ms").unwrap_or(0);
                Ok(TakenClaim {
                    handoff: handoff_for(row, claim.attempt),
                    age: Duration::from_millis(age_ms.max(0) as u64),
                    claim,
                })
            })
            .collect()
    }

    async fn peek_stale(&self, consumer: &str, limit: u32) -> StoreResult<Vec<TakenClaim>> {
        let rows = sqlx::query(PEEK_STALE)
            .bind(consumer)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(err("peek_stale"))?;
        rows.iter()
            .map(|row| {
                let mut claim = claim_from_row(row)?;
                // Shown as the attempt a takeover would make.
                claim.attempt += 1;
                let age_ms: i64 = row.try_get("age_ms").unwrap_or(0);
                let age = Duration::from_millis(age_ms.max(0) as u64);
                Ok(TakenClaim {
                    handoff: handoff_for(row, claim.attempt),
                    age,
                    claim,
                })
            })
            .collect()
    }

    async fn resolve(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        to: ClaimState,
        actor: &str,
        note: &str,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        let mut tx = self.pool.begin().await.map_err(err("begin"))?;
        let row = sqlx::query(RESOLVE)
            .bind(consumer)
            .bind(tenant)
            .bind(message_id)
            .bind(to.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(err("resolve"))?;
        let Some(row) = row else {
            drop(tx);
            return Ok(self.state_of(consumer, tenant, message_id).await?.map(Err));
        };
        let claim = claim_from_row(&row)?;
        sqlx::query(INSERT_EVENT)
            .bind(claim.id)
            .bind(claim.attempt)
            .bind(actor)
            .bind("resolve")
            .bind(to.as_str())
            .bind(None::<i32>)
            .bind(note)
            .execute(&mut *tx)
            .await
            .map_err(err("insert_event"))?;
        tx.commit().await.map_err(err("commit"))?;
        Ok(Some(Ok(claim)))
    }

    async fn redrive(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        actor: &str,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        let before = self.state_of(consumer, tenant, message_id).await?;
        let mut tx = self.pool.begin().await.map_err(err("begin"))?;
        let row = sqlx::query(REDRIVE)
            .bind(consumer)
            .bind(tenant)
            .bind(message_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err("redrive"))?;
        let Some(row) = row else {
            drop(tx);
            return Ok(self.state_of(consumer, tenant, message_id).await?.map(Err));
        };
        let claim = claim_from_row(&row)?;
        let was = before.map(|s| format!("was {s}"));
        sqlx::query(INSERT_EVENT)
            .bind(claim.id)
            .bind(claim.attempt)
            .bind(actor)
            .bind("redrive")
            .bind("started")
            .bind(None::<i32>)
            .bind(was)
            .execute(&mut *tx)
            .await
            .map_err(err("insert_event"))?;
        tx.commit().await.map_err(err("commit"))?;
        Ok(Some(Ok(claim)))
    }

    async fn counts(&self, since: Option<DateTime<Utc>>) -> StoreResult<Vec<ConsumerCounts>> {
        let since_ms = since.map(|t| t.timestamp_millis()).unwrap_or(i64::MIN);
        let mut by = CountsByConsumer::default();
        let rows = sqlx::query(COUNT_WINDOW)
            .bind(since_ms)
            .fetch_all(&self.pool)
            .await
            .map_err(err("count_window"))?;
        for r in rows {
            let get = |e: sqlx::Error| StoreError::Corrupt(e.to_string());
            let consumer: String = r.try_get("consumer").map_err(get)?;
            let c = by.get(consumer);
            let claims: i64 = r.try_get("claims").map_err(get)?;
            c.duplicates = r.try_get("duplicates").map_err(get)?;
            c.payload_mismatches = r.try_get("mismatches").map_err(get)?;
            c.received = claims + c.duplicates + c.payload_mismatches;
            c.completed = r.try_get("completed").map_err(get)?;
            c.failed = r.try_get("failed").map_err(get)?;
            c.resent = r.try_get("resent").map_err(get)?;
        }
        for c in by.iter_mut() {
            if c.completed > 0 {
                let at = |q: f64| ((c.completed as f64 * q).ceil() as i64 - 1).max(0);
                let (p50, p95) = (at(0.5), at(0.95));
                c.p50_complete_s = self.complete_time_at(&c.consumer, since_ms, p50).await?;
                c.p95_complete_s = self.complete_time_at(&c.consumer, since_ms, p95).await?;
            }
        }
        let rows = sqlx::query(COUNT_DEAD_LETTERS)
            .bind(since_ms)
            .fetch_all(&self.pool)
            .await
            .map_err(err("count_dead_letters"))?;
        for r in rows {
            let get = |e: sqlx::Error| StoreError::Corrupt(e.to_string());
            let consumer: String = r.try_get("consumer").map_err(get)?;
            let c = by.get(consumer);
            c.dead_lettered = r.try_get("n").map_err(get)?;
        }
        by.add_open(self.open_counts().await?);
        Ok(by.into_vec())
    }

    async fn open_counts(&self) -> StoreResult<Vec<ConsumerCounts>> {
        let mut by = CountsByConsumer::default();
        let rows = sqlx::query(COUNT_OPEN)
            .fetch_all(&self.pool)
            .await
            .map_err(err("count_open"))?;
        for r in rows {
            let get = |e: sqlx::Error| StoreError::Corrupt(e.to_string());
            let consumer: String = r.try_get("consumer").map_err(get)?;
            let state: String = r.try_get("state").map_err(get)?;
            let n: i64 = r.try_get("n").map_err(get)?;
            let c = by.get(consumer);
            if state == "started" {
                c.started = n;
                c.stuck = r.try_get("stuck").map_err(get)?;
                let oldest: Option<i64> = r.try_get("oldest_ms").map_err(get)?;
                c.oldest_started_age_s = oldest.map(|ms| ms as f64 / 1000.0);
            } else {
                c.needs_attention = n;
            }
        }
        Ok(by.into_vec())
    }

    async fn record_dead_letter(
        &self,
        consumer: &str,
        reason: &str,
        message_id: Option<&str>,
    ) -> StoreResult<()> {
        sqlx::query(INSERT_DEAD_LETTER)
            .bind(consumer)
            .bind(reason)
            .bind(message_id.map(super::printable_id))
            .execute(&self.pool)
            .await
            .map_err(err("insert_dead_letter"))?;
        Ok(())
    }

    async fn mark_sweep(&self, instance: &str) -> StoreResult<()> {
        sqlx::query(MARK_SWEEP)
            .bind(instance)
            .execute(&self.pool)
            .await
            .map_err(err("mark_sweep"))?;
        Ok(())
    }

    async fn last_sweep(&self) -> StoreResult<Option<DateTime<Utc>>> {
        let ms: Option<i64> = sqlx::query_scalar(LAST_SWEEP)
            .fetch_optional(&self.pool)
            .await
            .map_err(err("last_sweep"))?;
        opt_time(ms)
    }

    async fn prune(&self, keep: Duration, batch: u32, dry_run: bool) -> StoreResult<PruneResult> {
        if dry_run {
            let n: i64 = sqlx::query_scalar(PRUNE_COUNT)
                .bind(ms(keep))
                .fetch_one(&self.pool)
                .await
                .map_err(err("prune_count"))?;
            let d: i64 = sqlx::query_scalar(PRUNE_DEAD_LETTERS_COUNT)
                .bind(ms(keep))
                .fetch_one(&self.pool)
                .await
                .map_err(err("prune_dead_letters_count"))?;
            return Ok(PruneResult {
                deleted: n.max(0) as u64,
                dead_letters_deleted: d.max(0) as u64,
                ..Default::default()
            });
        }
        let Ok(_guard) = self.prune_lock.try_lock() else {
            return Ok(PruneResult {
                skipped_locked: true,
                ..Default::default()
            });
        };
        let mut result = PruneResult::default();
        loop {
            let done = sqlx::query(PRUNE_BATCH)
                .bind(ms(keep))
                .bind(i64::from(batch))
                .execute(&self.pool)
                .await
                .map_err(err("prune_batch"))?;
            result.batches += 1;
            result.deleted += done.rows_affected();
            if done.rows_affected() < u64::from(batch) {
                break;
            }
        }
        loop {
            let done = sqlx::query(PRUNE_DEAD_LETTERS)
                .bind(ms(keep))
                .bind(i64::from(batch))
                .execute(&self.pool)
                .await
                .map_err(err("prune_dead_letters"))?;
            result.dead_letters_deleted += done.rows_affected();
            if done.rows_affected() < u64::from(batch) {
                return Ok(result);
            }
        }
    }
}
