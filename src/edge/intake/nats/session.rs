//! One consumer's life with the NATS server: connect, create the stream and the durable pull
//! consumer when asked (or check the existing one), pull with explicit acknowledgements (one
//! handler task per message, at most `prefetch`), reconnect with backoff until stopped.

use super::disposition::handle;
use super::{CONNECT_TIMEOUT, Ctx, HANDLER_GRACE, NatsError, jetstream};
use crate::config::NatsSourceConfig;
use crate::edge::intake::broker::{self, SessionEnd};
use crate::edge::intake::guard::Guard;
use async_nats::connection::State;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self as js, stream};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

/// Connects, pulls, reconnects with backoff, until stopped. The consumer's broker guards live
/// as long as this task: started at the first session, kept across reconnections.
pub(super) async fn run_consumer(ctx: Arc<Ctx>, stop: watch::Receiver<bool>) {
    let state = ctx.state.clone();
    let guards: Arc<tokio::sync::Mutex<Option<Guarded>>> = Arc::default();
    broker::run_sessions(&state, "NATS", stop, |mut stop| {
        let (ctx, guards) = (ctx.clone(), guards.clone());
        async move {
            let mut consumed = false;
            let mut guards = guards.lock().await;
            let end = match &*guards {
                Some(g) => session(&ctx, g, &mut stop, &mut consumed).await,
                None => match super::guard::start(&ctx.nats.url).await {
                    Ok(g) => session(&ctx, guards.insert(g), &mut stop, &mut consumed).await,
                    Err(e) => Err(e),
                },
            };
            (end, consumed)
        }
    })
    .await
}

/// The running guards and the URL the client connects to through them.
type Guarded = (Vec<Guard>, String);

/// The durable consumer's settings as claimd creates it: explicit acks, no server-side
/// delivery limit (claimd counts deliveries and dead-letters past `max_deliver` itself).
fn consumer_config(n: &NatsSourceConfig) -> pull::Config {
    pull::Config {
        durable_name: Some(n.durable.clone()),
        description: Some("claimd intake".into()),
        ack_policy: AckPolicy::Explicit,
        ack_wait: n.ack_wait.0,
        max_deliver: -1,
        filter_subject: n.subject.clone(),
        max_ack_pending: i64::from(n.prefetch),
        ..Default::default()
    }
}

/// Creates the stream (file storage, taking `subject`) unless it exists, a stream for the
/// dead-letter subject unless one takes it (`<stream>-dead`), and creates or updates the
/// durable consumer.
async fn declare(js: &js::Context, n: &NatsSourceConfig) -> Result<PullConsumer, NatsError> {
    let stream = js
        .get_or_create_stream(stream::Config {
            name: n.stream.clone(),
            subjects: vec![n.subject.clone()],
            ..Default::default()
        })
        .await
        .map_err(jetstream(format!("create stream {:?}", n.stream)))?;
    if js
        .stream_by_subject(n.dead_letter_subject.clone())
        .await
        .is_err()
    {
        let dead = format!("{}-dead", n.stream);
        js.get_or_create_stream(stream::Config {
            name: dead.clone(),
            subjects: vec![n.dead_letter_subject.clone()],
            ..Default::default()
        })
        .await
        .map_err(jetstream(format!("create stream {dead:?}")))?;
    }
    stream
        .create_consumer(consumer_config(n))
        .await
        .map_err(jetstream(format!("create consumer {:?}", n.durable)))
}

/// The existing durable consumer, refused when it would lose or hide messages.
async fn existing(js: &js::Context, n: &NatsSourceConfig) -> Result<PullConsumer, NatsError> {
    let stream = js
        .get_stream(&n.stream)
        .await
        .map_err(jetstream(format!("find stream {:?}", n.stream)))?;
    let mut consumer: PullConsumer = stream
        .get_consumer(&n.durable)
        .await
        .map_err(jetstream(format!("find consumer {:?}", n.durable)))?;
    let info = consumer
        .info()
        .await
        .map_err(jetstream(format!("read consumer {:?}", n.durable)))?;
    if info.config.ack_policy != AckPolicy::Explicit {
        return Err(NatsError::Unusable(format!(
            "consumer {:?} does not use explicit acknowledgements: a message would count as handled before its claim committed",
            n.durable
        )));
    }
    let server_limit = info.config.max_deliver;
    if server_limit > 0 && server_limit <= i64::from(n.max_deliver) {
        return Err(NatsError::Unusable(format!(
            "consumer {:?} has max_deliver {server_limit} on the server: a message past it would stay unacknowledged and unseen; set it to -1 (claimd dead-letters after max_deliver {})",
            n.durable, n.max_deliver
        )));
    }
    Ok(consumer)
}

