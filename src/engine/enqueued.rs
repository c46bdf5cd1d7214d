//! The pickup of waiting claims: claims a producer committed in its own transaction
//! ([`crate::store::enqueue`]) and claims waiting for their order key's line
//! (docs/flow-control.md) carry no lease owner until a worker takes them here. Each consumer
//! has a task that takes as many as it has free call slots and, unless the consumer takes
//! fairly across tenants, free intake places besides (claims taken ahead wait for a slot, as
//! intake's do), in one statement (several instances never take one claim twice: the
//! statement's `lease_owner IS NULL` and, on PostgreSQL, `SKIP LOCKED`; lines are taken under
//! the consumer's line lock), and drives each like a fresh claim from intake, its "not called
//! yet" marker cleared before the first call (in the take itself when the consumer settles a
//! crash before the call by re-sending or reconciling, as intake commits its claims, and the
//! claim is young enough for a takeover to do so: `policy::clear_marker_within`).
//!
//! Priorities (docs/flow-control.md): each take fills its batch higher priority first, then
//! oldest, except for its aged share ([`priority::aged_share`]): one claim in eight taken by
//! this pickup is the oldest waiting, whatever its priority. The claims taken ahead of the
//! free slots wait for one in the order they were taken (a semaphore: first come, first
//! served); so do intake's, whose wait is short (one place per slot) and whose priority acts
//! only if the sweeper takes them over.
//!
//! Wake-ups: on PostgreSQL a notification on `claimd_enqueued` (payload: the consumer), sent
//! as the producer's transaction commits by a deferred trigger on the claims the enqueue
//! inserts, through one listening connection, with a poll every [`PG_POLL`] in case a
//! notification was lost (and one after each reconnect); on SQLite a poll every
//! [`SQLITE_POLL`], one indexed statement on the enqueued claims' partial index.
//!
//! The commit notifies only when no earlier claim of its consumer waits for a worker (every
//! notifying commit of a PostgreSQL cluster queues behind one lock, so a notification per
//! enqueue would serialize busy producers' commits). So after a take that found claims, the
//! pickup keeps looking on its own, at [`TAIL`] growing intervals (about 1.3 s in all), before
//! it waits for a notification again: a commit that rang no bell had a claim ahead of it that a
//! worker was woken for, and is taken by that worker's next look.

use crate::config::{Fairness, OrderHold};
use crate::domain::priority;
use crate::engine::claimer::Claimer;
use crate::engine::consumer::{Consumer, Hold, Slot};
use crate::store::WaitingOrder;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

/// The notification channel enqueued claims ring on commit (payload: the consumer).
pub const CHANNEL: &str = "claimd_enqueued";
/// How often the pickup looks on PostgreSQL without a notification.
pub const PG_POLL: Duration = Duration::from_secs(1);
/// How often the pickup looks when it polls only (SQLite; PostgreSQL through a pooler in
/// transaction mode): the bound on an enqueued claim's wait for a worker.
pub const SQLITE_POLL: Duration = Duration::from_millis(200);
/// Most claims one statement takes.
const BATCH: usize = 64;
/// How far inside the bound on clearing the marker in the take a claim's age must be for the
/// taker to count on it: the age it reads is rounded, and the statement tested the exact one.
const MARKER_MARGIN: Duration = Duration::from_secs(1);
/// After a take that found claims, the pickup looks again after these intervals (doubling)
/// before it waits for a notification: 5 ms, 10 ms, … 640 ms.
pub const TAIL: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(640));

/// Starts the pickup for every consumer of `claimer`. `listen_url`: the PostgreSQL store's
/// URL, to listen for notifications on (`None`: poll only, every [`SQLITE_POLL`]: SQLite, or
/// PostgreSQL through a pooler in transaction mode). The tasks end when `stop` turns true.
pub fn start(
    claimer: Arc<Claimer>,
    listen_url: Option<String>,
    stop: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let wakes: BTreeMap<String, Arc<Notify>> = claimer
        .consumers()
        .map(|c| (c.name().to_string(), c.pickup_bell()))
        .collect();
    let poll = if listen_url.is_some() {
        PG_POLL
    } else {
        SQLITE_POLL
    };
    let mut tasks = Vec::new();
    for consumer in claimer.consumers() {
        let wake = wakes[consumer.name()].clone();
        tasks.push(tokio::spawn(take_loop(
            claimer.clone(),
            consumer.clone(),
            wake,
            poll,
            stop.clone(),
        )));
    }
    #[cfg(feature = "postgres")]
    if let Some(url) = listen_url {
        tasks.push(tokio::spawn(listen(url, wakes, stop)));
    }
    #[cfg(not(feature = "postgres"))]
    let _ = listen_url;
    tasks
}

