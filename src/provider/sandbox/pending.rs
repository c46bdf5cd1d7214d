//! Effects that stay `processing` and the signed event that ends them: a message whose JSON
//! body has `"sandbox": "processing"` is applied with `"status": "processing"` (replayed so to
//! repeats and shown so by lookups); after [`SandboxModes::processing_for`] it becomes
//! `"succeeded"` and, when [`SandboxModes::webhook`] is set, the sandbox `POST`s a
//! Stripe-shaped event signed with `Stripe-Signature` — the flow of a bank debit or a
//! payment under review, to rehearse claimd's `pending` state on a laptop.

use super::modes::{DEFAULT_PROCESSING_FOR, SandboxWebhook};
use super::*;

/// The status of an effect that has not finished.
pub(super) const PROCESSING: &str = "processing";

/// Deliveries of one event before the sandbox gives up on the endpoint.
const WEBHOOK_TRIES: u32 = 20;

/// The longest wait between two deliveries of an event.
const WEBHOOK_MAX_WAIT: Duration = Duration::from_secs(60);

/// Ends the `processing` effect of `key` after [`SandboxModes::processing_for`], then
/// announces it. Outside a Tokio runtime nothing is scheduled (the effect stays processing).
pub(super) fn succeed_later(inner: Arc<Inner>, key: String) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let wait = inner.modes.processing_for.unwrap_or(DEFAULT_PROCESSING_FOR);
    runtime.spawn(async move {
        tokio::time::sleep(wait).await;
        // The slot is written right after the effect is made; wait for it if a zero
        // `processing_for` got here first.
        for _ in 0..100 {
            match inner.succeed(&key) {
                Ended::Now(object) => {
                    if let Some(hook) = inner.modes.webhook.clone() {
                        announce(&hook, object).await;
                    }
                    return;
                }
                Ended::Already => return,
                Ended::NotYet => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    });
}

/// What [`Inner::succeed`] found.
enum Ended {
    /// It was processing and is now succeeded: its object.
    Now(Value),
    /// It was not processing (or is gone).
    Already,
    /// Its slot is still in flight.
    NotYet,
}

impl Inner {
    /// Turns the stored `processing` object of `key` into `succeeded`, kept in the state file.
    fn succeed(&self, key: &str) -> Ended {
        let mut map = self.shard(key);
        let stored = match map.get_mut(key) {
            Some(Slot::Done(stored)) => stored,
            Some(Slot::InFlight { .. }) => return Ended::NotYet,
            None => return Ended::Already,
        };
        if stored.record.response.get("status").and_then(Value::as_str) != Some(PROCESSING) {
            return Ended::Already;
        }
        stored.record.response["status"] = json!("succeeded");
        stored.body = Bytes::from(stored.record.response.to_string());
        let record = stored.record.clone();
        drop(map);
        self.keep(&record);
        tracing::info!(key, "sandbox: a processing effect succeeded");
        Ended::Now(record.response)
    }
}

/// The keys of the effects read back still `processing` (a restart of the sandbox).
pub(super) fn still_processing(records: &[EffectRecord]) -> Vec<String> {
    records
        .iter()
        .filter(|r| r.response.get("status").and_then(Value::as_str) == Some(PROCESSING))
        .map(|r| r.key.clone())
        .collect()
}

/// Restarts the wait of each of `keys` (after [`still_processing`], once they are stored).
pub(super) fn resume(inner: &Arc<Inner>, keys: Vec<String>) {
    for key in keys {
        succeed_later(Arc::clone(inner), key);
    }
}

/// The event announcing that `object` succeeded, as Stripe shapes events.
pub(super) fn event(object: Value, created: i64) -> Value {
    let id = object
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    json!({
        "id": format!("evt_{id}_succeeded"),
        "object": "event",
        "type": "effect.succeeded",
        "created": created,
        "data": { "object": object },
    })
}

/// Delivers the event, signed at each delivery, until the endpoint answers `2xx` (at most
/// [`WEBHOOK_TRIES`] times, waiting 1 s, 2 s, … up to a minute between them).
async fn announce(hook: &SandboxWebhook, object: Value) {
    let body = event(object, Utc::now().timestamp()).to_string();
    let client = match crate::provider::tls::http_client_builder()
        .timeout(Duration::from_secs(10))
        .build()
    {
        Ok(c) => c,
        Err(error) => {
            tracing::warn!(%error, "sandbox: no HTTP client for the webhook");
            return;
        }
    };
    let mut wait = Duration::from_secs(1);
    for attempt in 1..=WEBHOOK_TRIES {
        let signature = crate::provider::provider_events::signature::sign_stripe(
            &hook.secret,
            Utc::now().timestamp(),
            body.as_bytes(),
        );
        let sent = client
            .post(&hook.url)
            .header("stripe-signature", signature)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => {
                tracing::warn!(url = %hook.url, attempt, status = r.status().as_u16(), "sandbox: the webhook endpoint refused an event; trying again");
            }
            Err(error) => {
                tracing::warn!(url = %hook.url, attempt, %error, "sandbox: the webhook endpoint did not answer; trying again");
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(WEBHOOK_MAX_WAIT);
    }
    tracing::warn!(url = %hook.url, tries = WEBHOOK_TRIES, "sandbox: gave up delivering an event");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_wraps_the_object_as_stripe_does() {
        let e = event(json!({"id": "eff_3", "status": "succeeded"}), 1_700_000_000);
        assert_eq!(e["id"], "evt_eff_3_succeeded");
        assert_eq!(e["type"], "effect.succeeded");
        assert_eq!(e["data"]["object"]["status"], "succeeded");
        assert_eq!(e["created"], 1_700_000_000);
    }
}
