//! The outcome relay: publishes the outcome events the settles wrote (the transactional
//! outbox of [`crate::store::outbox`]) to each consumer's destination, and marks them sent
//! only after the destination confirmed.
//!
//! One task per outcome destination of each consumer (`[consumers.outcomes]`, or several as
//! `[[consumers.outcomes]]`): a settle writes one event row per destination, and each
//! destination's relay reads, sends and marks only its own rows, so a destination that is down
//! holds back its own events and no other's. One instance at a time relays a destination: each
//! round renews its hold on it for [`LEASE`] (one row write a round, not one an event), and
//! another instance's round takes nothing until this one lets go (at shutdown) or stops
//! renewing (a crash). A round takes up to `batch` unsent events in
//! order, a claim's event only when its earlier ones were sent (order per claim); then, a
//! [`CHUNK`] at a time, publishes them (`amqp`, a Cargo feature: persistent, publisher confirms awaited
//! together; [`http`]: Standard Webhooks, through the destination's breaker and pace) and marks
//! the chunk's confirmed ones sent in one statement before the next chunk goes; at the end it
//! gives the unconfirmed ones back with a backoff. A crash between a publish and its mark
//! leaves at most one chunk published and unsent: whoever holds the relay next publishes those
//! again with the same ids (at least once, never lost). Statements: the read, one mark a
//! chunk, none per message.
//!
//! - `event`: the pure part, the event's id, body and signature headers; `amqp`, `http`,
//!   `nats`: the destinations' kinds.

#[cfg(feature = "amqp")]
pub mod amqp;
pub mod event;
pub mod http;
#[cfg(feature = "nats")]
pub mod nats;

use crate::config::{Config, OutcomeKind, OutcomesConfig};
use crate::engine::metrics::Metrics;
use crate::engine::traces::{Step as TraceStep, Traces};
use crate::store::Store;
use crate::store::outbox::OutcomeEvent;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How long a consumer's relay stays with this instance after it last renewed its hold before
/// another instance may take it over (after a crash; a shutdown lets go at once).
pub const LEASE: Duration = Duration::from_secs(15);
/// The hold is renewed when less than this is left of it: every 5 s while the relay runs, so
/// an idle relay writes one row every 5 s, a busy one no more.
pub const RENEW_BELOW: Duration = Duration::from_secs(10);
/// How long a round may spend sending before it stops and leaves the rest for the next
/// round: a round that starts with [`RENEW_BELOW`] of its hold left ends well before another
/// instance could take over.
pub const ROUND_BUDGET: Duration = Duration::from_secs(5);
/// Most events published and not yet marked sent at any moment: a round publishes a chunk of
/// at most this many, awaits its confirms, marks it sent in one statement, and only then
/// publishes the next. A relay killed at any point therefore sends at most this many events a
/// second time. Small enough to bound the repeats, large enough that a chunk's publishes and
/// confirms travel together and its mark is one statement for 32 events.
pub const CHUNK: usize = 32;
/// The longest wait before an event that failed is tried again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// While a destination looks down (a round confirmed nothing), its oldest waiting event is
/// tried this often (or after the destination's own `Retry-After`, when longer), whatever
/// its backoff: once it goes through, every waiting event is due at once.
pub const PROBE_EVERY: Duration = Duration::from_secs(5);
/// While a destination keeps failing, its warning is repeated this often (the rounds between
/// are logged at debug level): a destination that is down is not a line per round.
pub const WARN_AGAIN_EVERY: Duration = Duration::from_secs(300);

/// Why one event was not confirmed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct SendError {
    /// What happened.
    pub message: String,
    /// When the destination asked to be tried again (`Retry-After`, a breaker's opening).
    pub retry_after: Option<Duration>,
}

impl SendError {
    /// An error without a time to try again.
    pub fn new(message: impl Into<String>) -> Self {
        SendError {
            message: message.into(),
            retry_after: None,
        }
    }
}

/// A destination of outcome events.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Publishes `events` (at most [`CHUNK`]) and answers, per event in order, whether the
    /// destination confirmed it. The answer may cover only the first events (`deadline`, the
    /// end of the round's time, passed): the others stay unsent, without a try counted, for
    /// the next round.
    async fn send(&self, events: &[OutcomeEvent], deadline: Instant) -> Vec<Result<(), SendError>>;

    /// Whether a failure holds back the rest of the round (an endpoint that is down is not
    /// asked once per event): the round's later events are then given back with the same
    /// error, unsent.
    fn stops_at_failure(&self) -> bool {
        false
    }
}