/// One consumer's pickup: take what is there, then wait for a wake-up or the poll.
async fn take_loop(
    claimer: Arc<Claimer>,
    consumer: Arc<Consumer>,
    wake: Arc<Notify>,
    poll: Duration,
    mut stop: watch::Receiver<bool>,
) {
    // The next interval of the busy tail; `None`: idle, waiting for a notification.
    let mut tail: Option<Duration> = None;
    // Claims this pickup took so far: the aged share of each take follows from it.
    let mut taken_so_far: u64 = 0;
    loop {
        while claimer.is_accepting() {
            let first = tokio::select! {
                permit = consumer.slot() => permit,
                _ = stop.wait_for(|s| *s) => return,
            };
            let mut permits = vec![first];
            while permits.len() < BATCH {
                match consumer.try_slot() {
                    Some(p) => permits.push(p),
                    None => break,
                }
            }
            // Claims ahead of the free slots, as intake claims ahead (one intake place each):
            // with a provider that answers at once, slots free one or two at a time, and a
            // take per slot would bound the pickup by its statements. Not under fairness,
            // where each take's choice should be made as late as it can.
            let mut places = Vec::new();
            let ahead = consumer.config.flow.fairness == Fairness::Oldest;
            while ahead && permits.len() + places.len() < BATCH {
                match consumer.try_intake_place() {
                    Some(p) => places.push(p),
                    None => break,
                }
            }
            let wanted = permits.len() + places.len();
            // The local clock starts before the statement sets the lease (as intake's).
            let since = Instant::now();
            // The marker goes with the take when a crash before the call is settled by
            // re-sending or reconciling, as intake commits such claims without it (one write
            // less a claim), for claims young enough that a takeover would still do so.
            let within = crate::engine::policy::clear_marker_within(
                consumer.claims_ahead(),
                consumer.config.redrive_within.0,
                consumer.config.lease.0,
            );
            let aged = priority::aged_share(taken_so_far, wanted as u32);
            let taken = take(&claimer, &consumer, wanted as u32, within, aged).await;
            let taken = match taken {
                Ok(taken) => taken,
                Err(e) => {
                    warn!(consumer = consumer.name(), error = %e, "could not take enqueued claims");
                    break;
                }
            };
            let all = taken.len() == wanted;
            taken_so_far += taken.len() as u64;
            // The statement returns its rows in no set order: the free slots go to the higher
            // priorities, and the claims taken ahead wait for theirs in the same order.
            let mut taken = taken;
            taken.sort_by_key(|t| (std::cmp::Reverse(t.priority), t.claim.id));
            if !taken.is_empty() {
                tail = Some(TAIL.0);
            }
            for t in taken {
                let admitted = match permits.pop() {
                    Some(permit) => Ok(permit),
                    None => match places.pop() {
                        Some(place) => Err(place),
                        None => break,
                    },
                };
                let metrics = claimer.metrics();
                metrics.received(consumer.name());
                metrics.created(consumer.name());
                let (claimer, consumer) = (claimer.clone(), consumer.clone());
                tokio::spawn(async move {
                    let permit = match admitted {
                        Ok(permit) => permit,
                        // Taken ahead: its call waits for a slot, then frees its place.
                        Err(place) => {
                            let permit = consumer.slot().await;
                            drop(place);
                            permit
                        }
                    };
                    let slot = Slot::held(permit, &consumer);
                    // Cleared by the take only if young enough (the statement's own test, on
                    // the database's clock); near the bound, cleared again before the call (a
                    // no-op if the take did).
                    let cleared = within.is_some_and(|w| t.age + MARKER_MARGIN <= w);
                    let hold = Hold::enqueued(since, t.age, !cleared);
                    if let Some(ahead) = &t.went_ahead_of {
                        note_went_ahead(&claimer, &t.claim, ahead).await;
                    }
                    Box::pin(claimer.drive(&consumer, &t.claim, hold, None, slot)).await;
                });
            }
            if !all {
                break;
            }
        }
        let wait = next_wait(&mut tail, poll);
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// How long the pickup waits before its next look: the busy tail's next interval, never
/// longer than the poll (on SQLite, where no bell rings, the poll bounds every wait), or the
/// poll once the tail is over.
fn next_wait(tail: &mut Option<Duration>, poll: Duration) -> Duration {
    match *tail {
        Some(t) => {
            *tail = (t < TAIL.1).then_some(t * 2);
            t.min(poll)
        }
        None => poll,
    }
}

/// Takes up to `limit` waiting claims of `consumer`: `aged` of them oldest first, the rest
/// higher priority first, then oldest; by its order keys' lines and fairly across tenants
/// when it is so configured (docs/flow-control.md).
async fn take(
    claimer: &Claimer,
    consumer: &Consumer,
    limit: u32,
    clear_marker_within: Option<Duration>,
    aged: u32,
) -> crate::store::StoreResult<Vec<crate::store::TakenClaim>> {
    let (store, owner, lease) = (claimer.store(), claimer.instance(), consumer.config.lease.0);
    if !consumer.takes_in_order() {
        return store
            .take_enqueued(
                consumer.name(),
                limit,
                owner,
                lease,
                clear_marker_within,
                aged,
            )
            .await;
    }
    let flow = &consumer.config.flow;
    let order = WaitingOrder {
        lines: consumer
            .order_key
            .is_some()
            .then_some(flow.order_hold == OrderHold::Hold),
        fair: (flow.fairness == Fairness::Tenant).then(|| flow.tenant_weights.clone()),
        aged,
    };
    store
        .take_waiting(
            consumer.name(),
            limit,
            owner,
            lease,
            &order,
            clear_marker_within,
        )
        .await
}

/// A history line on a claim that went ahead of a pending or parked claim of its line
/// (`order_hold = "skip"`).
async fn note_went_ahead(claimer: &Claimer, claim: &crate::domain::claim::Claim, ahead: &str) {
    let detail = format!(
        "went ahead of message {ahead} of its line (order key {:?}), which is pending or needs attention (order_hold = \"skip\")",
        claim.order_key.as_deref().unwrap_or_default()
    );
    let event = crate::store::NewEvent {
        actor: claimer.instance(),
        action: "order",
        outcome: "went_ahead",
        provider_status: None,
        detail: Some(&detail),
    };
    if let Err(e) = claimer
        .store()
        .record_event(claim.id, claim.attempt, &event)
        .await
    {
        warn!(message_id = %claim.message_id, error = %e, "could not record that the claim went ahead in its line");
    }
}

/// Listens for the enqueue's notifications and wakes the named consumer's pickup; wakes every
/// pickup after a (re)connection, since notifications sent meanwhile are lost.
#[cfg(feature = "postgres")]
async fn listen(
    url: String,
    wakes: BTreeMap<String, Arc<Notify>>,
    mut stop: watch::Receiver<bool>,
) {
    use sqlx::postgres::PgListener;
    let wake_all = || wakes.values().for_each(|w| w.notify_one());
    // A host list: LISTEN is refused on a standby, so the first server that takes it is the
    // primary; each reconnection starts from the last one that did.
    let urls =
        crate::store::hosts::split_hosts(&url).map_or_else(|_| vec![url.clone()], |t| t.urls);
    let mut first = 0;
    loop {
        let connected = async {
            let mut last = None;
            for step in 0..urls.len() {
                let i = (first + step) % urls.len();
                let tried = async {
                    let mut l = PgListener::connect(&urls[i]).await?;
                    l.listen(CHANNEL).await?;
                    Ok::<_, sqlx::Error>(l)
                };
                match tried.await {
                    Ok(l) => return Ok((i, l)),
                    Err(e) => last = Some(e),
                }
            }
            Err(last.expect("at least one host"))
        };
        let connected = tokio::select! {
            l = connected => l,
            _ = stop.wait_for(|s| *s) => return,
        };
        let mut listener = match connected {
            Ok((i, l)) => {
                first = i;
                l
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for enqueued claims; polling until it can");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        };
        wake_all();
        loop {
            let next = tokio::select! {
                n = listener.try_recv() => n,
                _ = stop.wait_for(|s| *s) => return,
            };
            match next {
                Ok(Some(n)) => {
                    if let Some(w) = wakes.get(n.payload()) {
                        w.notify_one();
                    }
                }
                // The connection was lost; the next call reconnects and listens again.
                Ok(None) => wake_all(),
                Err(e) => {
                    warn!(error = %e, "lost the enqueued claims' notifications; reconnecting");
                    wake_all();
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a take that found claims the pickup looks again at 5, 10, … 640 ms, then waits
    /// for the poll; no wait is longer than the poll, which bounds an enqueued claim's wait
    /// where no bell rings (SQLite, a pooler in transaction mode).
    #[test]
    fn the_busy_tail_doubles_and_never_outwaits_the_poll() {
        let ms = Duration::from_millis;
        let waits = |poll| {
            let mut tail = Some(TAIL.0);
            (0..10)
                .map(|_| next_wait(&mut tail, poll))
                .collect::<Vec<_>>()
        };
        let pg: Vec<_> = [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]
            .map(ms)
            .to_vec();
        assert_eq!(waits(PG_POLL), pg);
        let sqlite: Vec<_> = [5, 10, 20, 40, 80, 160, 200, 200, 200, 200]
            .map(ms)
            .to_vec();
        assert_eq!(waits(SQLITE_POLL), sqlite);
    }
}
