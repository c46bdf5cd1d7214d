//! Group commit, for every dialect: concurrent `claim` and `settle` calls wait here briefly and
//! a few background tasks hand whatever is waiting to the dialect as one write
//! ([`Dialect::insert_many`], [`Dialect::settle_many`]: one multi-row statement in PostgreSQL,
//! one transaction in SQLite), so under load one commit serves many messages. Each caller
//! still gets its own answer only after the commit carrying its row (I1), and each settle stays
//! fenced on its own `attempt` (I2). With one call waiting, a dialect that does not ask for
//! [`Dialect::BATCH_SINGLES`] uses the one-row path of the common body, so an idle worker adds
//! no delay.

use super::dialect::Dialect;
use super::{ClaimOutcome, NewEvent, SettleItem, Settlement, StoreResult};
use crate::domain::claim::NewClaim;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};

/// What the batcher writes through: a store's one-row writes and its dialect's many-row
/// ones, without a batcher of its own. `SqlStore` implements it; the batcher knows only
/// this, so the store depends on the batcher and not the other way round.
pub(crate) trait OneByOne<D: Dialect>: Clone + Send + Sync + 'static {
    /// The dialect that writes many rows at once.
    fn dialect(&self) -> &D;
    /// The consumers whose settles write outcome events.
    fn outcomes(&self) -> &super::outbox::OutcomeConsumers;
    /// Claims one message in a transaction of its own.
    fn claim_one(&self, new: &NewClaim) -> impl Future<Output = StoreResult<ClaimOutcome>> + Send;
    /// Settles one claim, fenced on `attempt`.
    fn settle_one(
        &self,
        id: i64,
        attempt: i32,
        s: &Settlement,
        event: &NewEvent<'_>,
    ) -> impl Future<Output = StoreResult<bool>> + Send;
    /// Clears one claim's "not called yet" marker, fenced on `attempt`.
    fn mark_called_one(
        &self,
        id: i64,
        attempt: i32,
    ) -> impl Future<Output = StoreResult<bool>> + Send;
}

/// Most rows in one batched write.
pub(crate) const MAX_BATCH: usize = 256;

