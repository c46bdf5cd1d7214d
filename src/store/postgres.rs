//! PostgreSQL driver: many `claimd run` processes share one database. The unique index
//! arbitrates claims, `FOR UPDATE SKIP LOCKED` splits stale claims between sweepers, and an
//! advisory lock lets one instance prune at a time.

use super::{
    ClaimEvent, ClaimFilter, ClaimOutcome, ClaimStore, ConsumerCounts, CountsByConsumer, Handoff,
    NewEvent, PruneResult, SettleItem, Settlement, StoreError, StoreResult, TakenClaim,
};
use crate::claim::{Claim, ClaimState, NewClaim};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgPool, Row};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::instrument;

/// Columns of a claim, without the payload (lists and intake answers do not need it).
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
     content_type, lease_owner, lease_until, claim_token) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + $9 * interval '1 millisecond', \
             NULLIF($10, '')) \
     ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING ",
    cols!()
);

/// Counts a repeat delivery, unless the row is this call's own (its token: a commit whose
/// reply was lost), which is no repeat.
const COUNT_REPEAT: &str = concat!(
    "UPDATE claims SET \
       duplicate_count = duplicate_count + CASE WHEN claim_token = NULLIF($5, '') THEN 0 \
                                                WHEN fingerprint = $4 THEN 1 ELSE 0 END, \
       mismatch_count = mismatch_count + CASE WHEN claim_token = NULLIF($5, '') THEN 0 \
                                              WHEN fingerprint = $4 THEN 0 ELSE 1 END \
     WHERE consumer = $1 AND tenant = $2 AND message_id = $3 RETURNING ",
    cols!()
);

const GET_CLAIM: &str = concat!(
    "SELECT ",
    cols!(),
    ", payload FROM claims WHERE consumer = $1 AND tenant = $2 AND message_id = $3"
);

/// Fenced settle and its history line in one statement (I2).
const SETTLE: &str = "\
    WITH s AS ( \
      UPDATE claims SET \
        state = COALESCE($3::text, state), \
        provider_status = COALESCE($4, provider_status), \
        provider_response = COALESCE($5, provider_response), \
        last_error = COALESCE($6, last_error), \
        reconciled = reconciled OR $7, \
        handoff = CASE WHEN $8 THEN 'not_applied' ELSE handoff END, \
        handoff_attempt = CASE WHEN $8 THEN attempt ELSE handoff_attempt END, \
        processed_utc = CASE WHEN $3::text = 'completed' THEN now() ELSE processed_utc END, \
        lease_owner = CASE WHEN $3::text IS NULL OR $3::text = 'started' THEN lease_owner END, \
        lease_until = CASE WHEN $9 THEN now() \
                           WHEN $3::text IS NULL OR $3::text = 'started' THEN lease_until END, \
        updated_utc = now() \
      WHERE id = $1 AND attempt = $2 AND state = 'started' \
      RETURNING id) \
    INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, detail) \
    SELECT id, $2, $10, $11, $12, $13, $14 FROM s";

/// Many claims in one statement (committed together, before any effect: I1). Rows that
/// conflict are skipped here and looked at one by one afterwards.
const INSERT_CLAIMS: &str = concat!(
    "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
     content_type, lease_owner, lease_until, claim_token) \
     SELECT c, t, m, k, f, p, ct, w, now() + l * interval '1 millisecond', NULLIF(tok, '') \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], \
                 $7::text[], $8::text[], $9::bigint[], $10::text[]) \
       AS u(c, t, m, k, f, p, ct, w, l, tok) \
     ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING ",
    cols!()
);

