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
//! A connection lost mid-flight loses nothing: unacknowledged messages go back to the queue,
//! and a redelivery of a message whose claim had committed is a duplicate (acknowledged, not
//! performed again).

use crate::claim::{IdError, validate_message_id, validate_tenant};
use crate::claimer::{Accepted, Claimer, Delivery, SubmitError};
use crate::config::{Config, ConsumerConfig, Source};
use backon::BackoffBuilder;
use futures_util::StreamExt;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{Instrument, debug, error, info, info_span, instrument, warn};

/// The header a dead-lettered message carries, with a readable sentence saying why.
pub const REASON_HEADER: &str = "claimd-reason";

/// How long a connection attempt (TCP, TLS, AMQP handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before requeueing after a store failure, so a down database is not hammered.
const STORE_RETRY_DELAY: Duration = Duration::from_secs(1);
/// Pause before requeueing when the consumer was busy (it already waited `intake_wait`).
const BUSY_RETRY_DELAY: Duration = Duration::from_millis(200);
/// Pause before requeueing when a dead-letter publish was not confirmed.
const DEAD_LETTER_RETRY_DELAY: Duration = Duration::from_secs(1);
/// How long a stopping consumer waits for the deliveries it is handling (a submit waits at
/// most `intake_wait` for a slot; a requeue pauses at most a second).
const HANDLER_GRACE: Duration = Duration::from_secs(10);

/// Why a broker message was dead-lettered (the reason class; the header carries a sentence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeadLetterReason {
    /// Neither the configured header nor the `message_id` property carried an id.
    MissingMessageId,
    /// The id is too long or contains a character outside visible ASCII.
    InvalidMessageId,
    /// The tenant header is too long or contains a character outside visible ASCII.
    InvalidTenant,
    /// The body is over `[http] max_body_bytes`.
    BodyTooLarge,
    /// The id was already used with a different payload.
    PayloadMismatch,
    /// The consumer's effect cannot use the payload (an email without a recipient).
    UnusablePayload,
    /// The `content_type` property cannot be stored and sent on (a control character).
    InvalidContentType,
    /// The rendered idempotency key is longer than the provider accepts.
    KeyTooLong,
}

impl DeadLetterReason {
    /// The name used in counts and the `dead_letters` table.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::MissingMessageId => "missing_message_id",
            DeadLetterReason::InvalidMessageId => "invalid_message_id",
            DeadLetterReason::InvalidTenant => "invalid_tenant",
            DeadLetterReason::BodyTooLarge => "body_too_large",
            DeadLetterReason::PayloadMismatch => "payload_mismatch",
            DeadLetterReason::UnusablePayload => "unusable_payload",
            DeadLetterReason::InvalidContentType => "invalid_content_type",
            DeadLetterReason::KeyTooLong => "key_too_long",
        }
    }
}

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

/// The live state of one AMQP consumer: whether it is connected and consuming, the last
/// connection error, and how many messages it dead-lettered, by reason, since start.
#[derive(Debug)]
pub struct AmqpConsumerState {
    name: String,
    connected: AtomicBool,
    sessions: AtomicU64,
    last_error: Mutex<Option<String>>,
    dead_lettered: Mutex<BTreeMap<DeadLetterReason, u64>>,
}