/// Where `claim` and `settle` calls wait to be written together.
pub(crate) struct Batcher {
    claims: mpsc::Sender<PendingClaim>,
    settles: mpsc::Sender<PendingSettle>,
    marks: mpsc::Sender<PendingMark>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl Batcher {
    /// Starts [`Dialect::BATCH_WORKERS`] tasks for claims and as many for settles, writing
    /// through `plain` (a store without a batcher). Must be called inside a Tokio runtime. The
    /// tasks end when the last [`Batcher`] handle is dropped.
    pub(crate) fn start<D: Dialect, S: OneByOne<D>>(plain: S) -> Arc<Batcher> {
        let (claims, claims_rx) = mpsc::channel(MAX_BATCH * D::BATCH_WORKERS);
        let (settles, settles_rx) = mpsc::channel(MAX_BATCH * D::BATCH_WORKERS);
        let (marks, marks_rx) = mpsc::channel(MAX_BATCH * D::BATCH_WORKERS);
        let (claims_rx, settles_rx, marks_rx) = (
            Arc::new(Mutex::new(claims_rx)),
            Arc::new(Mutex::new(settles_rx)),
            Arc::new(Mutex::new(marks_rx)),
        );
        for _ in 0..D::BATCH_WORKERS {
            tokio::spawn(claim_worker(plain.clone(), claims_rx.clone()));
            tokio::spawn(settle_worker(plain.clone(), settles_rx.clone()));
            tokio::spawn(mark_worker(plain.clone(), marks_rx.clone()));
        }
        Arc::new(Batcher {
            claims,
            settles,
            marks,
        })
    }

    /// Claims `new` with whatever else is waiting; `None` when the batcher is gone (the
    /// caller then claims alone).
    pub(crate) async fn claim(&self, new: &NewClaim) -> Option<StoreResult<ClaimOutcome>> {
        let (done, answer) = oneshot::channel();
        let p = PendingClaim {
            new: new.clone(),
            done,
        };
        self.claims.send(p).await.ok()?;
        answer.await.ok()
    }

    /// Settles with whatever else is waiting; `None` when the batcher is gone.
    pub(crate) async fn settle(
        &self,
        id: i64,
        attempt: i32,
        s: &Settlement,
        event: &NewEvent<'_>,
    ) -> Option<StoreResult<bool>> {
        let (done, answer) = oneshot::channel();
        self.settles
            .send(PendingSettle::new(id, attempt, s, event, done))
            .await
            .ok()?;
        answer.await.ok()
    }

    /// Clears a claim's "not called yet" marker with whatever else is waiting; `None` when
    /// the batcher is gone.
    pub(crate) async fn mark_called(&self, id: i64, attempt: i32) -> Option<StoreResult<bool>> {
        let (done, answer) = oneshot::channel();
        self.marks
            .send(PendingMark { id, attempt, done })
            .await
            .ok()?;
        answer.await.ok()
    }
}

struct PendingMark {
    id: i64,
    attempt: i32,
    done: oneshot::Sender<StoreResult<bool>>,
}

struct PendingClaim {
    new: NewClaim,
    done: oneshot::Sender<StoreResult<ClaimOutcome>>,
}

/// A settle waiting for its batch, owning what the caller lent.
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
    fn new(
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

/// The first call for each id in `batch`, taken out of it: one write names an id once, so a
/// repeated id waits for the next round.
fn next_round<T>(batch: &mut Vec<T>, id: impl Fn(&T) -> i64) -> Vec<T> {
    let mut seen = HashSet::new();
    let (round, rest) = std::mem::take(batch)
        .into_iter()
        .partition(|p| seen.insert(id(p)));
    *batch = rest;
    round
}

async fn claim_worker<D: Dialect, S: OneByOne<D>>(
    store: S,
    rx: Arc<Mutex<mpsc::Receiver<PendingClaim>>>,
) {
    while let Some(mut batch) = next_batch(&rx).await {
        if batch.len() == 1 && !D::BATCH_SINGLES {
            let p = batch.pop().expect("one");
            let _ = p.done.send(store.claim_one(&p.new).await);
            continue;
        }
        let news: Vec<&NewClaim> = batch.iter().map(|p| &p.new).collect();
        match store.dialect().insert_many(&news).await {
            Some(Ok(outcomes)) => {
                for (p, o) in batch.into_iter().zip(outcomes) {
                    match o {
                        Some(o) => {
                            let _ = p.done.send(Ok(o));
                        }
                        // Left to the one-row path (a repeat the dialect does not count in
                        // the batch), without holding up the others.
                        None => {
                            let s = store.clone();
                            tokio::spawn(async move {
                                let _ = p.done.send(s.claim_one(&p.new).await);
                            });
                        }
                    }
                }
            }
            // The write failed (or the dialect has none). It may still have committed (the
            // connection was cut after the commit): one by one, each with its own token, so a
            // row the batch did insert is recognised as its caller's new claim, not taken for
            // a duplicate.
            Some(Err(_)) | None => {
                for p in batch {
                    let _ = p.done.send(store.claim_one(&p.new).await);
                }
            }
        }
    }
}

async fn settle_worker<D: Dialect, S: OneByOne<D>>(
    store: S,
    rx: Arc<Mutex<mpsc::Receiver<PendingSettle>>>,
) {
    while let Some(mut batch) = next_batch(&rx).await {
        while !batch.is_empty() {
            let round = next_round(&mut batch, |p| p.id);
            if round.len() > 1 || D::BATCH_SINGLES {
                let items: Vec<SettleItem<'_>> = round.iter().map(PendingSettle::item).collect();
                if let Some(Ok(done)) = store.dialect().settle_many(&items, store.outcomes()).await
                {
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

async fn mark_worker<D: Dialect, S: OneByOne<D>>(
    store: S,
    rx: Arc<Mutex<mpsc::Receiver<PendingMark>>>,
) {
    while let Some(mut batch) = next_batch(&rx).await {
        while !batch.is_empty() {
            let round = next_round(&mut batch, |p| p.id);
            if round.len() > 1 || D::BATCH_SINGLES {
                let marks: Vec<(i64, i32)> = round.iter().map(|p| (p.id, p.attempt)).collect();
                if let Some(Ok(done)) = store.dialect().mark_called_many(&marks).await {
                    for (p, d) in round.into_iter().zip(done) {
                        let _ = p.done.send(Ok(d));
                    }
                    continue;
                }
            }
            // One call, or the batch failed as a whole (nothing committed; the update is the
            // same again if it did): one by one.
            for p in round {
                let _ = p.done.send(store.mark_called_one(p.id, p.attempt).await);
            }
        }
    }
}