/// The wait before the next try of an event tried `tries` times before: 1 s doubling, at most
/// [`MAX_BACKOFF`], or the destination's own when it gave one.
pub fn backoff(tries: i32, asked: Option<Duration>) -> Duration {
    let doubling = Duration::from_secs(1u64 << tries.clamp(0, 9));
    asked.unwrap_or(doubling).min(MAX_BACKOFF)
}

/// The destination `o` names, or why it cannot be used.
#[cfg_attr(not(any(feature = "amqp", feature = "nats")), allow(unused_variables))]
fn sink_of(o: &OutcomesConfig, instance: &str) -> Result<Arc<dyn Sink>, String> {
    match o.kind {
        #[cfg(feature = "amqp")]
        OutcomeKind::Amqp => Ok(Arc::new(amqp::AmqpSink::new(o, instance))),
        #[cfg(feature = "nats")]
        OutcomeKind::Nats => Ok(Arc::new(nats::NatsSink::new(o, instance))),
        // Refused at load without their features (config::features).
        #[cfg(not(feature = "amqp"))]
        OutcomeKind::Amqp => Err(crate::domain::features::missing("amqp")),
        #[cfg(not(feature = "nats"))]
        OutcomeKind::Nats => Err(crate::domain::features::missing("nats")),
        OutcomeKind::Http => http::HttpSink::new(o)
            .map(|s| Arc::new(s) as Arc<dyn Sink>)
            .map_err(|e| e.to_string()),
    }
}

/// Starts one relay task per outcome destination of each consumer; they end when `stop`
/// turns true.
pub fn start(
    store: Store,
    config: &Config,
    instance: &str,
    metrics: Arc<Metrics>,
    traces: Traces,
    stop: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for c in &config.consumers {
        for (i, o) in c.outcomes.iter().enumerate() {
            let sink = match sink_of(o, instance) {
                Ok(sink) => sink,
                Err(e) => {
                    warn!(consumer = %c.name, destination = o.name(), error = %e, "outcome relay not started");
                    continue;
                }
            };
            let relay = Relay {
                store: store.clone(),
                consumer: c.name.clone(),
                destination: o.name().to_string(),
                adopts: i == 0,
                owner: instance.to_string(),
                config: o.clone(),
                sink,
                metrics: metrics.clone(),
                traces: traces.clone(),
                held_until: std::sync::Mutex::new(None),
                recovery: std::sync::Mutex::new(Recovery::default()),
            };
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move { relay.run(stop).await }));
        }
    }
    tasks
}

/// The relay of one destination of a consumer.
pub struct Relay {
    /// The store the events are in.
    pub store: Store,
    /// The consumer.
    pub consumer: String,
    /// The destination's name.
    pub destination: String,
    /// Whether this is the consumer's first destination, which takes over the unsent events
    /// written before destinations had names.
    pub adopts: bool,
    /// This instance (the lease owner).
    pub owner: String,
    /// Its destination's settings.
    pub config: OutcomesConfig,
    /// Its destination.
    pub sink: Arc<dyn Sink>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Where each event the destination confirmed is traced (`claimd.outcome`).
    pub traces: Traces,
    /// Until when this instance surely holds the consumer's relay (measured from before the
    /// statement that renewed it, so never later than the store's own lease end).
    pub held_until: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// Whether the destination looked down, and when to probe it.
    pub recovery: std::sync::Mutex<Recovery>,
}

/// A destination's way back after it looked down (a round that confirmed nothing). While it
/// looks down and nothing is due, its oldest waiting event is sent as a probe every
/// [`PROBE_EVERY`]; the first round whose sends all succeed makes every waiting event due at
/// once: a destination that is back takes its backlog within seconds, not as each event's
/// backoff (up to [`MAX_BACKOFF`]) runs out. An event refused while others go through
/// (unroutable, say) keeps its backoff.
#[derive(Debug, Clone, Copy)]
pub struct Recovery {
    /// The destination looked down, or an earlier process may have left events waiting (at
    /// start).
    pub looks_down: bool,
    /// Not before this is the next probe sent.
    pub probe_at: Instant,
    /// When the destination's failing was last logged as a warning; `None` while it confirms
    /// (or has not failed since the last confirm).
    pub warned_at: Option<Instant>,
    /// Rounds with a failure since that warning.
    pub failed_rounds: u32,
}

