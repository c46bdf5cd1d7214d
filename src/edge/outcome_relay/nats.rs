//! Outcome events to NATS JetStream: each event published to its subject (the template
//! `claimd.outcomes.{consumer}.{state}` by default) with `Nats-Msg-Id` = the event's id, so
//! the stream drops a repeat after a crash within its duplicate window, and confirmed only by
//! the stream's acknowledgement (a subject no stream takes is not confirmed). A chunk's events
//! are published together, then their acknowledgements awaited together, all within one
//! `timeout`. The client reconnects on its own; a destination that never connected is
//! connected again on the next round.

use super::event::{event_id, write_body};
use super::{SendError, Sink, publish_and_confirm};
use crate::config::{OutcomesConfig, render_routing_key};
use crate::store::outbox::OutcomeEvent;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishAckFuture};
use async_trait::async_trait;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// A NATS JetStream destination.
pub struct NatsSink {
    config: OutcomesConfig,
    name: String,
    open: Mutex<Option<jetstream::Context>>,
}

impl NatsSink {
    /// The destination `config` names; connects on first use.
    pub fn new(config: &OutcomesConfig, instance: &str) -> Self {
        NatsSink {
            config: config.clone(),
            name: format!("claimd {instance} outcomes"),
            open: Mutex::new(None),
        }
    }

    async fn connect(&self) -> Result<jetstream::Context, String> {
        let client = async_nats::ConnectOptions::new()
            .name(&self.name)
            .connection_timeout(self.config.timeout.0)
            .connect(self.config.url.as_str())
            .await
            .map_err(|e| format!("connect: {}", crate::store::redact_url(&e.to_string())))?;
        let mut js = jetstream::new(client);
        js.set_timeout(self.config.timeout.0);
        Ok(js)
    }

    async fn publish(
        &self,
        js: &jetstream::Context,
        events: &[OutcomeEvent],
    ) -> Vec<Result<(), SendError>> {
        let deadline = Instant::now() + self.config.timeout.0;
        let mut publishes: Vec<Publish<'_>> = Vec::with_capacity(events.len());
        for e in events {
            let subject = render_routing_key(self.config.subject(), &e.consumer, &e.state);
            let mut body = Vec::with_capacity(512);
            write_body(&mut body, e);
            let mut headers = HeaderMap::new();
            headers.insert("Nats-Msg-Id", event_id(e).as_str());
            headers.insert("Content-Type", "application/json");
            headers.insert("Claimd-Event-Type", format!("claim.{}", e.state).as_str());
            publishes.push(Box::pin(async move {
                js.publish_with_headers(subject, headers, body.into())
                    .await
                    .map_err(|err| SendError::new(format!("publish: {err}")))
            }));
        }
        publish_and_confirm(
            publishes,
            deadline,
            IntoFuture::into_future,
            |ack| match ack {
                None => Err(SendError::new("no acknowledgement from a stream in time")),
                Some(Err(e)) => Err(SendError::new(format!(
                    "not acknowledged by a stream (does a stream take the subject?): {e}"
                ))),
                Some(Ok(_)) => Ok(()),
            },
        )
        .await
    }
}

/// One event's publish, until it is written to the client.
type Publish<'a> = Pin<Box<dyn Future<Output = Result<PublishAckFuture, SendError>> + Send + 'a>>;

#[async_trait]
impl Sink for NatsSink {
    async fn send(
        &self,
        events: &[OutcomeEvent],
        _deadline: Instant,
    ) -> Vec<Result<(), SendError>> {
        let mut open = self.open.lock().await;
        if open.is_none() {
            match self.connect().await {
                Ok(js) => *open = Some(js),
                Err(e) => {
                    return events
                        .iter()
                        .map(|_| Err(SendError::new(e.clone())))
                        .collect();
                }
            }
        }
        let Some(js) = open.as_ref() else {
            return Vec::new();
        };
        self.publish(js, events).await
    }

    /// A server that is down is not asked once per event.
    fn stops_at_failure(&self) -> bool {
        true
    }
}
