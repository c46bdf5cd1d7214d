//! The outcome-event stream against the store: the payments consumer publishes its outcome
//! events to a RabbitMQ exchange of the run's own, a queue bound to all of them collects them,
//! and at the end every settled claim must have its event (the state it ended in) and no event
//! may exist for a claim that is not settled or not in the store. Repeats (the same event id
//! twice, after a relay was killed between its publish and its mark) are allowed and counted.

use super::*;
use claimd::domain::claim::{Claim, ClaimState};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};

/// The run's exchange and queue of outcome events.
pub(super) struct EventTap {
    pub(super) name: String,
}

impl EventTap {
    /// Declares the exchange (durable, topic, as claimd would) and a durable queue bound to all
    /// of it: events published while the broker restarts are kept.
    pub(super) async fn new() -> EventTap {
        let name = format!(
            "chaos-events.{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        );
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ for the outcome events");
        let ch = conn.create_channel().await.unwrap();
        ch.exchange_declare(
            name.as_str().into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_declare(
            name.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_bind(
            name.as_str().into(),
            name.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        let _ = conn.close(200, "ok".into()).await;
        EventTap { name }
    }

    /// The payments consumer's `[consumers.outcomes]`.
    pub(super) fn toml(&self) -> String {
        format!(
            "[consumers.outcomes]\nkind = \"amqp\"\nurl = \"{}\"\nexchange = \"{}\"\n",
            amqp_url(),
            self.name
        )
    }

    /// Every event in the queue: (event id, body).
    pub(super) async fn drain(&self) -> Vec<(String, serde_json::Value)> {
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        let mut out = Vec::new();
        while let Some(m) = ch
            .basic_get(self.name.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let id = m
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default();
            out.push((
                id,
                serde_json::from_slice(&m.delivery.data).unwrap_or_default(),
            ));
        }
        let _ = conn.close(200, "ok".into()).await;
        out
    }

    /// Deletes the queue and the exchange.
    pub(super) async fn delete(&self) {
        if let Ok(conn) = Connection::connect(&amqp_url(), ConnectionProperties::default()).await
            && let Ok(ch) = conn.create_channel().await
        {
            let _ = ch
                .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = ch
                .exchange_delete(self.name.as_str().into(), ExchangeDeleteOptions::default())
                .await;
            let _ = conn.close(200, "ok".into()).await;
        }
    }
}

/// Waits until the store has no unsent outcome event (the relays caught up), at most `within`.
pub(super) async fn wait_relayed(store: &Store, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let backlog = store.outbox_backlog().await.unwrap_or_default();
        if backlog.iter().all(|b| b.unsent == 0) {
            return true;
        }
        if Instant::now() > deadline {
            eprintln!("outcome events still unsent: {backlog:?}");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The event stream against the claims of `consumer`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCheck {
    /// Distinct event ids received.
    pub published: usize,
    /// Settled claims without an event of the state they ended in.
    pub missing: usize,
    /// Events of a claim that is not in the store or not settled (`started`).
    pub invented: usize,
    /// Copies beyond the first of one event id (at least once).
    pub repeats: usize,
    /// Copies of one event id whose bodies differ (a repeat must be the same event).
    pub changed_repeats: usize,
}

/// Compares `events` (event id, body) with the claims of `consumer`.
pub(super) fn compare(
    consumer: &str,
    claims: &[Claim],
    events: &[(String, serde_json::Value)],
) -> EventCheck {
    let mut bodies: HashMap<&str, &serde_json::Value> = HashMap::new();
    let mut check = EventCheck::default();
    for (id, body) in events {
        match bodies.get(id.as_str()) {
            Some(first) => {
                check.repeats += 1;
                if *first != body {
                    check.changed_repeats += 1;
                }
            }
            None => {
                bodies.insert(id, body);
            }
        }
    }
    check.published = bodies.len();
    // (tenant, message id) → the states its events carried.
    let mut states: HashMap<(&str, &str), HashSet<&str>> = HashMap::new();
    for body in bodies.values() {
        let field = |k: &str| body.get(k).and_then(|v| v.as_str()).unwrap_or("");
        if field("consumer") != consumer {
            check.invented += 1;
            continue;
        }
        states
            .entry((field("tenant"), field("message_id")))
            .or_default()
            .insert(field("state"));
    }
    let mine: HashMap<(&str, &str), &Claim> = claims
        .iter()
        .filter(|c| c.consumer == consumer)
        .map(|c| ((c.tenant.as_str(), c.message_id.as_str()), c))
        .collect();
    for (who, seen) in &states {
        match mine.get(who) {
            Some(c) if c.state != ClaimState::Started => {}
            _ => check.invented += seen.len(),
        }
    }
    for (who, c) in &mine {
        let settled = matches!(
            c.state,
            ClaimState::Completed | ClaimState::Failed | ClaimState::NeedsAttention
        );
        if settled
            && !states
                .get(who)
                .is_some_and(|s| s.contains(c.state.as_str()))
        {
            check.missing += 1;
        }
    }
    check
}

/// The second destination: a webhook receiver on loopback whose port is closed until
/// [`HookTap::open`] (a destination that is down for the first part of the run), collecting
/// (`webhook-id`, body) of every delivery it answers `204`.
pub(super) struct HookTap {
    port: u16,
    got: Arc<Mutex<Vec<(String, serde_json::Value)>>>,
}

impl HookTap {
    /// A receiver not yet listening.
    pub(super) fn new() -> HookTap {
        HookTap {
            port: free_port(),
            got: Arc::default(),
        }
    }

    /// The payments consumer's destinations: the event tap (`bus`) and this one (`hooks`).
    pub(super) fn toml(&self, tap: &EventTap) -> String {
        format!(
            "{}[[consumers.outcomes]]\nkind = \"http\"\nname = \"hooks\"\nurl = \"http://127.0.0.1:{}/hook\"\nsecret = \"whsec_Y2hhb3MtaG9vay1zZWNyZXQ=\"\ntimeout = \"2s\"\n",
            tap.toml().replace(
                "[consumers.outcomes]\n",
                "[[consumers.outcomes]]\nname = \"bus\"\n"
            ),
            self.port
        )
    }

    /// Starts listening.
    pub(super) async fn open(&self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("the webhook receiver's port");
        let got = self.got.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
                let got = got.clone();
                async move {
                    let id = headers
                        .get("webhook-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let body = serde_json::from_str(&body).unwrap_or_default();
                    got.lock().unwrap().push((id, body));
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
    }

    /// Every delivery received so far.
    pub(super) fn received(&self) -> Vec<(String, serde_json::Value)> {
        self.got.lock().unwrap().clone()
    }
}