/// Many fenced settles and their history lines in one statement: each row is updated only
/// `WHERE id = u.id AND attempt = u.attempt AND state = 'started'` (I2), as in [`SETTLE`].
const SETTLE_MANY: &str = "\
    WITH u AS ( \
      SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::int[], $5::text[], \
        $6::text[], $7::bool[], $8::bool[], $9::bool[], $10::text[], $11::text[], $12::text[], \
        $13::int[], $14::text[]) \
      AS u(id, attempt, st, pstatus, presp, err, rec, hoff, rel, actor, action, outcome, \
           estatus, detail)), \
    s AS ( \
      UPDATE claims c SET \
        state = COALESCE(u.st, c.state), \
        provider_status = COALESCE(u.pstatus, c.provider_status), \
        provider_response = COALESCE(u.presp, c.provider_response), \
        last_error = COALESCE(u.err, c.last_error), \
        reconciled = c.reconciled OR u.rec, \
        handoff = CASE WHEN u.hoff THEN 'not_applied' ELSE c.handoff END, \
        handoff_attempt = CASE WHEN u.hoff THEN c.attempt ELSE c.handoff_attempt END, \
        processed_utc = CASE WHEN u.st = 'completed' THEN now() ELSE c.processed_utc END, \
        lease_owner = CASE WHEN u.st IS NULL OR u.st = 'started' THEN c.lease_owner END, \
        lease_until = CASE WHEN u.rel THEN now() \
                           WHEN u.st IS NULL OR u.st = 'started' THEN c.lease_until END, \
        updated_utc = now() \
      FROM u WHERE c.id = u.id AND c.attempt = u.attempt AND c.state = 'started' \
      RETURNING c.id, u.attempt, u.actor, u.action, u.outcome, u.estatus, u.detail) \
    INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, detail) \
    SELECT id, attempt, actor, action, outcome, estatus, detail FROM s RETURNING claim_id";

const INSERT_EVENT: &str = "\
    INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, detail) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

const NOTE_RESENT: &str = "\
    UPDATE claims SET resent_count = resent_count + 1 \
    WHERE id = $1 AND attempt = $2 AND state = 'started'";

const LIST_CLAIMS: &str = concat!(
    "SELECT ",
    cols!(),
    " FROM claims \
     WHERE ($1::text IS NULL OR state = $1) \
       AND ($2::text IS NULL OR consumer = $2) \
       AND (NOT $3 OR (state = 'started' AND lease_until < now())) \
       AND ($4::timestamptz IS NULL OR received_utc >= $4) \
     ORDER BY received_utc DESC, id DESC LIMIT $5"
);

const LIST_EVENTS: &str = "\
    SELECT attempt, at_utc, actor, action, outcome, provider_status, detail \
    FROM claim_events WHERE claim_id = $1 ORDER BY id";

/// Takeover: bump the fencing token and renew the lease in the same statement. The batch is
/// chosen once, in a materialised CTE (a `WHERE id IN (SELECT ... LIMIT n FOR UPDATE)`
/// subquery may be re-scanned by the plan and take more than `n`), and the predicate is
/// repeated on the UPDATE so a row settled meanwhile is never taken.
pub const TAKE_STALE: &str = concat!(
    "WITH stale AS MATERIALIZED ( \
       SELECT id AS stale_id FROM claims \
       WHERE consumer = $1 AND state = 'started' AND lease_until < LEAST(now(), $5) \
       ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED) \
     UPDATE claims SET attempt = attempt + 1, lease_owner = $3, \
       lease_until = now() + $4 * interval '1 millisecond', started_utc = now(), \
       updated_utc = now() \
     FROM stale WHERE id = stale_id \
       AND state = 'started' AND lease_until < LEAST(now(), $5) \
     RETURNING ",
    cols!(),
    ", payload, EXTRACT(EPOCH FROM now() - received_utc)::float8 AS age_s"
);

const PEEK_STALE: &str = concat!(
    "SELECT ",
    cols!(),
    ", EXTRACT(EPOCH FROM now() - received_utc)::float8 AS age_s \
     FROM claims WHERE consumer = $1 AND state = 'started' AND lease_until < now() \
     ORDER BY lease_until LIMIT $2"
);

