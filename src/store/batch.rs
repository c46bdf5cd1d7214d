//! Group commit, for every dialect: concurrent `claim` and `settle` calls wait here briefly and
//! a few background tasks hand whatever is waiting to the dialect as one write
//! ([`Dialect::insert_many`], [`Dialect::settle_many`]: one multi-row statement in PostgreSQL,
//! one transaction in SQLite), so under load one commit serves many messages. Each caller
//! still gets its own answer only after the commit carrying its row (I1), and each settle stays
//! fenced on its own `attempt` (I2). With one call waiting, a dialect that does not ask for
//! [`Dialect::BATCH_SINGLES`] uses the one-row path of the common body, so an idle worker adds
//! no delay. Where the dialect has [`Dialect::JOINT_WRITES`] (PostgreSQL), claims, settles and
//! "not called yet" markers wait in one queue, and a batch holding claims and settles writes
//! both in one statement ([`Dialect::insert_settle_many`]), one commit for both kinds; if that
//! write fails, each kind is written again by itself, so a claim the database refuses fails
//! only its own caller.

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

/// Where `claim` and `settle` calls wait to be written together: one queue ("lane") per kind,
/// or one for every kind when the dialect writes claims and settles in one statement
/// ([`Dialect::insert_settle_many`]), so that one commit serves both.
pub(crate) struct Batcher {
    lanes: Vec<mpsc::Sender<Pending>>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

/// A call waiting in a lane.
enum Pending {
    Claim(PendingClaim),
    Settle(PendingSettle),
    Mark(PendingMark),
}

impl Pending {
    /// Its lane among three (one per kind).
    fn kind(&self) -> usize {
        match self {
            Pending::Claim(_) => 0,
            Pending::Settle(_) => 1,
            Pending::Mark(_) => 2,
        }
    }
}

impl Batcher {
    /// Starts [`Dialect::BATCH_WORKERS`] tasks per lane, writing through `plain` (a store
    /// without a batcher). Must be called inside a Tokio runtime. The tasks end when the last
    /// [`Batcher`] handle is dropped.
    pub(crate) fn start<D: Dialect, S: OneByOne<D>>(plain: S) -> Arc<Batcher> {
        let lanes = if D::JOINT_WRITES { 1 } else { 3 };
        let workers = D::BATCH_WORKERS;
        let lanes = (0..lanes)
            .map(|_| {
                let (tx, rx) = mpsc::channel(MAX_BATCH * workers);
                let rx = Arc::new(Mutex::new(rx));
                for _ in 0..workers {
                    tokio::spawn(worker(plain.clone(), rx.clone()));
                }
                tx
            })
            .collect();
        Arc::new(Batcher { lanes })
    }

    /// Queues `p` in its lane; `false` when the batcher is gone.
    async fn send(&self, p: Pending) -> bool {
        let lane = &self.lanes[p.kind() % self.lanes.len()];
        lane.send(p).await.is_ok()
    }

    /// Claims `new` with whatever else is waiting; `None` when the batcher is gone (the
    /// caller then claims alone).
    pub(crate) async fn claim(&self, new: &NewClaim) -> Option<StoreResult<ClaimOutcome>> {
        let (done, answer) = oneshot::channel();
        let p = PendingClaim {
            new: new.clone(),
            done,
        };
        if !self.send(Pending::Claim(p)).await {
            return None;
        }
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
        let p = PendingSettle::new(id, attempt, s, event, done);
        if !self.send(Pending::Settle(p)).await {
            return None;
        }
        answer.await.ok()
    }

