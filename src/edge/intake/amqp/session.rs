//! One consumer's life with the broker: connect, declare the topology, consume with manual
//! acknowledgements (one handler task per delivery, at most `prefetch`), reconnect with
//! backoff until stopped.

use super::*;
use broker::SessionEnd;

/// Connects, consumes, reconnects with backoff, until stopped.
/// The consumer's broker guard lives as long as this task: started at the first session,
/// kept across reconnections.
pub(super) async fn run_consumer(ctx: Arc<Ctx>, stop: watch::Receiver<bool>) {
    let state = ctx.state.clone();
    let guard: Arc<tokio::sync::Mutex<Option<Guarded>>> = Arc::default();
    broker::run_sessions(&state, "RabbitMQ", stop, |mut stop| {
        let (ctx, guard) = (ctx.clone(), guard.clone());
        async move {
            let mut consumed = false;
            let mut guard = guard.lock().await;
            let end = match &*guard {
                Some(g) => session(&ctx, g, &mut stop, &mut consumed).await,
                None => match super::guard::start(&ctx.amqp.url).await {
                    Ok(g) => session(&ctx, guard.insert(g), &mut stop, &mut consumed).await,
                    Err(e) => Err(e),
                },
            };
            (end, consumed)
        }
    })
    .await
}

/// A running guard and the URL lapin connects to through it.
type Guarded = (crate::edge::intake::guard::Guard, lapin::uri::AMQPUri);

/// Declares the dead-letter exchange (durable fanout), `<queue>.dead` bound to it, and the
/// durable work queue dead-lettering to it. Idempotent; a queue that exists with other
/// arguments is an error the broker names.
pub(super) async fn declare(ch: &Channel, c: &AmqpSourceConfig) -> Result<(), AmqpError> {
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
pub(super) async fn session(
    ctx: &Arc<Ctx>,
    (guard, uri): &Guarded,
    stop: &mut watch::Receiver<bool>,
    consumed: &mut bool,
) -> Result<SessionEnd, AmqpError> {
    let c = &ctx.config;
    let instance = ctx.claimer.instance().to_string();
    let props = ConnectionProperties::default()
        .with_connection_name(LongString::from(format!("claimd {instance} {}", c.name)));
    let _stale = guard.take_error();
    let connect =
        tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect_uri(uri.clone(), props));
    // A stop while connecting (broker unreachable) does not wait for the connect timeout.
    let conn = tokio::select! {
        r = connect => r
            .map_err(|_| AmqpError::ConnectTimeout(CONNECT_TIMEOUT))?
            // lapin saw the guard close; the guard knows why (the broker unreachable, TLS).
            .map_err(|e| match guard.take_error() {
                Some(why) => AmqpError::Guard(format!("cannot connect to the broker: {why}")),
                None => AmqpError::Connect(e),
            })?,
        _ = stop.wait_for(|s| *s) => return Ok(SessionEnd::Stopped),
    };
    let result = consume(ctx, &conn, &instance, stop, consumed).await;
    ctx.state.disconnected();
    if conn.status().connected() {
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            conn.close(200, ShortString::from("claimd consumer closing")),
        )
        .await;
    }
    result
}

pub(super) async fn consume(
    ctx: &Arc<Ctx>,
    conn: &Connection,
    instance: &str,
    stop: &mut watch::Receiver<bool>,
    consumed: &mut bool,
) -> Result<SessionEnd, AmqpError> {
    let (c, a) = (&ctx.config, &ctx.amqp);
    let channel = conn
        .create_channel()
        .await
        .map_err(broker("open channel"))?;
    channel
        .basic_qos(a.prefetch, BasicQosOptions::default())
        .await
        .map_err(broker("set prefetch"))?;
    if a.declare {
        declare(&channel, a).await?;
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
            short(&a.queue)?,
            tag.clone(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(broker(format!("consume from {:?}", a.queue)))?;
    ctx.state.consuming();
    *consumed = true;
    info!(prefetch = a.prefetch, "consuming");

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
            ctx.state.disconnected();
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