const LOCK_CLAIM: &str = concat!(
    "SELECT ",
    cols!(),
    " FROM claims WHERE consumer = $1 AND tenant = $2 AND message_id = $3 FOR UPDATE"
);

const RESOLVE: &str = concat!(
    "UPDATE claims SET state = $2, \
       processed_utc = CASE WHEN $2 = 'completed' THEN COALESCE(processed_utc, now()) \
                            ELSE processed_utc END, \
       lease_owner = NULL, lease_until = NULL, updated_utc = now() \
     WHERE id = $1 AND state IN ('needs_attention', 'failed') RETURNING ",
    cols!()
);

const REDRIVE: &str = concat!(
    "UPDATE claims SET state = 'started', attempt = attempt + 1, lease_owner = NULL, \
       lease_until = now() - interval '1 millisecond', handoff = 'operator_redrive', \
       handoff_attempt = attempt + 1, updated_utc = now() \
     WHERE id = $1 AND state IN ('needs_attention', 'failed') RETURNING ",
    cols!()
);

/// Open work, over all time: small sets served by the partial indexes.
pub const COUNT_OPEN: &str = "\
    SELECT consumer, state, COUNT(*) AS n, \
      COUNT(*) FILTER (WHERE lease_until < now()) AS stuck, \
      EXTRACT(EPOCH FROM now() - MIN(received_utc))::float8 AS oldest_s \
    FROM claims WHERE state IN ('started', 'needs_attention') \
    GROUP BY consumer, state";

/// Throughput figures over the report window.
pub const COUNT_WINDOW: &str = "\
    SELECT consumer, COUNT(*) AS claims, \
      COALESCE(SUM(duplicate_count), 0)::bigint AS duplicates, \
      COALESCE(SUM(mismatch_count), 0)::bigint AS mismatches, \
      COUNT(*) FILTER (WHERE state = 'completed') AS completed, \
      COUNT(*) FILTER (WHERE state = 'failed') AS failed, \
      COUNT(*) FILTER (WHERE resent_count > 0) AS resent, \
      percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM processed_utc - received_utc)) \
        FILTER (WHERE state = 'completed') AS p50, \
      percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM processed_utc - received_utc)) \
        FILTER (WHERE state = 'completed') AS p95 \
    FROM claims WHERE received_utc >= $1 GROUP BY consumer";

const INSERT_DEAD_LETTER: &str =
    "INSERT INTO dead_letters (consumer, reason, message_id) VALUES ($1, $2, $3)";

const COUNT_DEAD_LETTERS: &str = "\
    SELECT consumer, COUNT(*) AS n FROM dead_letters WHERE at_utc >= $1 GROUP BY consumer";

const PRUNE_DEAD_LETTERS: &str = "\
    DELETE FROM dead_letters WHERE id IN ( \
      SELECT id FROM dead_letters WHERE at_utc < now() - $1 * interval '1 millisecond' \
      ORDER BY at_utc LIMIT $2)";

const PRUNE_DEAD_LETTERS_COUNT: &str = "\
    SELECT COUNT(*) FROM dead_letters WHERE at_utc < now() - $1 * interval '1 millisecond'";

const MARK_SWEEP: &str = "\
    INSERT INTO claimd_heartbeats (name, instance, at_utc) VALUES ('sweeper', $1, now()) \
    ON CONFLICT (name) DO UPDATE SET instance = EXCLUDED.instance, at_utc = EXCLUDED.at_utc";

const LAST_SWEEP: &str = "SELECT at_utc FROM claimd_heartbeats WHERE name = 'sweeper'";

/// Key of the advisory lock that serialises retention across instances ("claimd-prune").
const PRUNE_LOCK_KEY: i64 = 0x636c_6169_6d64_7072;

const TRY_PRUNE_LOCK: &str = "SELECT pg_try_advisory_lock($1)";