    /// Clears a claim's "not called yet" marker with whatever else is waiting; `None` when
    /// the batcher is gone.
    pub(crate) async fn mark_called(&self, id: i64, attempt: i32) -> Option<StoreResult<bool>> {
        let (done, answer) = oneshot::channel();
        if !self
            .send(Pending::Mark(PendingMark { id, attempt, done }))
            .await
        {
            return None;
        }
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
/// Under load (`busy`: the worker's last batch had more than one call) a batch still smaller
/// than [`LINGER_BELOW`] waits [`Dialect::BATCH_LINGER`] for more first: an idle worker's call
/// is written at once.
async fn next_batch<D: Dialect, T>(rx: &Mutex<mpsc::Receiver<T>>, busy: bool) -> Option<Vec<T>> {
    let mut rx = rx.lock().await;
    let first = rx.recv().await?;
    let mut batch = vec![first];
    drain(&mut rx, &mut batch);
    if busy && !D::BATCH_LINGER.is_zero() && batch.len() < LINGER_BELOW {
        tokio::time::sleep(D::BATCH_LINGER).await;
        drain(&mut rx, &mut batch);
    }
    Some(batch)
}

/// A batch at least this large is written without lingering.
const LINGER_BELOW: usize = 32;

/// Takes the calls already waiting in `rx` into `batch`, up to [`MAX_BATCH`].
fn drain<T>(rx: &mut mpsc::Receiver<T>, batch: &mut Vec<T>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(p) => batch.push(p),
            Err(_) => break,
        }
    }
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

/// Takes batches from one lane and writes them: claims and settles together in one statement
/// when the dialect can and both are waiting, else each kind by itself (at once, side by side).
async fn worker<D: Dialect, S: OneByOne<D>>(store: S, rx: Arc<Mutex<mpsc::Receiver<Pending>>>) {
    let mut busy = false;
    while let Some(batch) = next_batch::<D, _>(&rx, busy).await {
        busy = batch.len() > 1;
        let (mut claims, mut settles, mut marks) = (Vec::new(), Vec::new(), Vec::new());
        for p in batch {
            match p {
                Pending::Claim(c) => claims.push(c),
                Pending::Settle(s) => settles.push(s),
                Pending::Mark(m) => marks.push(m),
            }
        }
        if D::JOINT_WRITES && !claims.is_empty() && !settles.is_empty() {
            let round = next_round(&mut settles, |p| p.id);
            // Handed back when the joint write failed as a whole (nothing committed): each
            // kind is then written by itself, so one kind's failure fails no caller of the
            // other.
            let (c, r) = write_joint(&store, claims, round).await;
            claims = c;
            settles.splice(0..0, r);
        }
        tokio::join!(
            write_claims(&store, claims),
            write_settles(&store, settles),
            write_marks(&store, marks),
        );
    }
}

/// Writes `claims` and `settles` (distinct ids) in one statement and answers their callers;
/// hands both back unanswered when the dialect has no such statement or it failed.
async fn write_joint<D: Dialect, S: OneByOne<D>>(
    store: &S,
    claims: Vec<PendingClaim>,
    settles: Vec<PendingSettle>,
) -> (Vec<PendingClaim>, Vec<PendingSettle>) {
    let news: Vec<&NewClaim> = claims.iter().map(|p| &p.new).collect();
    let items: Vec<SettleItem<'_>> = settles.iter().map(PendingSettle::item).collect();
    let Some(Ok((claimed, settled))) = store
        .dialect()
        .insert_settle_many(&news, &items, store.outcomes())
        .await
    else {
        return (claims, settles);
    };
    drop(items);
    for (p, d) in settles.into_iter().zip(settled) {
        let _ = p.done.send(Ok(d));
    }
    answer_claims(store, claims, claimed);
    (Vec::new(), Vec::new())
}

/// Answers each claim of a committed batch with its outcome; one the batch left undecided
/// goes the one-row path (a repeat the dialect did not count in the batch), without holding
/// up the others.
fn answer_claims<D: Dialect, S: OneByOne<D>>(
    store: &S,
    claims: Vec<PendingClaim>,
    outcomes: Vec<Option<ClaimOutcome>>,
) {
    for (p, o) in claims.into_iter().zip(outcomes) {
        match o {
            Some(o) => {
                let _ = p.done.send(Ok(o));
            }
            None => {
                let s = store.clone();
                tokio::spawn(async move {
                    let _ = p.done.send(s.claim_one(&p.new).await);
                });
            }
        }
    }
}

async fn write_claims<D: Dialect, S: OneByOne<D>>(store: &S, mut batch: Vec<PendingClaim>) {
    if batch.is_empty() {
        return;
    }
    if batch.len() == 1 && !D::BATCH_SINGLES {
        let p = batch.pop().expect("one");
        let _ = p.done.send(store.claim_one(&p.new).await);
        return;
    }
    let news: Vec<&NewClaim> = batch.iter().map(|p| &p.new).collect();
    match store.dialect().insert_many(&news).await {
        Some(Ok(outcomes)) => answer_claims(store, batch, outcomes),
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

async fn write_settles<D: Dialect, S: OneByOne<D>>(store: &S, mut batch: Vec<PendingSettle>) {
    while !batch.is_empty() {
        let round = next_round(&mut batch, |p| p.id);
        if round.len() > 1 || D::BATCH_SINGLES {
            let items: Vec<SettleItem<'_>> = round.iter().map(PendingSettle::item).collect();
            if let Some(Ok(done)) = store.dialect().settle_many(&items, store.outcomes()).await {
                drop(items);
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

async fn write_marks<D: Dialect, S: OneByOne<D>>(store: &S, mut batch: Vec<PendingMark>) {
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
