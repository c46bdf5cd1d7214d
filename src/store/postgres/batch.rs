//! PostgreSQL's batched writes: concurrent `claim` and `settle` calls wait here briefly and a
//! few background tasks send whatever is waiting as one multi-row statement
//! ([`INSERT_CLAIMS`], [`SETTLE_MANY`]), so under load one commit serves many messages. Each
//! caller still gets its own answer only after the statement carrying its row has committed
//! (I1), and each settle stays fenced on its own `attempt` (I2). With one call waiting, the
//! one-row statement of the common body is used, so an idle worker adds no delay.

use super::PgStore;
use crate::claim::{Claim, NewClaim};
use crate::store::rows::claim_from_row;
use crate::store::sql_store::ms;
use crate::store::{ClaimOutcome, NewEvent, SettleItem, Settlement, StoreError, StoreResult};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};

/// Many claims in one statement (committed together, before any effect: I1). Rows that
/// conflict are skipped here and looked at one by one afterwards.
pub(super) const INSERT_CLAIMS: &str = concat!(
    "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
     content_type, lease_owner, lease_until, claim_token, handoff, handoff_attempt) \
     SELECT c, t, m, k, f, p, ct, w, now() + l * interval '1 millisecond', NULLIF(tok, ''), \
            CASE WHEN nc THEN 'not_called' END, CASE WHEN nc THEN 1 END \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], \
                 $7::text[], $8::text[], $9::bigint[], $10::text[], $11::bool[]) \
       AS u(c, t, m, k, f, p, ct, w, l, tok, nc) \
     ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING ",
    claim_cols!()
);

/// Many fenced settles and their history lines in one statement: each row is updated only
/// `WHERE id = u.id AND attempt = u.attempt AND state = 'started'` (I2), as in [`SETTLE`].
pub(super) const SETTLE_MANY: &str = "\
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

/// Background tasks per kind of batched statement (each holds at most one connection).
pub(super) const BATCH_WORKERS: usize = 4;
/// Most rows in one batched statement.
pub(super) const MAX_BATCH: usize = 256;

/// Where `claim` and `settle` calls wait to be sent together.
pub(super) struct Batcher {
    pub(super) claims: mpsc::Sender<PendingClaim>,
    pub(super) settles: mpsc::Sender<PendingSettle>,
}

pub(super) struct PendingClaim {
    pub(super) new: NewClaim,
    pub(super) done: oneshot::Sender<StoreResult<ClaimOutcome>>,
}

pub(super) struct PendingSettle {
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
    /// A settle to send with others; `done` gets its answer.
    pub(super) fn new(
        id: i64,
        attempt: i32,
        s: &Settlement,
        event: &NewEvent<'_>,
        done: oneshot::Sender<StoreResult<bool>>,
    ) -> Self {
        PendingSettle {
            id,
            attempt,
            settlement: s.clone(),
            actor: event.actor.to_string(),
            action: event.action.to_string(),
            outcome: event.outcome.to_string(),
            provider_status: event.provider_status,
            detail: event.detail.map(str::to_string),
            done,
        }
    }

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

pub(super) async fn claim_worker(store: PgStore, rx: Arc<Mutex<mpsc::Receiver<PendingClaim>>>) {
    while let Some(mut batch) = next_batch(&rx).await {
        if batch.len() == 1 {
            let p = batch.pop().expect("one");
            let _ = p.done.send(store.claim_one(&p.new).await);
            continue;
        }
        let news: Vec<&NewClaim> = batch.iter().map(|p| &p.new).collect();
        match insert_batch(store.pool(), &news).await {
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

pub(super) async fn settle_worker(store: PgStore, rx: Arc<Mutex<mpsc::Receiver<PendingSettle>>>) {
    while let Some(mut batch) = next_batch(&rx).await {
        // One statement per round of distinct ids (a repeated id waits for the next round).
        while !batch.is_empty() {
            let mut seen = std::collections::HashSet::new();
            let (round, rest): (Vec<_>, Vec<_>) =
                batch.into_iter().partition(|p| seen.insert(p.id));
            batch = rest;
            if round.len() > 1 {
                let items: Vec<SettleItem<'_>> = round.iter().map(PendingSettle::item).collect();
                if let Ok(done) = settle_batch(store.pool(), &items).await {
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

/// already claimed (before, or earlier in this batch).
pub(super) async fn insert_batch(
    pool: &PgPool,
    new: &[&NewClaim],
) -> StoreResult<Vec<Option<Claim>>> {
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
        .bind(new.iter().map(|n| n.mark_not_called).collect::<Vec<bool>>())
        .fetch_all(pool)
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
pub(super) async fn settle_batch(
    pool: &PgPool,
    items: &[SettleItem<'_>],
) -> StoreResult<Vec<bool>> {
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
        .fetch_all(pool)
        .await
        .map_err(err("settle_many"))?;
    let done: std::collections::HashSet<i64> = rows.into_iter().collect();
    Ok(items.iter().map(|i| done.contains(&i.id)).collect())
}

fn err(query: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::from_sqlx(query, e)
}
