//! Outcome events to an HTTP endpoint, signed with Standard Webhooks (`webhook-id` = the
//! event's id, `webhook-timestamp`, `webhook-signature` = `v1,<base64 HMAC-SHA256>` over
//! `id.timestamp.body`). A `2xx` confirms an event; anything else, or no answer, leaves it for
//! a later round with a backoff (`Retry-After` honoured). Each request goes through a
//! [`Destination`], the breaker and pace provider calls use: an endpoint that is down is
//! probed, not flooded, and a `429` slows the relay down.

use super::event::{body_bytes, event_id, webhook_headers};
use super::{SendError, Sink};
use crate::config::OutcomesConfig;
use crate::engine::destination::{Destination, HeldBy, Verdict};
use crate::provider::effect::parse_retry_after;
use crate::store::outbox::OutcomeEvent;
use async_trait::async_trait;
use reqwest::Client;
use tokio::time::Instant;

/// An HTTP destination.
pub struct HttpSink {
    url: String,
    secret: String,
    client: Client,
    destination: Destination,
    timeout: std::time::Duration,
}

impl HttpSink {
    /// The destination `config` names.
    pub fn new(config: &OutcomesConfig) -> Result<Self, String> {
        let client = crate::provider::tls::http_client_builder()
            .timeout(config.timeout.0)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(HttpSink {
            url: config.url.clone(),
            secret: config.secret.clone().unwrap_or_default(),
            client,
            destination: Destination::new(None),
            timeout: config.timeout.0,
        })
    }

    /// Sends one event, through the destination's breaker and pace.
    async fn send_one(&self, e: &OutcomeEvent) -> Result<(), SendError> {
        let pass = self
            .destination
            .admit(Instant::now() + self.timeout)
            .await
            .map_err(|held| SendError {
                message: held_sentence(held.by).to_string(),
                retry_after: Some(held.until.saturating_duration_since(Instant::now())),
            })?;
        let body = body_bytes(e);
        let id = event_id(e);
        let headers =
            match webhook_headers(&self.secret, &id, chrono::Utc::now().timestamp(), &body) {
                Ok(h) => h,
                Err(err) => {
                    self.destination.record(pass, Verdict::Neutral);
                    return Err(SendError::new(format!("cannot sign: {err}")));
                }
            };
        let mut request = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        for (name, value) in headers {
            request = request.header(name, value);
        }
        match request.body(body).send().await {
            Ok(r) if r.status().is_success() => {
                self.destination.record(pass, Verdict::Answered);
                Ok(())
            }
            Ok(r) => {
                let status = r.status().as_u16();
                let retry_after = parse_retry_after(
                    r.headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok()),
                );
                let verdict = match status {
                    429 => Verdict::RateLimited { retry_after },
                    s if s >= 500 => Verdict::Failed { retry_after },
                    _ => Verdict::Answered,
                };
                self.destination.record(pass, verdict);
                Err(SendError {
                    message: format!("endpoint answered {status}"),
                    retry_after,
                })
            }
            Err(err) => {
                self.destination
                    .record(pass, Verdict::Failed { retry_after: None });
                Err(SendError::new(format!("endpoint unreachable: {err}")))
            }
        }
    }
}

/// Why an event was not sent, in the destination's words (not the provider's: the breaker is
/// the same kind, the thing behind it is the outcome endpoint).
fn held_sentence(by: HeldBy) -> &'static str {
    match by {
        HeldBy::Open => {
            "the outcome destination is failing (circuit breaker open): not sent, waiting for the next probe"
        }
        HeldBy::Probing => {
            "the outcome destination is being probed after failures: not sent, waiting for the probe's answer"
        }
        HeldBy::Pace => {
            "held back by the outcome destination's rate limit (or its Retry-After): not sent"
        }
    }
}

/// Requests in flight at once to one HTTP destination. One at a time, a backlog drained at 21
/// events a second to a receiver taking 40 ms an answer; eight at a time, 97
/// (`backlog_drain_to_a_slow_receiver`).
const IN_FLIGHT: usize = 8;

/// The end of the wave that starts at `start`: at most [`IN_FLIGHT`] events, and no claim's
/// event beside another of the same claim (a claim's events arrive in the order they were
/// written).
fn wave_end(events: &[OutcomeEvent], start: usize) -> usize {
    let mut claims = Vec::with_capacity(IN_FLIGHT);
    let mut end = start;
    while end < events.len() && end - start < IN_FLIGHT && !claims.contains(&events[end].claim_id) {
        claims.push(events[end].claim_id);
        end += 1;
    }
    end
}

#[async_trait]
impl Sink for HttpSink {
    /// Up to `IN_FLIGHT` (8) requests at once, a wave at a time, each claim's events in order;
    /// after a wave with a failure the rest of the round waits for the next (an endpoint that
    /// is down is not asked once per event). A slow endpoint ends the round at `deadline` (the
    /// round's [`super::ROUND_BUDGET`]): the rest stay unsent, untouched, for the next round,
    /// well within the relay's lease.
    async fn send(&self, events: &[OutcomeEvent], deadline: Instant) -> Vec<Result<(), SendError>> {
        let mut out = Vec::with_capacity(events.len());
        let mut start = 0;
        while start < events.len() && Instant::now() < deadline {
            let end = wave_end(events, start);
            let wave =
                futures_util::future::join_all(events[start..end].iter().map(|e| self.send_one(e)))
                    .await;
            let failed = wave.iter().find_map(|r| r.as_ref().err().cloned());
            out.extend(wave);
            start = end;
            if let Some(f) = failed {
                out.extend(events[start..].iter().map(|_| {
                    Err(SendError {
                        message: format!("not sent this round: {}", f.message),
                        retry_after: f.retry_after,
                    })
                }));
                break;
            }
        }
        out
    }

    fn stops_at_failure(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(claim_id: i64) -> OutcomeEvent {
        OutcomeEvent {
            claim_id,
            ..OutcomeEvent::default()
        }
    }

    #[test]
    fn a_wave_holds_at_most_eight_events_and_never_two_of_one_claim() {
        let events: Vec<OutcomeEvent> = (0..20).map(event).collect();
        assert_eq!(wave_end(&events, 0), 8);
        assert_eq!(wave_end(&events, 16), 20);
        let events: Vec<OutcomeEvent> = [1, 2, 3, 2, 4].into_iter().map(event).collect();
        assert_eq!(wave_end(&events, 0), 3, "claim 2's second event waits");
        assert_eq!(wave_end(&events, 3), 5);
    }
}