/// One batch of retention. The batch is chosen once, in a materialised CTE (a
/// `WHERE id IN (SELECT ... LIMIT n FOR UPDATE)` subquery may be re-scanned by the plan and
/// delete more than `n`), locking its rows and skipping those an operator holds. The
/// predicate stands on the DELETE too: under READ COMMITTED a row another transaction changed
/// meanwhile (an operator's redrive of an old `failed` claim) must be terminal when it is
/// deleted, not only when it was chosen (I7).
const PRUNE_BATCH: &str = "\
    WITH batch AS MATERIALIZED ( \
      SELECT id AS batch_id FROM claims \
      WHERE state IN ('completed', 'failed') \
        AND updated_utc < now() - $1 * interval '1 millisecond' \
      ORDER BY updated_utc LIMIT $2 FOR UPDATE SKIP LOCKED) \
    DELETE FROM claims USING batch WHERE id = batch_id \
      AND state IN ('completed', 'failed') \
      AND updated_utc < now() - $1 * interval '1 millisecond'";

const PRUNE_COUNT: &str = "\
    SELECT COUNT(*) FROM claims \
    WHERE state IN ('completed', 'failed') AND updated_utc < now() - $1 * interval '1 millisecond'";

/// The PostgreSQL claim store.
///
/// Unless built with [`PgStore::unbatched`], concurrent [`ClaimStore::claim`] and
/// [`ClaimStore::settle`] calls are coalesced: a few background tasks take whatever calls are
/// waiting and send them as one statement ([`INSERT_CLAIMS`], [`SETTLE_MANY`]), so under load
/// one commit serves many messages. Each caller still gets its own answer only after the
/// statement carrying its row has committed (I1), and each settle stays fenced on its own
/// `attempt` (I2). With one call waiting, the one-row statement is used, so an idle worker
/// adds no delay.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    batch: Option<Arc<Batcher>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("pool", &self.pool)
            .field("batched", &self.batch.is_some())
            .finish()
    }
}

/// Background tasks per kind of batched statement (each holds at most one connection).
const BATCH_WORKERS: usize = 4;
/// Most rows in one batched statement.
const MAX_BATCH: usize = 256;

/// Where `claim` and `settle` calls wait to be sent together.
struct Batcher {
    claims: mpsc::Sender<PendingClaim>,
    settles: mpsc::Sender<PendingSettle>,
}

struct PendingClaim {
    new: NewClaim,
    done: oneshot::Sender<StoreResult<ClaimOutcome>>,
}

struct PendingSettle {
    id: i64,
    attempt: i32,
    settlement: Settlement,
    actor: String,
    action: String,
    outcome: String,
    provider_status: Option<i32>,
    detail: Option<String>,
    done: oneshot::Sender<StoreResult<bool>>,
}

impl PendingSettle {
    fn item(&self) -> SettleItem<'_> {
        SettleItem {
            id: self.id,
            attempt: self.attempt,
            settlement: self.settlement.clone(),
            event: self.event(),
        }
    }

    fn event(&self) -> NewEvent<'_> {
        NewEvent {
            actor: &self.actor,
            action: &self.action,
            outcome: &self.outcome,
            provider_status: self.provider_status,
            detail: self.detail.as_deref(),
        }
    }
}

/// Waits for one call, then takes every other call already waiting (up to [`MAX_BATCH`]).
async fn next_batch<T>(rx: &Mutex<mpsc::Receiver<T>>) -> Option<Vec<T>> {
    let mut rx = rx.lock().await;
    let first = rx.recv().await?;
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(p) => batch.push(p),
            Err(_) => break,
        }
    }
    Some(batch)
}