/// One connection: set up, pull until stopped or lost, then clean up.
async fn session(
    ctx: &Arc<Ctx>,
    (guards, url): &Guarded,
    stop: &mut watch::Receiver<bool>,
    consumed: &mut bool,
) -> Result<SessionEnd, NatsError> {
    let n = &ctx.nats;
    for g in guards {
        let _stale = g.take_error();
    }
    // Servers the cluster announces are not dialled: they would bypass the guard.
    let options = async_nats::ConnectOptions::new()
        .ignore_discovered_servers()
        .name(format!(
            "claimd {} {}",
            ctx.claimer.instance(),
            ctx.config.name
        ))
        .connection_timeout(CONNECT_TIMEOUT);
    let connect = options.connect(url.as_str());
    let client = tokio::select! {
        r = connect => r.map_err(|e| match guards.iter().find_map(Guard::take_error) {
            // The client saw the guard close; the guard knows why (the server unreachable, TLS).
            Some(why) => NatsError::Connect(why),
            None => NatsError::Connect(crate::store::redact_url(&e.to_string()).to_string()),
        })?,
        _ = stop.wait_for(|s| *s) => return Ok(SessionEnd::Stopped),
    };
    let js = js::new(client.clone());
    let consumer = if n.declare {
        declare(&js, n).await?
    } else {
        existing(&js, n).await?
    };
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(usize::from(n.prefetch))
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(jetstream(format!("pull from {:?}", n.durable)))?;
    ctx.state.consuming();
    *consumed = true;
    info!(prefetch = n.prefetch, "pulling");

    let mut handlers = JoinSet::new();
    let mut watch_connection = tokio::time::interval(Duration::from_secs(1));
    let limit = usize::from(n.prefetch);
    let handler_stop = stop.clone();
    let end = loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break SessionEnd::Stopped,
            Some(_) = handlers.join_next(), if !handlers.is_empty() => {}
            _ = watch_connection.tick() => {
                // The client reconnects on its own; readiness shows the gap.
                match client.connection_state() {
                    State::Connected => if !ctx.state.connected() {
                        ctx.state.consuming();
                    },
                    _ => ctx.state.disconnected(),
                }
            }
            next = messages.next(), if handlers.len() < limit => match next {
                Some(Ok(msg)) => {
                    handlers.spawn(handle(ctx.clone(), js.clone(), msg, handler_stop.clone()));
                }
                Some(Err(e)) => {
                    use async_nats::jetstream::consumer::pull::MessagesErrorKind as K;
                    match e.kind() {
                        // Heartbeats missed while the connection is down: the client
                        // reconnects and the pull goes on.
                        K::MissingHeartbeat => {
                            warn!("NATS heartbeats missed; waiting for the connection");
                            ctx.state.disconnected();
                        }
                        _ => break SessionEnd::Lost(e.to_string()),
                    }
                }
                None => break SessionEnd::Lost("the pull ended".into()),
            }
        }
    };
    ctx.state.disconnected();
    drop(messages);
    match &end {
        SessionEnd::Stopped => {
            // Handlers holding messages give them back (nak) on the stop signal; those
            // claiming finish and acknowledge.
            if tokio::time::timeout(HANDLER_GRACE, async {
                while handlers.join_next().await.is_some() {}
            })
            .await
            .is_err()
            {
                warn!(
                    left = handlers.len(),
                    "messages still being handled at shutdown; the server redelivers them after ack_wait"
                );
            }
        }
        SessionEnd::Lost(_) => {
            // They finish on the client they hold; an ack that cannot arrive means a
            // redelivery, and a committed claim makes that a duplicate.
            handlers.detach_all();
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), client.flush()).await;
    Ok(end)
}
