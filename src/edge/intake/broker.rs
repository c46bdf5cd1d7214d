//! What the broker intakes (RabbitMQ, NATS JetStream) share besides their verdicts: each
//! consumer's live state (connected, last error, dead letters by reason, dead-letter publishes
//! failing), the readiness lines built from those states, and the steps after a dead-letter
//! publish (count it in the store before the original is acknowledged), the reconnecting
//! session loop and the stopping of consumer tasks.

#![cfg_attr(not(any(feature = "amqp", feature = "nats")), allow(dead_code))]

use super::refusal::{DeadLetterReason, STORE_RETRY_DELAY};
use crate::engine::claimer::Claimer;
use backon::BackoffBuilder;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// Pause before a message whose dead letter was not confirmed is tried again.
pub(crate) const DEAD_LETTER_RETRY_DELAY: Duration = Duration::from_secs(1);

/// The live state of one broker consumer: whether it is connected and consuming, the last
/// connection error, and how many messages it dead-lettered, by reason, since start.
#[derive(Debug)]
pub struct ConsumerState {
    name: String,
    connected: AtomicBool,
    sessions: AtomicU64,
    last_error: Mutex<Option<String>>,
    dead_lettered: Mutex<BTreeMap<DeadLetterReason, u64>>,
    dead_letter_failing: Mutex<Option<DeadLetterFailing>>,
}