async fn claim_worker(store: PgStore, rx: Arc<Mutex<mpsc::Receiver<PendingClaim>>>) {
    while let Some(mut batch) = next_batch(&rx).await {
        if batch.len() == 1 {
            let p = batch.pop().expect("one");
            let _ = p.done.send(store.claim_one(&p.new).await);
            continue;
        }
        let news: Vec<&NewClaim> = batch.iter().map(|p| &p.new).collect();
        match store.insert_batch(&news).await {
            Ok(created) => {
                for (p, c) in batch.into_iter().zip(created) {
                    match c {
                        Some(c) => {
                            let _ = p.done.send(Ok(ClaimOutcome::Created(c)));
                        }
                        // A repeat: counted one by one, without holding up the others.
                        None => {
                            let s = store.clone();
                            tokio::spawn(async move {
                                let _ = p.done.send(s.claim_one(&p.new).await);
                            });
                        }
                    }
                }
            }
            // The statement failed. It may still have committed (the connection was cut after
            // the commit): one by one, each with its own token, so a row the batch did insert
            // is recognised as its caller's new claim, not taken for a duplicate.
            Err(_) => {
                for p in batch {
                    let _ = p.done.send(store.claim_one(&p.new).await);
                }
            }
        }
    }
}

async fn settle_worker(store: PgStore, rx: Arc<Mutex<mpsc::Receiver<PendingSettle>>>) {
    while let Some(mut batch) = next_batch(&rx).await {
        // One statement per round of distinct ids (a repeated id waits for the next round).
        while !batch.is_empty() {
            let mut seen = std::collections::HashSet::new();
            let (round, rest): (Vec<_>, Vec<_>) =
                batch.into_iter().partition(|p| seen.insert(p.id));
            batch = rest;
            if round.len() > 1 {
                let items: Vec<SettleItem<'_>> = round.iter().map(PendingSettle::item).collect();
                if let Ok(done) = store.settle_batch(&items).await {
                    for (p, d) in round.into_iter().zip(done) {
                        let _ = p.done.send(Ok(d));
                    }
                    continue;
                }
            }
            // One call, or the batch failed as a whole (nothing committed): one by one.
            for p in round {
                let r = store
                    .settle_one(p.id, p.attempt, &p.settlement, &p.event())
                    .await;
                let _ = p.done.send(r);
            }
        }
    }
}