impl Default for Recovery {
    /// At start: an earlier process may have left events in backoff; probe at once.
    fn default() -> Self {
        Recovery {
            looks_down: true,
            probe_at: Instant::now(),
            warned_at: None,
            failed_rounds: 0,
        }
    }
}

impl Relay {
    /// The events of `chunk` named in `sent` (confirmed by the destination), each in its
    /// claim's trace: one read of their claims' stored `traceparent`s. A failed read loses
    /// only these spans.
    async fn trace_sent(
        &self,
        chunk: &[OutcomeEvent],
        sent: &[i64],
        started: std::time::SystemTime,
    ) {
        let confirmed: Vec<&OutcomeEvent> =
            chunk.iter().filter(|e| sent.contains(&e.seq)).collect();
        let ids: Vec<i64> = confirmed.iter().map(|e| e.claim_id).collect();
        let parents: std::collections::HashMap<i64, String> =
            match self.store.trace_parents(&ids).await {
                Ok(rows) => rows.into_iter().collect(),
                Err(e) => {
                    warn!(error = %e, "traces: could not read the claims' trace parents");
                    return;
                }
            };
        for e in confirmed {
            let attributes = vec![
                ("claimd.destination", self.destination.clone().into()),
                ("claimd.outcome.kind", self.config.kind.as_str().into()),
                ("claimd.outcome.event_id", event::event_id(e).into()),
                ("claimd.state", e.state.clone().into()),
                ("claimd.outcome.tries", (e.tries + 1).into()),
            ];
            self.traces.step_of(
                Some(e.claim_id),
                parents.get(&e.claim_id).map(String::as_str),
                TraceStep::since("claimd.outcome", started, attributes),
            );
        }
    }
}

