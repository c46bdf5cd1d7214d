//! The provider's signed events in the hostile mode: for each payment the hostile proxy
//! answered `processing`, first (once its claim is `pending` with that object's id) three
//! look-alike events about objects that are *not* the claim's own, then the genuine
//! `succeeded` event of its own object:
//!
//! - **another tenant's** object with the same message id: its key names tenant `initech`,
//!   and its metadata has no tenant field (an integration that does not write it);
//! - **another consumer's** object with the same tenant and message id (`refunds`: one
//!   provider account delivers every event to every endpoint);
//! - **another object** carrying exactly the claim's metadata (the same order twice).
//!
//! Each look-alike has an id of its own (`la_…`, never an object the sandbox created) and says
//! `failed` or `succeeded`; it must be recorded and never applied. Events are signed with the
//! payments consumer's secret (`Stripe-Signature`) and posted to any worker, again on a
//! connection error or a `5xx` (workers are killed, the database goes away) until answered.

use super::hostile::{PendingObject, metadata};
use claimd::domain::claim::ClaimState;
use claimd::provider::provider_events::signature::sign_stripe;
use claimd::store::Store;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The payments consumer's signing secret in the hostile mode.
pub const SECRET: &str = "whsec_chaos_hostile_provider";

/// The prefix of every look-alike object's id.
pub const LOOKALIKE_PREFIX: &str = "la_";

/// What was sent and what the workers answered.
#[derive(Debug, Default)]
pub struct EventCounts {
    /// Genuine events delivered (answered `2xx`).
    pub genuine: AtomicUsize,
    /// Look-alike events delivered.
    pub lookalikes: AtomicUsize,
    /// Events never answered `2xx` within two minutes (or refused).
    pub undelivered: AtomicUsize,
    /// Look-alike events by the `result` the worker answered (`settled`, `unknown_object`, ...).
    pub lookalike_results: Mutex<HashMap<String, usize>>,
    /// The claims (tenant, message id) that were sent look-alikes.
    pub targets: Mutex<Vec<(String, String)>>,
    /// Of those, the claims a look-alike was answered `settled` for: applied.
    pub settled: Mutex<Vec<(String, String, String)>>,
}

/// The running sender.
pub struct EventDriver {
    pub counts: Arc<EventCounts>,
    task: tokio::task::JoinHandle<()>,
}

impl EventDriver {
    /// Sends the events of each object announced on `rx` to the workers on `ports`.
    pub fn start(
        mut rx: mpsc::UnboundedReceiver<PendingObject>,
        ports: Vec<u16>,
        store: Store,
        seed: u64,
        lookalikes: bool,
    ) -> EventDriver {
        let counts = Arc::new(EventCounts::default());
        let c = counts.clone();
        let task = tokio::spawn(async move {
            let client = claimd::provider::tls::http_client_builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap();
            let next = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            let mut n = 0u64;
            while let Some(object) = rx.recv().await {
                n += 1;
                let (client, ports, store, c, next) = (
                    client.clone(),
                    ports.clone(),
                    store.clone(),
                    c.clone(),
                    next.clone(),
                );
                let sender = Sender {
                    client,
                    ports,
                    next,
                    counts: c,
                    seed,
                };
                tasks.push(tokio::spawn(async move {
                    sender.object(&store, object, n, lookalikes).await;
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
        });
        EventDriver { counts, task }
    }

    /// Waits until every announced object's events were sent (the proxy's sender must be
    /// dropped first, or this waits for ever).
    pub async fn finish(self) -> Arc<EventCounts> {
        let _ = self.task.await;
        self.counts
    }
}

struct Sender {
    client: reqwest::Client,
    ports: Vec<u16>,
    next: Arc<AtomicUsize>,
    counts: Arc<EventCounts>,
    seed: u64,
}

impl Sender {
    async fn object(&self, store: &Store, o: PendingObject, n: u64, lookalikes: bool) {
        // Look-alikes only to a claim that holds its own object's id: evidence about another
        // object can then be told from its own by id alone, whatever the matching rule.
        if lookalikes && self.wait_pending(store, &o).await {
            self.counts
                .targets
                .lock()
                .unwrap()
                .push((o.tenant.clone(), o.message_id.clone()));
            let cases = [
                (
                    format!("payments:initech:{}", o.message_id),
                    "payments",
                    None,
                ),
                (
                    format!("refunds:{}:{}", o.tenant, o.message_id),
                    "refunds",
                    Some(o.tenant.as_str()),
                ),
                (o.key.clone(), "payments", Some(o.tenant.as_str())),
            ];
            for (i, (key, consumer, tenant)) in cases.into_iter().enumerate() {
                let status = if (n + i as u64).is_multiple_of(3) {
                    "succeeded"
                } else {
                    "failed"
                };
                let object = json!({
                    "id": format!("{LOOKALIKE_PREFIX}{}_{n}_{i}", self.seed),
                    "status": status,
                    "metadata": metadata(&key, consumer, tenant, &o.message_id),
                });
                let id = format!("evt_la_{}_{n}_{i}", self.seed);
                let object_id = object["id"].as_str().unwrap_or_default().to_string();
                if let Some(result) = self.deliver(&id, status, object).await {
                    self.counts.lookalikes.fetch_add(1, Ordering::Relaxed);
                    if result == "settled" {
                        self.counts.settled.lock().unwrap().push((
                            o.tenant.clone(),
                            o.message_id.clone(),
                            format!("{status} event about {object_id} answered settled"),
                        ));
                    }
                    *self
                        .counts
                        .lookalike_results
                        .lock()
                        .unwrap()
                        .entry(result)
                        .or_default() += 1;
                }
            }
        }
        let object = json!({
            "id": o.id,
            "status": "succeeded",
            "metadata": metadata(&o.key, "payments", Some(&o.tenant), &o.message_id),
        });
        let id = format!("evt_{}_{n}", self.seed);
        if self.deliver(&id, "succeeded", object).await.is_some() {
            self.counts.genuine.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits (up to 10 s) until the claim is `pending` with the object's id.
    async fn wait_pending(&self, store: &Store, o: &PendingObject) -> bool {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(c)) = store.get("payments", &o.tenant, &o.message_id).await {
                if c.state == ClaimState::Pending && c.provider_id.as_deref() == Some(&o.id) {
                    return true;
                }
                if c.state.is_terminal() {
                    return false;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Posts one signed event until a worker answers it `2xx`; the answer's `result`.
    async fn deliver(&self, id: &str, status: &str, object: Value) -> Option<String> {
        let kind = match status {
            "succeeded" => "payment_intent.succeeded",
            _ => "payment_intent.payment_failed",
        };
        let body = json!({"id": id, "type": kind, "data": {"object": object}}).to_string();
        let end = Instant::now() + Duration::from_secs(120);
        while Instant::now() < end {
            let port = self.ports[self.next.fetch_add(1, Ordering::Relaxed) % self.ports.len()];
            let signature = sign_stripe(SECRET, chrono::Utc::now().timestamp(), body.as_bytes());
            let sent = self
                .client
                .post(format!(
                    "http://127.0.0.1:{port}/v1/provider-events/payments"
                ))
                .header("content-type", "application/json")
                .header("stripe-signature", signature)
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => {
                    let v: Value = r.json().await.unwrap_or_default();
                    return Some(v["result"].as_str().unwrap_or("?").to_string());
                }
                Ok(r) if r.status().is_client_error() => {
                    eprintln!(
                        "provider event {id} refused: {} {}",
                        r.status(),
                        r.text().await.unwrap_or_default()
                    );
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        self.counts.undelivered.fetch_add(1, Ordering::Relaxed);
        None
    }
}