impl PgStore {
    /// Connects a pool to `url`, with concurrent claims and settles coalesced (see
    /// [`PgStore`]). Must be called inside a Tokio runtime (it starts the batching tasks).
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::from_sqlx("connect", e))?
            .application_name("claimd");
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options);
        let plain = PgStore { pool, batch: None };
        let (claims, claims_rx) = mpsc::channel(MAX_BATCH * BATCH_WORKERS);
        let (settles, settles_rx) = mpsc::channel(MAX_BATCH * BATCH_WORKERS);
        let (claims_rx, settles_rx) = (
            Arc::new(Mutex::new(claims_rx)),
            Arc::new(Mutex::new(settles_rx)),
        );
        for _ in 0..BATCH_WORKERS {
            tokio::spawn(claim_worker(plain.clone(), claims_rx.clone()));
            tokio::spawn(settle_worker(plain.clone(), settles_rx.clone()));
        }
        Ok(PgStore {
            batch: Some(Arc::new(Batcher { claims, settles })),
            ..plain
        })
    }

    /// The same store with every call sent on its own (one statement per claim or settle).
    pub fn unbatched(self) -> Self {
        PgStore {
            batch: None,
            ..self
        }
    }

    /// The pool, for tests and benchmarks that need raw SQL.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Inserts `new` in one statement; per item, the new claim, or `None` when the key was
    /// already claimed (before, or earlier in this batch).
    async fn insert_batch(&self, new: &[&NewClaim]) -> StoreResult<Vec<Option<Claim>>> {
        let col = |f: fn(&NewClaim) -> &str| new.iter().map(|n| f(n)).collect::<Vec<&str>>();
        let rows = sqlx::query(INSERT_CLAIMS)
            .bind(col(|n| &n.consumer))
            .bind(col(|n| &n.tenant))
            .bind(col(|n| &n.message_id))
            .bind(col(|n| &n.idem_key))
            .bind(col(|n| &n.fingerprint))
            .bind(
                new.iter()
                    .map(|n| n.payload.as_slice())
                    .collect::<Vec<&[u8]>>(),
            )
            .bind(col(|n| &n.content_type))
            .bind(col(|n| &n.worker))
            .bind(new.iter().map(|n| ms(n.lease)).collect::<Vec<i64>>())
            .bind(col(|n| &n.claim_token))
            .fetch_all(&self.pool)
            .await
            .map_err(err("insert_claims"))?;
        let mut created: HashMap<(String, String, String), Claim> = rows
            .iter()
            .map(|r| {
                claim_from_row(r).map(|c| {
                    (
                        (c.consumer.clone(), c.tenant.clone(), c.message_id.clone()),
                        c,
                    )
                })
            })
            .collect::<StoreResult<_>>()?;
        Ok(new
            .iter()
            .map(|n| {
                created
                    .remove(&(n.consumer.clone(), n.tenant.clone(), n.message_id.clone()))
                    .map(|mut c| {
                        c.payload = n.payload.clone();
                        c
                    })
            })
            .collect())
    }

    /// One statement for many fenced settles (ids distinct).
    async fn settle_batch(&self, items: &[SettleItem<'_>]) -> StoreResult<Vec<bool>> {
        let state = |i: &SettleItem<'_>| i.settlement.state.map(|st| st.as_str());
        let rows: Vec<i64> = sqlx::query_scalar(SETTLE_MANY)
            .bind(items.iter().map(|i| i.id).collect::<Vec<_>>())
            .bind(items.iter().map(|i| i.attempt).collect::<Vec<_>>())
            .bind(items.iter().map(state).collect::<Vec<_>>())
            .bind(
                items
                    .iter()
                    .map(|i| i.settlement.provider_status)
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|i| i.settlement.provider_response.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|i| i.settlement.error.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|i| i.settlement.reconciled)
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|i| i.settlement.handoff_not_applied)
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|i| i.settlement.release_lease)
                    .collect::<Vec<_>>(),
            )
            .bind(items.iter().map(|i| i.event.actor).collect::<Vec<_>>())
            .bind(items.iter().map(|i| i.event.action).collect::<Vec<_>>())
            .bind(items.iter().map(|i| i.event.outcome).collect::<Vec<_>>())
            .bind(
                items
                    .iter()
                    .map(|i| i.event.provider_status)
                    .collect::<Vec<_>>(),
            )
            .bind(items.iter().map(|i| i.event.detail).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await
            .map_err(err("settle_many"))?;
        let done: std::collections::HashSet<i64> = rows.into_iter().collect();
        Ok(items.iter().map(|i| done.contains(&i.id)).collect())
    }

    /// One claim, one statement (plus the repeat count for a duplicate).
    async fn claim_one(&self, new: &NewClaim) -> StoreResult<ClaimOutcome> {
        // Each statement autocommits: the claim is committed alone (I1). A row pruned between
        // the two statements makes the repeat-count miss; the loop then claims it afresh.
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

    /// One fenced settle, one statement.
    async fn settle_one(
        &self,
        id: i64,
        attempt: i32,
        s: &Settlement,
        event: &NewEvent<'_>,
    ) -> StoreResult<bool> {
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
            .bind(event.actor)
            .bind(event.action)
            .bind(event.outcome)
            .bind(event.provider_status)
            .bind(event.detail)
            .execute(&self.pool)
            .await
            .map_err(err("settle"))?;
        Ok(done.rows_affected() == 1)
    }
}

