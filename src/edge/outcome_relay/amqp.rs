//! Outcome events to RabbitMQ: each event published to the consumer's exchange with its
//! routing key (`{consumer}.{state}` by default), persistent, `mandatory` (an event no queue
//! takes is not confirmed), `message_id` = the event's id, on a channel with publisher
//! confirms. A round's events are published together, then their confirms awaited within one
//! `timeout`; a broken connection is opened again on the next round.

use super::event::{body_bytes, event_id};
use super::{SendError, Sink};
use crate::config::{OutcomesConfig, render_routing_key};
use crate::store::outbox::OutcomeEvent;
use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::Mutex;

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

    /// Publishes every event, then waits for each confirm (within `timeout`).
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
        let mut pending = Vec::with_capacity(events.len());
        for e in events {
            let key = render_routing_key(self.config.routing_key(), &e.consumer, &e.state);
            let published = match short(&key) {
                Ok(key) => ch
                    .basic_publish(
                        exchange.clone(),
                        key,
                        BasicPublishOptions {
                            mandatory: true,
                            immediate: false,
                        },
                        &body_bytes(e),
                        BasicProperties::default()
                            .with_message_id(ShortString::from(event_id(e)))
                            .with_content_type(ShortString::from("application/json"))
                            .with_type(ShortString::from(format!("claim.{}", e.state)))
                            .with_delivery_mode(2),
                    )
                    .await
                    .map_err(|err| SendError::new(format!("publish: {err}"))),
                Err(why) => Err(SendError::new(why)),
            };
            pending.push(published);
        }
        // One deadline for the whole batch: the confirms arrive together, and a broker that
        // answers none must not hold the round for `timeout` once per event.
        let deadline = tokio::time::Instant::now() + self.config.timeout.0;
        let mut out = Vec::with_capacity(events.len());
        for p in pending {
            out.push(match p {
                Ok(confirm) => match tokio::time::timeout_at(deadline, confirm).await {
                    Err(_) => Err(SendError::new("no confirm from the broker in time")),
                    Ok(Err(e)) => Err(SendError::new(format!("confirm: {e}"))),
                    Ok(Ok(c)) if !c.is_ack() => Err(SendError::new("the broker refused it (nack)")),
                    Ok(Ok(c)) => match c.take_message() {
                        Some(_) => Err(SendError::new(format!(
                            "no queue is bound to exchange {:?} for its routing key: not delivered",
                            self.config.exchange
                        ))),
                        None => Ok(()),
                    },
                },
                Err(e) => Err(e),
            });
        }
        out
    }
}

#[async_trait]
impl Sink for AmqpSink {
    async fn send(&self, events: &[OutcomeEvent]) -> Vec<Result<(), SendError>> {
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