impl AmqpConsumerState {
    fn new(name: &str) -> Self {
        AmqpConsumerState {
            name: name.to_string(),
            connected: AtomicBool::new(false),
            sessions: AtomicU64::new(0),
            last_error: Mutex::new(None),
            dead_lettered: Mutex::new(BTreeMap::new()),
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
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Messages dead-lettered by this process since it started, by reason. The store keeps
    /// the durable count (`report`'s `dead_lettered`).
    pub fn dead_lettered(&self) -> BTreeMap<DeadLetterReason, u64> {
        self.dead_lettered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_error(&self, e: Option<String>) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = e;
    }

    fn count(&self, reason: DeadLetterReason) {
        *self
            .dead_lettered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(reason)
            .or_default() += 1;
    }
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
        for c in config.consumers.iter().filter(|c| c.source == Source::Amqp) {
            let state = Arc::new(AmqpConsumerState::new(&c.name));
            states.push(state.clone());
            let ctx = Arc::new(Ctx {
                claimer: claimer.clone(),
                config: c.clone(),
                max_body_bytes: config.http.max_body_bytes,
                state,
            });
            let rx = stop.subscribe();
            let span = info_span!("amqp", consumer = %c.name, queue = %c.queue);
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
        self.states.iter().find(|s| s.name == name)
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
            .map(|s| s.name.clone())
            .collect()
    }

    /// The readiness check: `Ok` when every AMQP consumer is consuming, else one line naming
    /// the disconnected consumers and why (for `/readyz`).
    pub fn check(&self) -> Result<(), String> {
        let down: Vec<String> = self
            .states
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
            Err(format!(
                "not consuming from the broker: {}",
                down.join("; ")
            ))
        }
    }

    /// Stops consuming: cancels every consumer (no new deliveries), lets deliveries already
    /// being handled finish (ack, requeue or dead-letter; at most 10 s), then closes the
    /// connections; anything unacknowledged goes back to the queue. Idempotent.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let tasks: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for t in tasks {
            // Each task waits for its handlers itself; allow for closing too.
            let abort = t.abort_handle();
            if tokio::time::timeout(HANDLER_GRACE + Duration::from_secs(5), t)
                .await
                .is_err()
            {
                warn!("AMQP consumer task did not stop in time; aborting it");
                abort.abort();
            }
        }
    }
}

impl Drop for AmqpIntake {
    fn drop(&mut self) {
        // Dropped without `stop`: the tasks still cancel and close on their own.
        let _ = self.stop.send(true);
    }
}

/// How a session with the broker ended.
enum SessionEnd {
    /// Shutdown was asked for.
    Stopped,
    /// The connection or the consumer went away.
    Lost(String),
}