/// Dead-letter publishes failing since the last one that was confirmed: each failure
/// returns its message to the broker, which redelivers it, and it fails again until the
/// cause is fixed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterFailing {
    /// Failed publishes in a row.
    pub failures: u64,
    /// When the first of them failed.
    pub since: chrono::DateTime<chrono::Utc>,
    /// Why the last one failed.
    pub last_error: String,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ConsumerState {
    pub(crate) fn new(name: &str) -> Self {
        ConsumerState {
            name: name.to_string(),
            connected: AtomicBool::new(false),
            sessions: AtomicU64::new(0),
            last_error: Mutex::new(None),
            dead_lettered: Mutex::new(BTreeMap::new()),
            dead_letter_failing: Mutex::new(None),
        }
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connected to the broker and consuming.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    /// How many times it has started consuming (1 + reconnects).
    pub fn sessions(&self) -> u64 {
        self.sessions.load(Ordering::SeqCst)
    }

    /// Why the last connection failed or ended, if it did.
    pub fn last_error(&self) -> Option<String> {
        locked(&self.last_error).clone()
    }

    /// Messages dead-lettered by this process since it started, by reason. The store keeps
    /// the durable count (`report`'s `dead_lettered`).
    pub fn dead_lettered(&self) -> BTreeMap<DeadLetterReason, u64> {
        locked(&self.dead_lettered).clone()
    }

    /// Dead-letter publishes failing in a row now (none since the last confirmed one: `None`).
    pub fn dead_letter_failing(&self) -> Option<DeadLetterFailing> {
        locked(&self.dead_letter_failing).clone()
    }

    /// A session began consuming: connected, no error, one session more.
    pub(crate) fn consuming(&self) {
        self.connected.store(true, Ordering::SeqCst);
        self.sessions.fetch_add(1, Ordering::SeqCst);
        self.set_error(None);
    }

    /// Not consuming (any more).
    pub(crate) fn disconnected(&self) {
        self.connected.store(false, Ordering::SeqCst);
    }

    pub(crate) fn dead_letter_failed(&self, why: &str) {
        let mut f = locked(&self.dead_letter_failing);
        let f = f.get_or_insert_with(|| DeadLetterFailing {
            failures: 0,
            since: chrono::Utc::now(),
            last_error: String::new(),
        });
        f.failures += 1;
        f.last_error = why.to_string();
    }

    pub(crate) fn dead_letter_confirmed(&self) {
        *locked(&self.dead_letter_failing) = None;
    }

    pub(crate) fn set_error(&self, e: Option<String>) {
        *locked(&self.last_error) = e;
    }

    pub(crate) fn count(&self, reason: DeadLetterReason) {
        *locked(&self.dead_lettered).entry(reason).or_default() += 1;
    }
}

/// The readiness line of a set of consumers: `Ok` when every one is consuming, else one line
/// naming the disconnected ones and why (`broker`: "the broker", "NATS").
pub(crate) fn consuming_check(
    states: &[std::sync::Arc<ConsumerState>],
    broker: &str,
) -> Result<(), String> {
    let down: Vec<String> = states
        .iter()
        .filter(|s| !s.connected())
        .map(|s| match s.last_error() {
            Some(e) => format!("{}: {e}", s.name),
            None => format!("{}: connecting", s.name),
        })
        .collect();
    if down.is_empty() {
        Ok(())
    } else {
        Err(format!("not consuming from {broker}: {}", down.join("; ")))
    }
}

/// The dead-letter line of a set of consumers for `/readyz`'s body: `Ok` unless a consumer's
/// dead-letter publishes are failing (its bad messages come back until they succeed), else one
/// line naming those consumers, how many failed since when, and why.
pub(crate) fn dead_letter_check(states: &[std::sync::Arc<ConsumerState>]) -> Result<(), String> {
    let failing: Vec<String> = states
        .iter()
        .filter_map(|s| {
            let f = s.dead_letter_failing()?;
            Some(format!(
                "{}: {} dead-letter publishes not confirmed since {} (messages requeued): {}",
                s.name,
                f.failures,
                f.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                f.last_error
            ))
        })
        .collect();
    if failing.is_empty() {
        Ok(())
    } else {
        Err(failing.join("; "))
    }
}

/// What to do with the original of a message after its dead-letter publish.
#[derive(Debug)]
pub(crate) enum AfterDeadLetter {
    /// Published and counted: acknowledge the original.
    Ack,
    /// Not published or not counted: give the original back to the broker after `delay`.
    Retry {
        /// Pause first.
        delay: Duration,
        /// Why, for the log.
        why: String,
    },
}

/// The steps after a dead-letter publish of `consumer`'s message (`published`: whether the
/// broker confirmed it): a failure is shown (state, metrics) and the original retried; a
/// confirmed one is counted in the store before the original is acknowledged, so the store's
/// count never falls short of the bad messages received (at worst the dead-letter destination
/// holds a copy more).
pub(crate) async fn after_dead_letter(
    claimer: &Claimer,
    state: &ConsumerState,
    published: Result<(), String>,
    reason: DeadLetterReason,
    sentence: &str,
    message_id: Option<&str>,
) -> AfterDeadLetter {
    if let Err(why) = published {
        warn!(error = %why, "dead-letter publish not confirmed; the message goes back to the broker");
        // Counted and shown (metrics, /readyz body): a dead-letter destination that is gone
        // otherwise shows only as the same message coming back for ever.
        state.dead_letter_failed(&why);
        claimer.metrics().dead_letter_unconfirmed(&state.name);
        return AfterDeadLetter::Retry {
            delay: DEAD_LETTER_RETRY_DELAY,
            why,
        };
    }
    state.dead_letter_confirmed();
    if let Err(e) = claimer
        .store()
        .record_dead_letter(&state.name, reason.as_str(), message_id)
        .await
    {
        warn!(error = %e, "store unavailable; the dead-lettered message goes back to the broker");
        return AfterDeadLetter::Retry {
            delay: STORE_RETRY_DELAY,
            why: format!("cannot count the dead letter in the store: {e}"),
        };
    }
    warn!(reason = reason.as_str(), detail = %sentence, "dead-lettered a bad message");
    state.count(reason);
    claimer
        .metrics()
        .dead_lettered(&state.name, reason.as_str());
    AfterDeadLetter::Ack
}

/// How a session with a broker ended.
pub(crate) enum SessionEnd {
    /// Shutdown was asked for.
    Stopped,
    /// The connection or the consumer went away.
    Lost(String),
}

/// Runs `session` until it ends with [`SessionEnd::Stopped`] or `stop` is set: after a lost or
/// failed session, waits with backoff (250 ms doubling to 15 s, with jitter; from the start
/// again after a session that consumed) and starts another. `session` gets its own receiver
/// of `stop` and answers how it ended and whether it got as far as consuming.
pub(crate) async fn run_sessions<F, Fut, E>(
    state: &ConsumerState,
    broker: &'static str,
    mut stop: watch::Receiver<bool>,
    mut session: F,
) where
    F: FnMut(watch::Receiver<bool>) -> Fut,
    Fut: std::future::Future<Output = (Result<SessionEnd, E>, bool)>,
    E: std::fmt::Display,
{
    let new_backoff = || {
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(250))
            .with_max_delay(Duration::from_secs(15))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    };
    let mut delays = new_backoff();
    loop {
        if *stop.borrow() {
            return;
        }
        let (end, consumed) = session(stop.clone()).await;
        match end {
            Ok(SessionEnd::Stopped) => {
                info!(broker, "consumer stopped");
                return;
            }
            Ok(SessionEnd::Lost(why)) => {
                warn!(broker, reason = %why, "lost the broker connection; reconnecting");
                state.set_error(Some(why));
            }
            Err(e) => {
                warn!(broker, error = %e, "broker session failed; retrying");
                state.set_error(Some(e.to_string()));
            }
        }
        state.disconnected();
        if consumed {
            // It worked for a while: start the backoff again from the shortest delay.
            delays = new_backoff();
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(15));
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Waits for consumer tasks that were told to stop, each at most `grace` (their handlers'
/// grace plus time to close), aborting one that takes longer.
pub(crate) async fn join_stopping(tasks: &Mutex<Vec<JoinHandle<()>>>, grace: Duration) {
    let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *locked(tasks));
    for t in tasks {
        let abort = t.abort_handle();
        if tokio::time::timeout(grace, t).await.is_err() {
            warn!("a broker consumer task did not stop in time; aborting it");
            abort.abort();
        }
    }
}
