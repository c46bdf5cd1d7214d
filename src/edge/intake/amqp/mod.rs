//! RabbitMQ intake (`source = "amqp"`): one task per consumer that connects, declares its
//! topology when asked, consumes with manual acknowledgements, and reconnects with backoff.
//!
//! Acknowledgement policy (`docs/design.md`; `docs/amqp-and-email.md`):
//!
//! - **ack** only after [`Claimer::submit`] returned `Ok`: the claim is committed, or the
//!   message is a duplicate of one that is. From then on the claim row owns the work.
//! - **nack and requeue**, after a short pause, when nothing was committed for a reason that
//!   may pass: the store is down, the consumer is at its concurrency limit, claimd is stopping.
//! - **dead-letter** bad input (no or invalid message id or tenant, body over
//!   `[http] max_body_bytes`, the same id with another payload, a payload the effect cannot
//!   use): the message is published to the consumer's dead-letter exchange with its body and
//!   properties unchanged plus a `claimd-reason` header, the broker's publisher confirm is
//!   awaited, the dead letter is counted in the store, and only then is the original
//!   acknowledged. If the publish is not confirmed, or the store cannot count it, the original
//!   is requeued instead: never dropped, never uncounted.
//!
//! A message whose headers nest tables or arrays more than [`MAX_HEADER_DEPTH`] levels deep is
//! dead-lettered (`headers_too_deep`) with those headers left out of the copy. lapin never sees
//! such a header: it connects to a broker guard on a loopback port (`guard`, [`frame_guard`])
//! that reads RabbitMQ's frames first, takes headers nested past the bound, or whose names are
//! not UTF-8, out of the frame and names them in [`TOO_DEEP_HEADER`] or [`UNREADABLE_HEADER`],
//! so no header can overflow the stack of lapin's recursive decoder; short strings that are not
//! UTF-8 reach lapin with U+FFFD instead of failing the frame and closing the connection (the
//! message id is then refused as not visible ASCII). A message with unreadable headers is
//! dead-lettered (`unreadable_headers`).
//!
//! A connection lost mid-flight loses nothing: unacknowledged messages go back to the queue,
//! and a redelivery of a message whose claim had committed is a duplicate (acknowledged, not
//! performed again).

use crate::config::{AmqpSourceConfig, Config, ConsumerConfig};
use crate::edge::intake::broker;
use crate::engine::claimer::Claimer;
use futures_util::StreamExt;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{Instrument, debug, info, info_span, instrument, warn};

#[cfg(test)]
mod decode_fuzz;
mod disposition;
pub mod frame_guard;
#[cfg(test)]
mod frame_guard_tests;
mod guard;
mod session;
mod verdict;

pub use crate::edge::intake::broker::{ConsumerState as AmqpConsumerState, DeadLetterFailing};
use crate::edge::intake::refusal::Verdict;
pub use crate::edge::intake::refusal::{DeadLetterReason, LOGGED_ID_CHARS, id_for_log};
use disposition::handle;
pub use frame_guard::{TOO_DEEP_HEADER, UNREADABLE_HEADER};
use session::run_consumer;
use verdict::judge;

/// The header a dead-lettered message carries, with a readable sentence saying why.
pub const REASON_HEADER: &str = "claimd-reason";

/// How many tables or arrays deep a message's headers may nest, the `headers` table itself
/// being level 1. The broker guard takes deeper headers out before lapin's decoder, which
/// recurses once per level, sees them.
pub const MAX_HEADER_DEPTH: usize = 32;

/// How long a connection attempt (TCP, TLS, AMQP handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping consumer waits for the deliveries it is handling (a submit waits at
/// most `intake_wait` for a slot; a requeue pauses at most a second).
const HANDLER_GRACE: Duration = Duration::from_secs(10);

/// What went wrong talking to the broker. Never carries the URL (it may hold a password).
#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    /// The connection could not be opened.
    #[error("cannot connect to the broker: {0}")]
    Connect(#[source] lapin::Error),
    /// The broker did not complete the handshake in time.
    #[error("the broker did not answer within {0:?}")]
    ConnectTimeout(Duration),
    /// A broker operation failed.
    #[error("{what}: {source}")]
    Broker {
        /// The operation (`declare queue "payments"`, ...).
        what: String,
        /// The client's error.
        source: lapin::Error,
    },
    /// The broker guard could not start (the URL), or could not reach the broker.
    #[error("{0}")]
    Guard(String),
    /// A queue or exchange name is longer than AMQP allows.
    #[error("name {0:?} is longer than 255 bytes")]
    Name(String),
}