/// Connects, consumes, reconnects with backoff, until stopped.
async fn run_consumer(ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>) {
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
        let mut consumed = false;
        match session(&ctx, &mut stop, &mut consumed).await {
            Ok(SessionEnd::Stopped) => {
                info!("AMQP consumer stopped");
                return;
            }
            Ok(SessionEnd::Lost(why)) => {
                warn!(reason = %why, "lost the broker connection; reconnecting");
                ctx.state.set_error(Some(why));
            }
            Err(e) => {
                warn!(error = %e, "broker session failed; retrying");
                ctx.state.set_error(Some(e.to_string()));
            }
        }
        ctx.state.connected.store(false, Ordering::SeqCst);
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

/// Declares the dead-letter exchange (durable fanout), `<queue>.dead` bound to it, and the
/// durable work queue dead-lettering to it. Idempotent; a queue that exists with other
/// arguments is an error the broker names.
async fn declare(ch: &Channel, c: &ConsumerConfig) -> Result<(), AmqpError> {
    let dlx = short(&c.dead_letter_exchange)?;
    let dead_name = format!("{}.dead", c.queue);
    let dead = short(&dead_name)?;
    let queue = short(&c.queue)?;
    ch.exchange_declare(
        dlx.clone(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .map_err(broker(format!(
        "declare exchange {:?}",
        c.dead_letter_exchange
    )))?;
    ch.queue_declare(
        dead.clone(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .map_err(broker(format!("declare queue {dead_name:?}")))?;
    ch.queue_bind(
        dead,
        dlx,
        ShortString::from(""),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(broker(format!(
        "bind queue {dead_name:?} to {:?}",
        c.dead_letter_exchange
    )))?;
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(c.dead_letter_exchange.as_str().into()),
    );
    ch.queue_declare(queue, QueueDeclareOptions::durable(), args)
        .await
        .map_err(broker(format!("declare queue {:?}", c.queue)))?;
    Ok(())
}

/// One connection: set up, consume until stopped or lost, then clean up.
async fn session(
    ctx: &Arc<Ctx>,
    stop: &mut watch::Receiver<bool>,
    consumed: &mut bool,
) -> Result<SessionEnd, AmqpError> {
    let c = &ctx.config;
    let instance = ctx.claimer.instance().to_string();
    let props = ConnectionProperties::default()
        .with_connection_name(LongString::from(format!("claimd {instance} {}", c.name)));
    let connect = tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(&c.amqp_url, props));
    // A stop while connecting (broker unreachable) does not wait for the connect timeout.
    let conn = tokio::select! {
        r = connect => r
            .map_err(|_| AmqpError::ConnectTimeout(CONNECT_TIMEOUT))?
            .map_err(AmqpError::Connect)?,
        _ = stop.wait_for(|s| *s) => return Ok(SessionEnd::Stopped),
    };
    let result = consume(ctx, &conn, &instance, stop, consumed).await;
    ctx.state.connected.store(false, Ordering::SeqCst);
    if conn.status().connected() {
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            conn.close(200, ShortString::from("claimd consumer closing")),
        )
        .await;
    }
    result
}

async fn consume(
    ctx: &Arc<Ctx>,
    conn: &Connection,
    instance: &str,
    stop: &mut watch::Receiver<bool>,
    consumed: &mut bool,
) -> Result<SessionEnd, AmqpError> {
    let c = &ctx.config;
    let channel = conn
        .create_channel()
        .await
        .map_err(broker("open channel"))?;
    channel
        .basic_qos(c.prefetch, BasicQosOptions::default())
        .await
        .map_err(broker("set prefetch"))?;
    if c.declare {
        declare(&channel, c).await?;
    }
    // Dead-letter publishes go on their own channel, in confirm mode.
    let publisher = conn
        .create_channel()
        .await
        .map_err(broker("open publisher channel"))?;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(broker("enable publisher confirms"))?;
    let tag = format!("claimd-{}-{}-{:08x}", instance, c.name, fastrand::u32(..));
    let tag = short(&tag.chars().take(200).collect::<String>())?;
    let mut consumer = channel
        .basic_consume(
            short(&c.queue)?,
            tag.clone(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(broker(format!("consume from {:?}", c.queue)))?;
    ctx.state.connected.store(true, Ordering::SeqCst);
    ctx.state.sessions.fetch_add(1, Ordering::SeqCst);
    ctx.state.set_error(None);
    *consumed = true;
    info!(prefetch = c.prefetch, "consuming");

    let mut handlers = JoinSet::new();
    let end = loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break SessionEnd::Stopped,
            Some(_) = handlers.join_next(), if !handlers.is_empty() => {
                if !publisher.status().connected() {
                    // The broker closed the dead-letter channel (say, the exchange does not
                    // exist with declare = false): start over rather than requeue forever.
                    break SessionEnd::Lost(
                        "the dead-letter channel was closed by the broker".into(),
                    );
                }
            }
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    // At most `prefetch` deliveries are unacknowledged, so at most that many
                    // handlers run.
                    handlers.spawn(handle(ctx.clone(), publisher.clone(), delivery));
                }
                Some(Err(e)) => break SessionEnd::Lost(e.to_string()),
                None => break SessionEnd::Lost("the broker cancelled the consumer".into()),
            }
        }
    };
    match &end {
        SessionEnd::Stopped => {
            // No new deliveries; those already prefetched but not started go back to the
            // queue when the channel closes.
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                channel.basic_cancel(tag, BasicCancelOptions::default()),
            )
            .await;
            ctx.state.connected.store(false, Ordering::SeqCst);
            if tokio::time::timeout(HANDLER_GRACE, async {
                while handlers.join_next().await.is_some() {}
            })
            .await
            .is_err()
            {
                warn!(
                    left = handlers.len(),
                    "deliveries still being handled at shutdown; they return to the queue"
                );
            }
        }
        SessionEnd::Lost(_) => {
            // Their acknowledgements can no longer reach the broker; the broker redelivers,
            // and a committed claim makes the redelivery a duplicate.
            handlers.detach_all();
        }
    }
    drop(consumer);
    for ch in [&publisher, &channel] {
        if ch.status().connected() {
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                ch.close(200, ShortString::from("claimd consumer closing")),
            )
            .await;
        }
    }
    Ok(end)
}

/// What to do with one delivery.
enum Verdict {
    /// The claim is committed or the message is a duplicate.
    Ack,
    /// Nothing was committed, for a reason that may pass.
    Requeue {
        /// Pause before requeueing.
        delay: Duration,
        /// Why, for the log.
        why: String,
    },
    /// Bad input.
    DeadLetter {
        /// The class.
        reason: DeadLetterReason,
        /// The readable sentence for `claimd-reason`.
        sentence: String,
        /// The id as received, if any (for the record).
        message_id: Option<String>,
    },
}

