//! RabbitMQ for tests: the broker on 127.0.0.1:5672 (guest/guest; override with
//! `CLAIMD_TEST_AMQP`), queues with a random suffix per test, deleted at the end.

use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

/// The broker tests use.
pub fn amqp_url() -> String {
    std::env::var("CLAIMD_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A test's queues: `<queue>` (work), `<queue>.dead`, and the dead-letter exchange.
pub struct TestQueues {
    pub queue: String,
    pub dlx: String,
    pub conn: Connection,
    pub channel: Channel,
}

impl TestQueues {
    /// Connects and names fresh queues (claimd declares them). `None` (with `SKIPPED:` printed)
    /// only outside CI when no broker answers; under `CI=true` a missing broker fails the test.
    pub async fn new(prefix: &str) -> Option<TestQueues> {
        let url = amqp_url();
        let conn = match tokio::time::timeout(
            std::time::Duration::from_secs(10),
            Connection::connect(&url, ConnectionProperties::default()),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return skip(&url, &e.to_string()),
            Err(_) => return skip(&url, "timed out"),
        };
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let suffix = format!("{}-{:08x}", std::process::id(), fastrand::u32(..));
        Some(TestQueues {
            queue: format!("claimd-test.{prefix}.{suffix}"),
            dlx: format!("claimd-test.{prefix}.{suffix}.dlx"),
            conn,
            channel,
        })
    }

    /// The dead-letter queue's name.
    pub fn dead(&self) -> String {
        format!("{}.dead", self.queue)
    }

    /// A consumer section reading this queue. Lines in `extra` (`key = value`) replace the
    /// defaults or add keys; `effect` is the `[consumers.effect]` table.
    pub fn consumer_toml(&self, name: &str, extra: &str, effect: &str) -> String {
        let defaults = vec![
            ("amqp_url", format!("{:?}", amqp_url())),
            ("queue", format!("{:?}", self.queue)),
            ("dead_letter_exchange", format!("{:?}", self.dlx)),
            ("prefetch", "32".into()),
            ("concurrency", "32".into()),
            ("lease", "\"3s\"".into()),
            ("max_attempts", "5".into()),
            ("redrive_within", "\"1h\"".into()),
        ];
        super::consumer_section(name, "amqp", defaults, extra, effect)
    }

    /// Publishes to the work queue (default exchange), waiting for the broker's confirm.
    pub async fn publish(&self, props: BasicProperties, body: &[u8]) {
        let confirm = self
            .channel
            .basic_publish(
                ShortString::from(""),
                ShortString::from(self.queue.as_str()),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack(), "broker did not confirm");
        assert!(
            confirm.take_message().is_none(),
            "queue {} does not exist yet (start the worker first)",
            self.queue
        );
    }

    /// Publishes with a message id and JSON body.
    pub async fn publish_json(&self, id: &str, body: &str) {
        self.publish(
            BasicProperties::default()
                .with_message_id(id.into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2),
            body.as_bytes(),
        )
        .await;
    }

    /// Ready messages in `queue` (passive declare).
    pub async fn ready(&self, queue: &str) -> u32 {
        let ch = self.conn.create_channel().await.unwrap();
        let q = ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let _ = ch.close(200, "ok".into()).await;
        q.message_count()
    }

    /// Takes every message from `<queue>.dead` (acknowledged).
    pub async fn take_dead(&self) -> Vec<BasicGetMessage> {
        let ch = self.conn.create_channel().await.unwrap();
        let mut out = Vec::new();
        while let Some(m) = ch
            .basic_get(
                self.dead().as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
        {
            out.push(m);
        }
        let _ = ch.close(200, "ok".into()).await;
        out
    }

    /// Deletes the queues and the exchange.
    pub async fn delete(&self) {
        let ch = self.conn.create_channel().await.unwrap();
        for q in [self.queue.clone(), self.dead()] {
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = ch
            .exchange_delete(self.dlx.as_str().into(), ExchangeDeleteOptions::default())
            .await;
        let _ = ch.close(200, "ok".into()).await;
    }
}

impl Drop for TestQueues {
    /// Deletes the queues and the exchange even when the test panicked (from a plain thread:
    /// the test's runtime may be shutting down). Deleting twice is harmless.
    fn drop(&mut self) {
        let (queue, dlx) = (self.queue.clone(), self.dlx.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let Ok(conn) =
                    Connection::connect(&amqp_url(), ConnectionProperties::default()).await
                else {
                    return;
                };
                if let Ok(ch) = conn.create_channel().await {
                    for q in [queue.clone(), format!("{queue}.dead")] {
                        let _ = ch
                            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                    let _ = ch
                        .exchange_delete(dlx.as_str().into(), ExchangeDeleteOptions::default())
                        .await;
                }
                let _ = conn.close(200, "ok".into()).await;
            });
        })
        .join();
    }
}

fn skip<T>(url: &str, why: &str) -> Option<T> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("RabbitMQ at {url} is required under CI=true: {why}");
    }
    eprintln!("SKIPPED: no RabbitMQ at {url} ({why}); set CLAIMD_TEST_AMQP or start it");
    None
}

/// A header's value as text.
pub fn header(props: &BasicProperties, name: &str) -> Option<String> {
    match props.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// Closes every broker connection whose client name contains `needle`, from the broker side
/// (`rabbitmqctl close_connection`). Returns how many it closed; `None` if rabbitmqctl is
/// not usable here.
pub fn close_connections_named(needle: &str) -> Option<usize> {
    let out = std::process::Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut closed = 0;
    for line in text.lines().filter(|l| l.contains(needle)) {
        let Some(pid) = line.split_whitespace().next() else {
            continue;
        };
        let ok = std::process::Command::new("rabbitmqctl")
            .args([
                "-q",
                "close_connection",
                pid,
                "claimd test: broker-side close",
            ])
            .status()
            .ok()?
            .success();
        if ok {
            closed += 1;
        }
    }
    Some(closed)
}