fn err(query: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::from_sqlx(query, e)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn claim_from_row(row: &PgRow) -> StoreResult<Claim> {
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
        lease_until: row.try_get("lease_until").map_err(get)?,
        received_utc: row.try_get("received_utc").map_err(get)?,
        started_utc: row.try_get("started_utc").map_err(get)?,
        processed_utc: row.try_get("processed_utc").map_err(get)?,
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

/// The hand-off the previous attempt left, if it was the attempt just before `attempt`.
fn handoff_for(row: &PgRow, attempt: i32) -> Option<Handoff> {
    let kind: Option<String> = row.try_get("handoff").ok().flatten();
    let at: Option<i32> = row.try_get("handoff_attempt").ok().flatten();
    kind.filter(|_| at.is_some_and(|a| a == attempt - 1))
        .and_then(|k| Handoff::parse(&k))
}

#[async_trait]
impl ClaimStore for PgStore {
    fn dialect(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> StoreResult<()> {
        sqlx::migrate!("migrations/postgres")
            .run(&self.pool)
            .await?;
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
        sqlx::query_scalar("SELECT now()")
            .fetch_one(&self.pool)
            .await
            .map_err(err("now"))
    }

    #[instrument(skip_all, fields(consumer = %new.consumer, tenant = %new.tenant, message_id = %new.message_id))]
    async fn claim(&self, new: &NewClaim) -> StoreResult<ClaimOutcome> {
        if let Some(b) = &self.batch {
            let (done, answer) = oneshot::channel();
            let p = PendingClaim {
                new: new.clone(),
                done,
            };
            if b.claims.send(p).await.is_ok()
                && let Ok(r) = answer.await
            {
                return r;
            }
        }
        self.claim_one(new).await
    }

    async fn claim_many(&self, new: &[NewClaim]) -> StoreResult<Vec<ClaimOutcome>> {
        let refs: Vec<&NewClaim> = new.iter().collect();
        let created = if new.len() > 1 {
            self.insert_batch(&refs).await?
        } else {
            vec![None; new.len()]
        };
        let mut out = Vec::with_capacity(new.len());
        for (n, c) in new.iter().zip(created) {
            out.push(match c {
                Some(c) => ClaimOutcome::Created(c),
                None => self.claim_one(n).await?,
            });
        }
        Ok(out)
    }

    async fn settle_many(&self, items: &[SettleItem<'_>]) -> StoreResult<Vec<bool>> {
        if items.len() <= 1 {
            let mut out = Vec::new();
            for i in items {
                out.push(
                    self.settle_one(i.id, i.attempt, &i.settlement, &i.event)
                        .await?,
                );
            }
            return Ok(out);
        }
        self.settle_batch(items).await
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
        if let Some(b) = &self.batch {
            let (done, answer) = oneshot::channel();
            let p = PendingSettle {
                id,
                attempt,
                settlement: s.clone(),
                actor: event.actor.to_string(),
                action: event.action.to_string(),
                outcome: event.outcome.to_string(),
                provider_status: event.provider_status,
                detail: event.detail.map(str::to_string),
                done,
            };
            if b.settles.send(p).await.is_ok()
                && let Ok(r) = answer.await
            {
                return r;
            }
        }
        self.settle_one(id, attempt, s, event).await
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
            .bind(f.since)
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
                    at_utc: r.try_get("at_utc").map_err(get)?,
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
            .bind(expired_before)
            .fetch_all(&self.pool)
            .await
            .map_err(err("take_stale"))?;
        rows.iter()
            .map(|row| {
                let claim = claim_from_row(row)?;
                let age_s: f64 = row.try_get("age_s").unwrap_or(0.0);
                Ok(TakenClaim {
                    handoff: handoff_for(row, claim.attempt),
                    age: Duration::from_secs_f64(age_s.max(0.0)),
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
                let age_s: f64 = row.try_get("age_s").unwrap_or(0.0);
                let age = Duration::from_secs_f64(age_s.max(0.0));
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
        let Some(row) = sqlx::query(LOCK_CLAIM)
            .bind(consumer)
            .bind(tenant)
            .bind(message_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err("lock_claim"))?
        else {
            return Ok(None);
        };
        let current = claim_from_row(&row)?;
        if !matches!(
            current.state,
            ClaimState::NeedsAttention | ClaimState::Failed
        ) || !current.state.can_move_to(to)
        {
            return Ok(Some(Err(current.state)));
        }
        let row = sqlx::query(RESOLVE)
            .bind(current.id)
            .bind(to.as_str())
            .fetch_one(&mut *tx)
            .await
            .map_err(err("resolve"))?;
        sqlx::query(INSERT_EVENT)
            .bind(current.id)
            .bind(current.attempt)
            .bind(actor)
            .bind("resolve")
            .bind(to.as_str())
            .bind(None::<i32>)
            .bind(note)
            .execute(&mut *tx)
            .await
            .map_err(err("insert_event"))?;
        tx.commit().await.map_err(err("commit"))?;
        Ok(Some(Ok(claim_from_row(&row)?)))
    }

    async fn redrive(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        actor: &str,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        let mut tx = self.pool.begin().await.map_err(err("begin"))?;
        let Some(row) = sqlx::query(LOCK_CLAIM)
            .bind(consumer)
            .bind(tenant)
            .bind(message_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err("lock_claim"))?
        else {
            return Ok(None);
        };
        let current = claim_from_row(&row)?;
        if !matches!(
            current.state,
            ClaimState::NeedsAttention | ClaimState::Failed
        ) {
            return Ok(Some(Err(current.state)));
        }
        let row = sqlx::query(REDRIVE)
            .bind(current.id)
            .fetch_one(&mut *tx)
            .await
            .map_err(err("redrive"))?;
        let claim = claim_from_row(&row)?;
        sqlx::query(INSERT_EVENT)
            .bind(claim.id)
            .bind(claim.attempt)
            .bind(actor)
            .bind("redrive")
            .bind("started")
            .bind(None::<i32>)
            .bind(Some(format!("was {}", current.state)))
            .execute(&mut *tx)
            .await
            .map_err(err("insert_event"))?;
        tx.commit().await.map_err(err("commit"))?;
        Ok(Some(Ok(claim)))
    }

    async fn counts(&self, since: Option<DateTime<Utc>>) -> StoreResult<Vec<ConsumerCounts>> {
        let mut by = CountsByConsumer::default();
        let since = since.unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
        let rows = sqlx::query(COUNT_WINDOW)
            .bind(since)
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
            c.p50_complete_s = r.try_get("p50").map_err(get)?;
            c.p95_complete_s = r.try_get("p95").map_err(get)?;
        }
        let rows = sqlx::query(COUNT_DEAD_LETTERS)
            .bind(since)
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
                c.oldest_started_age_s = r.try_get("oldest_s").map_err(get)?;
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
        sqlx::query_scalar(LAST_SWEEP)
            .fetch_optional(&self.pool)
            .await
            .map_err(err("last_sweep"))
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
        // The session lock lives on this one connection, taken out of the pool: it can never go
        // back to the pool still holding the lock (an unlock that failed, a task dropped
        // mid-prune), because dropping a detached connection closes it, and PostgreSQL frees a
        // session's locks when the session ends.
        let mut conn = self.pool.acquire().await.map_err(err("acquire"))?.detach();
        let locked: bool = sqlx::query_scalar(TRY_PRUNE_LOCK)
            .bind(PRUNE_LOCK_KEY)
            .fetch_one(&mut conn)
            .await
            .map_err(err("try_prune_lock"))?;
        if !locked {
            return Ok(PruneResult {
                skipped_locked: true,
                ..Default::default()
            });
        }
        let mut result = PruneResult::default();
        let outcome = async {
            loop {
                // Each batch commits on its own so new claims are never blocked for long.
                let done = sqlx::query(PRUNE_BATCH)
                    .bind(ms(keep))
                    .bind(i64::from(batch))
                    .execute(&mut conn)
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
                    .execute(&mut conn)
                    .await
                    .map_err(err("prune_dead_letters"))?;
                result.dead_letters_deleted += done.rows_affected();
                if done.rows_affected() < u64::from(batch) {
                    return Ok::<(), StoreError>(());
                }
            }
        }
        .await;
        // Closing the session releases the lock whether or not an unlock would have worked.
        let _ = sqlx::Connection::close(conn).await;
        outcome.map(|()| result)
    }
}