fn broker(what: impl Into<String>) -> impl FnOnce(lapin::Error) -> AmqpError {
    let what = what.into();
    move |source| AmqpError::Broker { what, source }
}

fn short(name: &str) -> Result<ShortString, AmqpError> {
    ShortString::try_new(name).map_err(|_| AmqpError::Name(name.to_string()))
}

/// The RabbitMQ intake of a running worker: one task per `source = "amqp"` consumer.
#[derive(Debug)]
pub struct AmqpIntake {
    states: Vec<Arc<AmqpConsumerState>>,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// What one consumer task needs.
struct Ctx {
    claimer: Arc<Claimer>,
    config: ConsumerConfig,
    /// The consumer's RabbitMQ settings (its `source = "amqp"` keys).
    amqp: AmqpSourceConfig,
    max_body_bytes: usize,
    state: Arc<AmqpConsumerState>,
}

impl AmqpIntake {
    /// Starts a task for every consumer with `source = "amqp"` (none: an idle intake). The
    /// tasks connect in the background and retry with backoff; a broker that is down at start
    /// does not stop claimd from starting (readiness shows it).
    pub fn start(claimer: Arc<Claimer>, config: &Config) -> AmqpIntake {
        let (stop, _) = watch::channel(false);
        let mut states = Vec::new();
        let mut tasks = Vec::new();
        for (c, amqp) in config
            .consumers
            .iter()
            .filter_map(|c| Some((c, c.amqp()?.clone())))
        {
            let state = Arc::new(AmqpConsumerState::new(&c.name));
            states.push(state.clone());
            let span = info_span!("amqp", consumer = %c.name, queue = %amqp.queue);
            let ctx = Arc::new(Ctx {
                claimer: claimer.clone(),
                config: c.clone(),
                amqp,
                max_body_bytes: config.http.max_body_bytes,
                state,
            });
            let rx = stop.subscribe();
            tasks.push(tokio::spawn(run_consumer(ctx, rx).instrument(span)));
        }
        AmqpIntake {
            states,
            stop,
            tasks: Mutex::new(tasks),
        }
    }

    /// Every AMQP consumer's state.
    pub fn consumers(&self) -> &[Arc<AmqpConsumerState>] {
        &self.states
    }

    /// One consumer's state.
    pub fn consumer(&self, name: &str) -> Option<&Arc<AmqpConsumerState>> {
        self.states.iter().find(|s| s.name() == name)
    }

    /// Whether every AMQP consumer is connected and consuming (true when there are none).
    /// Readiness should be red while this is false.
    pub fn connected(&self) -> bool {
        self.states.iter().all(|s| s.connected())
    }

    /// Names of the AMQP consumers that are not connected now.
    pub fn disconnected(&self) -> Vec<String> {
        self.states
            .iter()
            .filter(|s| !s.connected())
            .map(|s| s.name().to_string())
            .collect()
    }

    /// The readiness check: `Ok` when every AMQP consumer is consuming, else one line naming
    /// the disconnected consumers and why (for `/readyz`).
    pub fn check(&self) -> Result<(), String> {
        broker::consuming_check(&self.states, "the broker")
    }

    /// The dead-letter check for `/readyz`'s body: `Ok` unless a consumer's dead-letter
    /// publishes are failing (its bad messages are requeued and come back until they succeed),
    /// else one line naming those consumers, how many failed since when, and why.
    pub fn dead_letter_check(&self) -> Result<(), String> {
        broker::dead_letter_check(&self.states)
    }

    /// Stops consuming: cancels every consumer (no new deliveries), lets deliveries already
    /// being handled finish (ack, requeue or dead-letter; at most 10 s), then closes the
    /// connections; anything unacknowledged goes back to the queue. Idempotent.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        // Each task waits for its handlers itself; allow for closing too.
        broker::join_stopping(&self.tasks, HANDLER_GRACE + Duration::from_secs(5)).await;
    }
}

impl Drop for AmqpIntake {
    fn drop(&mut self) {
        // Dropped without `stop`: the tasks still cancel and close on their own.
        let _ = self.stop.send(true);
    }
}
