//! NATS JetStream intake (`source = "nats"`): one task per consumer that connects, creates the
//! stream and its durable pull consumer when asked, pulls with explicit acknowledgements, and
//! reconnects with backoff. docs/nats.md is the user's page.
//!
//! Acknowledgement policy, the same as the RabbitMQ intake's:
//!
//! - **ack** (a double ack: the server confirms it) only after [`Claimer::submit`] returned
//!   `Ok`: the claim is committed, or the message is a duplicate of one that is.
//! - **hold and try again** when nothing was committed for a reason that may pass (the store
//!   is down, the consumer is at its concurrency limit): the message stays with this worker,
//!   which tells the server it is in progress so it is not redelivered meanwhile. When claimd
//!   stops, the messages it holds are given back at once (nak).
//! - **dead-letter** bad input (the reasons of the RabbitMQ intake) and a message delivered more
//!   than `max_deliver` times without an acknowledgement that has no claim (`delivery_limit`:
//!   claimd stopped or was killed while holding it each time): the message is published to
//!   `dead_letter_subject` with its body and headers plus `Claimd-Reason`, the stream's publish
//!   acknowledgement is awaited, the dead letter is counted in the store, and only then is the
//!   original acknowledged. Until all of that succeeds the original is given back, never
//!   dropped.
//!
//! The message id is the `message_id_header` header (default `Nats-Msg-Id`, the header
//! JetStream itself deduplicates publishes by); NATS has no other id, and a stream sequence or
//! a delivery count is never used as one. The server's own `max_deliver` is left unlimited:
//! claimd counts deliveries itself so that a message past the limit is dead-lettered, not left
//! unacknowledged and silent on the server.
//!
//! The client connects to a broker guard on a loopback port ([`line_guard`]), not to the
//! server: a message whose header section async-nats could not read (bytes that are not UTF-8,
//! a line without a colon, a name a header cannot have) would close its connection, and
//! JetStream would deliver it again after every reconnect. Through the guard it arrives with
//! the readable headers and [`UNREADABLE_HEADERS`], and is dead-lettered
//! (`unreadable_headers`).

use crate::config::{Config, ConsumerConfig, NatsSourceConfig};
use crate::edge::intake::broker;
use crate::engine::claimer::Claimer;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, info_span};

mod disposition;
mod guard;
mod headers;
pub mod line_guard;
mod session;

pub use crate::edge::intake::broker::{ConsumerState as NatsConsumerState, DeadLetterFailing};
pub use crate::edge::intake::refusal::DeadLetterReason;
pub use headers::{
    NOT_BEFORE_HEADER, ORIGINAL_MESSAGE_ID_HEADER, ORIGINAL_SUBJECT_HEADER, REASON_CODE_HEADER,
    REASON_HEADER,
};
pub use line_guard::UNREADABLE_HEADERS;

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping consumer waits for the messages it is handling.
const HANDLER_GRACE: Duration = Duration::from_secs(10);

/// What went wrong talking to NATS. Never carries the URL (it may hold a password).
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// The connection could not be opened.
    #[error("cannot connect to NATS: {0}")]
    Connect(String),
    /// A JetStream operation failed.
    #[error("{what}: {why}")]
    JetStream {
        /// The operation (`create consumer "claimd-payments"`, ...).
        what: String,
        /// The client's or the server's error.
        why: String,
    },
    /// The broker guard could not start (the URL), or could not reach the server.
    #[error("{0}")]
    Guard(String),
    /// The existing stream or consumer cannot be used as it is.
    #[error("{0}")]
    Unusable(String),
}

fn jetstream<E: std::fmt::Display>(what: impl Into<String>) -> impl FnOnce(E) -> NatsError {
    let what = what.into();
    move |e| NatsError::JetStream {
        what,
        why: e.to_string(),
    }
}

/// The NATS JetStream intake of a running worker: one task per `source = "nats"` consumer.
#[derive(Debug)]
pub struct NatsIntake {
    states: Vec<Arc<NatsConsumerState>>,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// What one consumer task needs.
struct Ctx {
    claimer: Arc<Claimer>,
    config: ConsumerConfig,
    /// The consumer's NATS settings (its `source = "nats"` keys).
    nats: NatsSourceConfig,
    max_body_bytes: usize,
    state: Arc<NatsConsumerState>,
}

impl NatsIntake {
    /// Starts a task for every consumer with `source = "nats"` (none: an idle intake). The
    /// tasks connect in the background and retry with backoff; a server that is down at start
    /// does not stop claimd from starting (readiness shows it).
    pub fn start(claimer: Arc<Claimer>, config: &Config) -> NatsIntake {
        let (stop, _) = watch::channel(false);
        let mut states = Vec::new();
        let mut tasks = Vec::new();
        for (c, nats) in config
            .consumers
            .iter()
            .filter_map(|c| Some((c, c.nats()?.clone())))
        {
            let state = Arc::new(NatsConsumerState::new(&c.name));
            states.push(state.clone());
            let span = info_span!("nats", consumer = %c.name, stream = %nats.stream, durable = %nats.durable);
            let ctx = Arc::new(Ctx {
                claimer: claimer.clone(),
                config: c.clone(),
                nats,
                max_body_bytes: config.http.max_body_bytes,
                state,
            });
            let rx = stop.subscribe();
            tasks.push(tokio::spawn(
                session::run_consumer(ctx, rx).instrument(span),
            ));
        }
        NatsIntake {
            states,
            stop,
            tasks: Mutex::new(tasks),
        }
    }

    /// Every NATS consumer's state.
    pub fn consumers(&self) -> &[Arc<NatsConsumerState>] {
        &self.states
    }

    /// One consumer's state.
    pub fn consumer(&self, name: &str) -> Option<&Arc<NatsConsumerState>> {
        self.states.iter().find(|s| s.name() == name)
    }

    /// Whether every NATS consumer is connected and pulling (true when there are none).
    pub fn connected(&self) -> bool {
        self.states.iter().all(|s| s.connected())
    }

    /// The readiness check: `Ok` when every NATS consumer is pulling, else one line naming the
    /// disconnected consumers and why (for `/readyz`).
    pub fn check(&self) -> Result<(), String> {
        broker::consuming_check(&self.states, "NATS")
    }

    /// The dead-letter check for `/readyz`'s body (see [`broker`]'s `dead_letter_check`).
    pub fn dead_letter_check(&self) -> Result<(), String> {
        broker::dead_letter_check(&self.states)
    }

    /// Stops pulling: no new messages; those being handled finish (ack, dead-letter) or are
    /// given back (nak) within 10 s; then the connections close. Idempotent.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        broker::join_stopping(&self.tasks, HANDLER_GRACE + Duration::from_secs(5)).await;
    }
}

impl Drop for NatsIntake {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