impl Relay {
    /// Rounds until `stop`: at once after a full round, after `poll` otherwise.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        if self.adopts {
            match self
                .store
                .adopt_outcomes(&self.consumer, &self.destination)
                .await
            {
                Ok(0) => {}
                Ok(n) => {
                    debug!(consumer = %self.consumer, destination = %self.destination, events = n, "unsent outcome events from before named destinations taken over")
                }
                Err(e) => {
                    warn!(consumer = %self.consumer, error = %e, "unsent outcome events from before named destinations not taken over; tried again at the next start")
                }
            }
        }
        loop {
            let stopped = *stop.borrow();
            if stopped {
                self.release().await;
                return;
            }
            let full = match self.round().await {
                Ok(n) => n >= self.config.batch as usize,
                Err(e) => {
                    warn!(consumer = %self.consumer, destination = %self.destination, error = %e, "outcome relay round failed");
                    false
                }
            };
            if !full {
                let stopped = tokio::select! {
                    _ = tokio::time::sleep(self.config.poll.0) => false,
                    _ = stop.wait_for(|s| *s) => true,
                };
                if stopped {
                    self.release().await;
                    return;
                }
            }
        }
    }

    /// Lets another instance take this consumer's relay over at once.
    async fn release(&self) {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if let Err(e) = self
            .store
            .release_outcome_relay(&self.consumer, &self.destination, &self.owner)
            .await
        {
            debug!(consumer = %self.consumer, destination = %self.destination, error = %e, "outcome relay not let go; another instance takes it when its lease runs out");
        }
    }

    /// Whether this instance holds the consumer's relay, renewing the hold when less than
    /// [`RENEW_BELOW`] of it is left (a row write every 5 s, not one a round).
    async fn hold(&self) -> Result<bool, crate::store::StoreError> {
        let now = tokio::time::Instant::now();
        let until = *self.held_until.lock().unwrap_or_else(|p| p.into_inner());
        if until.is_some_and(|u| u.saturating_duration_since(now) >= RENEW_BELOW) {
            return Ok(true);
        }
        let held = self
            .store
            .hold_outcome_relay(&self.consumer, &self.destination, &self.owner, LEASE)
            .await?;
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner()) = held.then(|| now + LEASE);
        Ok(held)
    }

    /// One round: hold, take, then publish and mark chunk by chunk. Returns how many events
    /// it took.
    pub async fn round(&self) -> Result<usize, crate::store::StoreError> {
        let deadline = Instant::now() + ROUND_BUDGET;
        if !self.hold().await? {
            return Ok(0);
        }
        let mut events = self
            .store
            .due_outcomes(&self.consumer, &self.destination, self.config.batch)
            .await?;
        if events.is_empty() {
            let recovery = *self.recovery.lock().unwrap_or_else(|p| p.into_inner());
            if !recovery.looks_down || Instant::now() < recovery.probe_at {
                return Ok(0);
            }
            match self
                .store
                .oldest_unsent_outcome(&self.consumer, &self.destination)
                .await?
            {
                Some(oldest) => events.push(oldest),
                None => {
                    // Nothing waits: nothing to recover.
                    self.recovery
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .looks_down = false;
                    return Ok(0);
                }
            }
        }
        let mut sent = Vec::with_capacity(CHUNK);
        let mut sent_total = 0;
        let mut failed: Vec<(&OutcomeEvent, SendError)> = Vec::new();
        let mut held_back: Option<SendError> = None;
        for chunk in events.chunks(CHUNK) {
            if let Some(first) = &held_back {
                let err = SendError {
                    message: format!("not sent this round: {}", first.message),
                    retry_after: first.retry_after,
                };
                failed.extend(chunk.iter().map(|e| (e, err.clone())));
                continue;
            }
            if Instant::now() >= deadline {
                // Out of time: the rest stay unsent, untouched, for the next round.
                break;
            }
            let started = std::time::SystemTime::now();
            let results = self.sink.send(chunk, deadline).await;
            sent.clear();
            let failed_before = failed.len();
            for (e, r) in chunk.iter().zip(results) {
                match r {
                    Ok(()) => sent.push(e.seq),
                    Err(err) => failed.push((e, err)),
                }
            }
            // Marked sent only now, after the destination confirmed, and before the next chunk
            // is published: a crash repeats this chunk at most. If this fails, the lease runs
            // out and the events go again with the same ids.
            self.store.mark_outcomes_sent(&sent).await?;
            if self.traces.is_on() {
                self.trace_sent(chunk, &sent, started).await;
            }
            sent_total += sent.len();
            if self.sink.stops_at_failure() && failed.len() > failed_before {
                held_back = Some(failed[failed_before].1.clone());
            }
        }
        self.metrics
            .outbox
            .sent(&self.consumer, &self.destination, sent_total);
        if let Some((_, first)) = failed.first() {
            self.log_failing(failed.len(), first);
        }
        // One statement per distinct wait (a round's failures mostly share one).
        let mut by_wait: std::collections::BTreeMap<Duration, (Vec<i64>, &str)> =
            std::collections::BTreeMap::new();
        for (e, err) in &failed {
            let entry = by_wait
                .entry(backoff(e.tries, err.retry_after))
                .or_insert_with(|| (Vec::new(), err.message.as_str()));
            entry.0.push(e.seq);
        }
        for (after, (seqs, message)) in by_wait {
            self.store
                .retry_outcomes(&seqs, after, &crate::store::truncate(message, 1000))
                .await?;
        }
        self.metrics
            .outbox
            .failed(&self.consumer, &self.destination, failed.len());
        let looks_down = self
            .recovery
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .looks_down;
        if let (Some((_, first)), 0) = (failed.first(), sent_total) {
            // Nothing confirmed: the destination itself looks down.
            let wait = first.retry_after.unwrap_or_default().max(PROBE_EVERY);
            let mut r = self.recovery.lock().unwrap_or_else(|p| p.into_inner());
            r.looks_down = true;
            r.probe_at = Instant::now() + wait;
        } else if failed.is_empty() && sent_total > 0 {
            self.log_confirming();
        }
        if failed.is_empty() && sent_total > 0 && looks_down {
            let woken = self
                .store
                .wake_outcomes(&self.consumer, &self.destination)
                .await?;
            self.recovery
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .looks_down = false;
            if woken > 0 {
                debug!(consumer = %self.consumer, destination = %self.destination, woken, "the destination confirms again: events waiting out a backoff are due now");
            }
        }
        debug!(consumer = %self.consumer, destination = %self.destination, sent = sent_total, failed = failed.len(), "outcome relay round");
        Ok(events.len())
    }

    /// A round with `failed` events unconfirmed (`first`'s error): a warning when the
    /// destination starts failing and every [`WARN_AGAIN_EVERY`] while it goes on, else debug.
    fn log_failing(&self, failed: usize, first: &SendError) {
        let now = Instant::now();
        let mut r = self.recovery.lock().unwrap_or_else(|p| p.into_inner());
        match r.warned_at {
            None => {
                warn!(consumer = %self.consumer, destination = %self.destination, failed, error = %first, "the outcome destination does not confirm events; they wait and are tried again (logged again when it confirms, or in 5 minutes)");
            }
            Some(at) if now.duration_since(at) >= WARN_AGAIN_EVERY => {
                warn!(consumer = %self.consumer, destination = %self.destination, failed, failed_rounds = r.failed_rounds + 1, error = %first, "the outcome destination still does not confirm events; they wait and are tried again");
            }
            Some(_) => {
                r.failed_rounds += 1;
                debug!(consumer = %self.consumer, destination = %self.destination, failed, error = %first, "outcome events not confirmed; tried again later");
                return;
            }
        }
        r.warned_at = Some(now);
        r.failed_rounds = 0;
    }

    /// A round whose events were all confirmed: after a warning, says the destination is back.
    fn log_confirming(&self) {
        let mut r = self.recovery.lock().unwrap_or_else(|p| p.into_inner());
        if r.warned_at.take().is_some() {
            info!(consumer = %self.consumer, destination = %self.destination, "the outcome destination confirms events again");
            r.failed_rounds = 0;
        }
    }
}

