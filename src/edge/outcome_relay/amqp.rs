//! Outcome events to RabbitMQ: each event published to the consumer's exchange with its
//! routing key (`{consumer}.{state}` by default), persistent, `mandatory` (an event no queue
//! takes is not confirmed), `message_id` = the event's id, on a channel with publisher
//! confirms. A chunk's events are published together, then their confirms awaited together,
//! all within one `timeout`; a broken connection is opened again on the next round.

use super::event::{event_id, write_body};
use super::{SendError, Sink, publish_and_confirm};
use crate::config::{OutcomesConfig, render_routing_key};
use crate::store::outbox::OutcomeEvent;
use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind, PublisherConfirm,
};
use std::future::Future;
use std::pin::Pin;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// A RabbitMQ destination.
pub struct AmqpSink {
    config: OutcomesConfig,
    name: String,
    open: Mutex<Option<(Connection, Channel)>>,
}

impl AmqpSink {
    /// The destination `config` names; connects on first use.
    pub fn new(config: &OutcomesConfig, instance: &str) -> Self {
        AmqpSink {
            config: config.clone(),
            name: format!("claimd {instance} outcomes"),
            open: Mutex::new(None),
        }
    }

    async fn connect(&self) -> Result<(Connection, Channel), String> {
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(self.name.clone()));
        let conn = tokio::time::timeout(
            self.config.timeout.0,
            Connection::connect(&self.config.url, props),
        )
        .await
        .map_err(|_| "connect: timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
        let ch = conn
            .create_channel()
            .await
            .map_err(|e| format!("open channel: {e}"))?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("confirm mode: {e}"))?;
        if self.config.declare.unwrap_or(true) && !self.config.exchange.is_empty() {
            ch.exchange_declare(
                short(&self.config.exchange)?,
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("declare exchange {:?}: {e}", self.config.exchange))?;
        }
        Ok((conn, ch))
    }

    /// Publishes every event of the chunk together (their frames reach the I/O loop in one
    /// go and leave in one write, not one wake-up each), then awaits their confirms together;
    /// both within `timeout`.
    async fn publish(&self, ch: &Channel, events: &[OutcomeEvent]) -> Vec<Result<(), SendError>> {
        let exchange = match short(&self.config.exchange) {
            Ok(x) => x,
            Err(e) => {
                return events
                    .iter()
                    .map(|_| Err(SendError::new(e.clone())))
                    .collect();
            }
        };
        // One deadline for the whole chunk: a broker that answers none must not hold the
        // round for `timeout` once per event.
        let deadline = Instant::now() + self.config.timeout.0;
        // The chunk's bodies in one buffer: one allocation a chunk, not one an event.
        let mut bodies = Vec::with_capacity(events.len() * 512);
        let mut ends = Vec::with_capacity(events.len());
        for e in events {
            write_body(&mut bodies, e);
            ends.push(bodies.len());
        }
        let mut states: Vec<PerState<'_>> = Vec::new();
        let mut publishes: Vec<Publish<'_>> = Vec::with_capacity(events.len());
        let mut start = 0;
        for (e, &end) in events.iter().zip(&ends) {
            let body = &bodies[start..end];
            start = end;
            let at = match states.iter().position(|s| s.state == e.state) {
                Some(at) => at,
                None => {
                    let key = render_routing_key(self.config.routing_key(), &e.consumer, &e.state);
                    states.push(PerState {
                        state: &e.state,
                        key: short(&key),
                        kind: ShortString::from(format!("claim.{}", e.state)),
                    });
                    states.len() - 1
                }
            };
            let key = match &states[at].key {
                Ok(key) => key.clone(),
                Err(why) => {
                    publishes.push(Box::pin(std::future::ready(Err(SendError::new(
                        why.clone(),
                    )))));
                    continue;
                }
            };
            let publish = ch.basic_publish(
                exchange.clone(),
                key,
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                BasicProperties::default()
                    .with_message_id(ShortString::from(event_id(e)))
                    .with_content_type(ShortString::from("application/json"))
                    .with_type(states[at].kind.clone())
                    .with_delivery_mode(2),
            );
            publishes.push(Box::pin(async move {
                publish
                    .await
                    .map_err(|err| SendError::new(format!("publish: {err}")))
            }));
        }
        let bound_to = &self.config.exchange;
        publish_and_confirm(
            publishes,
            deadline,
            |confirm| confirm,
            |c| match c {
                None => Err(SendError::new("no confirm from the broker in time")),
                Some(Err(e)) => Err(SendError::new(format!("confirm: {e}"))),
                Some(Ok(c)) if !c.is_ack() => Err(SendError::new("the broker refused it (nack)")),
                Some(Ok(c)) => match c.take_message() {
                    Some(_) => Err(SendError::new(format!(
                        "no queue is bound to exchange {bound_to:?} for its routing key: not delivered"
                    ))),
                    None => Ok(()),
                },
            },
        )
        .await
    }
}

/// One event's publish, until its frames are written.
type Publish<'a> = Pin<Box<dyn Future<Output = Result<PublisherConfirm, SendError>> + Send + 'a>>;

/// The routing key and `type` of one state, made once a chunk (a consumer's events carry a
/// handful of states), not once an event.
struct PerState<'a> {
    state: &'a str,
    key: Result<ShortString, String>,
    kind: ShortString,
}

#[async_trait]
impl Sink for AmqpSink {
    async fn send(
        &self,
        events: &[OutcomeEvent],
        _deadline: Instant,
    ) -> Vec<Result<(), SendError>> {
        let mut open = self.open.lock().await;
        let usable = open
            .as_ref()
            .is_some_and(|(c, ch)| c.status().connected() && ch.status().connected());
        if !usable {
            *open = None;
            match self.connect().await {
                Ok(pair) => *open = Some(pair),
                Err(e) => {
                    return events
                        .iter()
                        .map(|_| Err(SendError::new(e.clone())))
                        .collect();
                }
            }
        }
        let Some((_, ch)) = open.as_ref() else {
            return Vec::new();
        };
        let results = self.publish(ch, events).await;
        // A channel error closes the channel; start from a new connection next round.
        if results.iter().any(Result::is_err) && !ch.status().connected() {
            *open = None;
        }
        results
    }
}

fn short(s: &str) -> Result<ShortString, String> {
    if s.len() > 255 {
        return Err(format!(
            "{s:?} is longer than 255 bytes (AMQP short string)"
        ));
    }
    Ok(ShortString::from(s.to_string()))
}