/// A header's value as bytes, if it is a string (or a number, written in decimal).
fn header_bytes(props: &BasicProperties, name: &str) -> Result<Option<Vec<u8>>, String> {
    let Some(value) = props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(name).cloned())
    else {
        return Ok(None);
    };
    Ok(Some(match value {
        AMQPValue::LongString(s) => s.as_bytes().to_vec(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes().to_vec(),
        AMQPValue::ByteArray(b) => b.as_slice().to_vec(),
        AMQPValue::ShortShortInt(n) => n.to_string().into_bytes(),
        AMQPValue::ShortShortUInt(n) => n.to_string().into_bytes(),
        AMQPValue::ShortInt(n) => n.to_string().into_bytes(),
        AMQPValue::ShortUInt(n) => n.to_string().into_bytes(),
        AMQPValue::LongInt(n) => n.to_string().into_bytes(),
        AMQPValue::LongUInt(n) => n.to_string().into_bytes(),
        AMQPValue::LongLongInt(n) => n.to_string().into_bytes(),
        AMQPValue::Void => return Ok(None),
        other => {
            return Err(format!(
                "header {name:?} holds a {:?}, not a string",
                other.get_type()
            ));
        }
    }))
}

/// The message id: the configured header when present, else the `message_id` property.
fn message_id_of(props: &BasicProperties, header: &str) -> Result<Vec<u8>, String> {
    if !header.is_empty()
        && let Some(v) = header_bytes(props, header)?
    {
        return Ok(v);
    }
    Ok(props
        .message_id()
        .as_ref()
        .map(|s| s.as_str().as_bytes().to_vec())
        .unwrap_or_default())
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A readable sentence for a refused id or tenant.
fn id_sentence(e: &IdError, field: &str) -> String {
    match e {
        IdError::Missing(_) => format!("the message has no {field}"),
        IdError::TooLong { len, .. } => format!(
            "the {field} is {len} characters long; the limit is {}",
            crate::claim::MAX_MESSAGE_ID_LEN
        ),
        IdError::NotVisibleAscii { position, .. } => format!(
            "the {field} contains a space, control or non-ASCII character at position {position}; it must be 1-255 visible ASCII characters"
        ),
    }
}

/// Decides, claiming when the input is good.
async fn judge(ctx: &Ctx, d: &AmqpDelivery) -> Verdict {
    let c = &ctx.config;
    let props = &d.properties;
    let id_field = if c.message_id_header.is_empty() {
        "message id (AMQP message_id property)".to_string()
    } else {
        format!(
            "message id (header {:?} or the AMQP message_id property)",
            c.message_id_header
        )
    };
    let raw_id = match message_id_of(props, &c.message_id_header) {
        Ok(id) => id,
        Err(why) => {
            return Verdict::DeadLetter {
                reason: DeadLetterReason::InvalidMessageId,
                sentence: format!("the message id cannot be read: {why}"),
                message_id: None,
            };
        }
    };
    let shown_id = (!raw_id.is_empty()).then(|| lossy(&raw_id));
    tracing::Span::current().record("message_id", shown_id.as_deref().unwrap_or(""));
    if let Err(e) = validate_message_id(&raw_id) {
        let reason = if matches!(e, IdError::Missing(_)) {
            DeadLetterReason::MissingMessageId
        } else {
            DeadLetterReason::InvalidMessageId
        };
        return Verdict::DeadLetter {
            reason,
            sentence: id_sentence(&e, &id_field),
            message_id: shown_id,
        };
    }
    let tenant = if c.tenant_header.is_empty() {
        Vec::new()
    } else {
        match header_bytes(props, &c.tenant_header) {
            Ok(t) => t.unwrap_or_default(),
            Err(why) => {
                return Verdict::DeadLetter {
                    reason: DeadLetterReason::InvalidTenant,
                    sentence: format!("the tenant cannot be read: {why}"),
                    message_id: shown_id,
                };
            }
        }
    };
    if let Err(e) = validate_tenant(&tenant) {
        return Verdict::DeadLetter {
            reason: DeadLetterReason::InvalidTenant,
            sentence: id_sentence(&e, &format!("tenant (header {:?})", c.tenant_header)),
            message_id: shown_id,
        };
    }
    if d.data.len() > ctx.max_body_bytes {
        return Verdict::DeadLetter {
            reason: DeadLetterReason::BodyTooLarge,
            sentence: format!(
                "the body is {} bytes, over the limit of {} bytes ([http] max_body_bytes)",
                d.data.len(),
                ctx.max_body_bytes
            ),
            message_id: shown_id,
        };
    }
    let delivery = Delivery {
        consumer: c.name.clone(),
        tenant,
        message_id: raw_id,
        payload: d.data.clone(),
        content_type: props
            .content_type()
            .as_ref()
            .map(|s| s.as_str().as_bytes().to_vec())
            .unwrap_or_default(),
    };
    match ctx.claimer.submit(delivery).await {
        Ok(Accepted::New(_)) => Verdict::Ack,
        Ok(Accepted::Duplicate(claim)) => {
            debug!(state = %claim.state, "duplicate delivery; acknowledging");
            Verdict::Ack
        }
        Err(SubmitError::BadId(e)) => Verdict::DeadLetter {
            reason: DeadLetterReason::InvalidMessageId,
            sentence: e.to_string(),
            message_id: shown_id,
        },
        Err(SubmitError::Conflict { claim, message_id }) => Verdict::DeadLetter {
            reason: DeadLetterReason::PayloadMismatch,
            sentence: format!(
                "message id {message_id:?} was already used with a different payload (claim received {}, now {}); publish a new message under a new message id",
                claim.received_utc.to_rfc3339(),
                claim.state
            ),
            message_id: shown_id,
        },
        Err(SubmitError::BadContentType(why)) => Verdict::DeadLetter {
            reason: DeadLetterReason::InvalidContentType,
            sentence: format!("the content_type property cannot be used: {why}"),
            message_id: shown_id,
        },
        Err(e @ SubmitError::TenantNotKeyed { .. }) => Verdict::DeadLetter {
            reason: DeadLetterReason::InvalidTenant,
            sentence: e.to_string(),
            message_id: shown_id,
        },
        Err(e @ SubmitError::KeyTooLong { .. }) => Verdict::DeadLetter {
            reason: DeadLetterReason::KeyTooLong,
            sentence: e.to_string(),
            message_id: shown_id,
        },
        Err(SubmitError::BadPayload(why)) => Verdict::DeadLetter {
            reason: DeadLetterReason::UnusablePayload,
            sentence: format!("the payload cannot be used by consumer {:?}: {why}", c.name),
            message_id: shown_id,
        },
        Err(SubmitError::Store(e)) => Verdict::Requeue {
            delay: STORE_RETRY_DELAY,
            why: format!("claim not committed: {e}"),
        },
        Err(e @ SubmitError::Busy(_)) => Verdict::Requeue {
            delay: BUSY_RETRY_DELAY,
            why: e.to_string(),
        },
        Err(e @ SubmitError::Interrupted) => Verdict::Requeue {
            delay: STORE_RETRY_DELAY,
            why: e.to_string(),
        },
        Err(e @ SubmitError::ShuttingDown) => Verdict::Requeue {
            delay: Duration::ZERO,
            why: e.to_string(),
        },
        Err(e @ SubmitError::UnknownConsumer(_)) => {
            // Cannot happen: tasks exist only for configured consumers.
            error!(error = %e, "delivery for a consumer the claimer does not know");
            Verdict::Requeue {
                delay: STORE_RETRY_DELAY,
                why: e.to_string(),
            }
        }
    }
}

/// Handles one delivery to the end: ack, requeue or dead-letter.
#[instrument(skip_all, fields(consumer = %ctx.config.name, message_id = tracing::field::Empty, redelivered = d.redelivered))]
async fn handle(ctx: Arc<Ctx>, publisher: Channel, d: AmqpDelivery) {
    match judge(&ctx, &d).await {
        Verdict::Ack => ack(&d).await,
        Verdict::Requeue { delay, why } => {
            debug!(reason = %why, "requeueing");
            requeue(&d, delay, &why).await;
        }
        Verdict::DeadLetter {
            reason,
            sentence,
            message_id,
        } => {
            if let Err(why) = dead_letter(&ctx.config, &publisher, &d, &sentence).await {
                warn!(error = %why, "dead-letter publish not confirmed; requeueing the message");
                requeue(&d, DEAD_LETTER_RETRY_DELAY, &why).await;
                return;
            }
            // Counted before the ack: if the store cannot count it, the message comes back
            // and is dead-lettered (and counted) again, so the store's count never falls short
            // of the bad messages received; at worst the dead-letter queue holds a copy more.
            if let Err(e) = ctx
                .claimer
                .store()
                .record_dead_letter(&ctx.config.name, reason.as_str(), message_id.as_deref())
                .await
            {
                let why = format!("cannot count the dead letter in the store: {e}");
                warn!(error = %e, "store unavailable; requeueing the dead-lettered message");
                requeue(&d, STORE_RETRY_DELAY, &why).await;
                return;
            }
            warn!(reason = reason.as_str(), detail = %sentence, "dead-lettered a bad message");
            ack(&d).await;
            ctx.state.count(reason);
        }
    }
}

async fn ack(d: &AmqpDelivery) {
    match d.acker.ack(BasicAckOptions::default()).await {
        Ok(true) => {}
        Ok(false) | Err(_) => {
            // The channel is gone: the broker redelivers; a committed claim makes that a
            // duplicate, a dead-lettered message is dead-lettered again.
            warn!("acknowledgement did not reach the broker; it will redeliver the message");
        }
    }
}

async fn requeue(d: &AmqpDelivery, delay: Duration, why: &str) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let options = BasicNackOptions {
        multiple: false,
        requeue: true,
    };
    if !matches!(d.acker.nack(options).await, Ok(true)) {
        debug!(reason = %why, "nack did not reach the broker; the message returns to the queue with the channel");
    }
}