/// Sends a chunk in the two steps a broker confirms in, both within `deadline`: every publish
/// together until it is written (`Err` stays that event's answer, `None` is "not written in
/// time"), then the confirmation (`confirmation` of what the publish gave) of every written
/// one together, read by `judge` (`None`: none in time). The answers in the events' order.
#[cfg(any(feature = "amqp", feature = "nats"))]
pub(crate) async fn publish_and_confirm<P, T, C>(
    publishes: Vec<P>,
    deadline: Instant,
    confirmation: impl Fn(T) -> C,
    judge: impl Fn(Option<C::Output>) -> Result<(), SendError>,
) -> Vec<Result<(), SendError>>
where
    P: std::future::Future<Output = Result<T, SendError>> + Unpin,
    C: std::future::Future + Unpin,
{
    let mut out = Vec::with_capacity(publishes.len());
    let mut pending = Vec::with_capacity(publishes.len());
    for (i, p) in join_until(publishes, deadline)
        .await
        .into_iter()
        .enumerate()
    {
        match p {
            Some(Ok(written)) => {
                pending.push((i, confirmation(written)));
                out.push(Ok(()));
            }
            Some(Err(e)) => out.push(Err(e)),
            None => out.push(Err(SendError::new("publish: not written in time"))),
        }
    }
    let (at, pending): (Vec<usize>, Vec<C>) = pending.into_iter().unzip();
    for (i, c) in at.into_iter().zip(join_until(pending, deadline).await) {
        out[i] = judge(c);
    }
    out
}

/// Drives every future together until each is done or `deadline` passes: the outputs in
/// order, `None` for one not done in time. Polled in order, so the publishes' frames are
/// queued in the events' order; woken once for what completes together, not once a future.
#[cfg(any(feature = "amqp", feature = "nats"))]
pub(crate) async fn join_until<F: Future + Unpin>(
    futures: Vec<F>,
    deadline: Instant,
) -> Vec<Option<F::Output>> {
    let mut futures: Vec<Option<F>> = futures.into_iter().map(Some).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    let mut left = futures.len();
    let timer = tokio::time::sleep_until(deadline);
    tokio::pin!(timer);
    std::future::poll_fn(|cx| {
        for (f, o) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(fut) = f
                && let std::task::Poll::Ready(v) = std::pin::Pin::new(fut).poll(cx)
            {
                *o = Some(v);
                *f = None;
                left -= 1;
            }
        }
        if left == 0 || timer.as_mut().poll(cx).is_ready() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_honours_what_the_destination_asked() {
        assert_eq!(backoff(0, None), Duration::from_secs(1));
        assert_eq!(backoff(3, None), Duration::from_secs(8));
        assert_eq!(backoff(50, None), MAX_BACKOFF);
        assert_eq!(
            backoff(0, Some(Duration::from_secs(20))),
            Duration::from_secs(20)
        );
        assert_eq!(backoff(0, Some(Duration::from_secs(9999))), MAX_BACKOFF);
    }
}