/// Publishes `d` to the dead-letter exchange, unchanged plus the reason header, and waits for
/// the broker's confirm. Unroutable (no queue bound) counts as a failure.
async fn dead_letter(
    c: &ConsumerConfig,
    publisher: &Channel,
    d: &AmqpDelivery,
    sentence: &str,
) -> Result<(), String> {
    let mut headers = d.properties.headers().clone().unwrap_or_default();
    headers.insert(REASON_HEADER.into(), AMQPValue::LongString(sentence.into()));
    let properties = d.properties.clone().with_headers(headers);
    let exchange = short(&c.dead_letter_exchange).map_err(|e| e.to_string())?;
    let confirm = publisher
        .basic_publish(
            exchange,
            d.routing_key.clone(),
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            &d.data,
            properties,
        )
        .await
        .map_err(|e| format!("publish to {:?}: {e}", c.dead_letter_exchange))?
        .await
        .map_err(|e| format!("confirm from {:?}: {e}", c.dead_letter_exchange))?;
    if !confirm.is_ack() {
        return Err(format!(
            "the broker refused the dead letter (nack) on {:?}",
            c.dead_letter_exchange
        ));
    }
    if let Some(returned) = confirm.take_message() {
        return Err(format!(
            "exchange {:?} has no queue bound ({} {})",
            c.dead_letter_exchange, returned.reply_code, returned.reply_text
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_header_when_configured_else_the_property() {
        let mut h = FieldTable::default();
        h.insert("x-id".into(), AMQPValue::LongString("from-header".into()));
        let props = BasicProperties::default()
            .with_message_id("from-property".into())
            .with_headers(h);
        assert_eq!(message_id_of(&props, "x-id").unwrap(), b"from-header");
        assert_eq!(message_id_of(&props, "").unwrap(), b"from-property");
        assert_eq!(message_id_of(&props, "x-other").unwrap(), b"from-property");
        assert!(
            message_id_of(&BasicProperties::default(), "")
                .unwrap()
                .is_empty()
        );
        let mut n = FieldTable::default();
        n.insert("x-id".into(), AMQPValue::LongLongInt(42));
        let props = BasicProperties::default().with_headers(n);
        assert_eq!(message_id_of(&props, "x-id").unwrap(), b"42");
        let mut t = FieldTable::default();
        t.insert("x-id".into(), AMQPValue::Boolean(true));
        let props = BasicProperties::default().with_headers(t);
        assert!(message_id_of(&props, "x-id").is_err());
    }

    #[test]
    fn sentences_say_what_is_wrong() {
        let s = id_sentence(
            &validate_message_id(&[b'k'; 300]).unwrap_err(),
            "message id",
        );
        assert_eq!(s, "the message id is 300 characters long; the limit is 255");
        let s = id_sentence(&validate_message_id(b"a b").unwrap_err(), "message id");
        assert!(s.contains("position 1"), "{s}");
        assert_eq!(
            id_sentence(&validate_message_id(b"").unwrap_err(), "message id"),
            "the message has no message id"
        );
    }
}
