//! RabbitMQ intake against the real broker on 127.0.0.1:5672: competing workers and redelivered
//! copies (each key applied once), every kind of bad message dead-lettered with a readable
//! reason, a store outage (nack and requeue: nothing lost, nothing doubled), a broker-side
//! connection close (reconnect without loss), and email end to end into a real SMTP sink.
//!
//! Each test uses queues with a random suffix and deletes them. Without a broker the tests
//! print `SKIPPED: ...`; under `CI=true` they fail.
//!
//! By role: `delivery` (good messages, outages, reconnects), `dead_letters` (bad messages),
//! `poison` (messages that crashed or wedged a worker, against a `claimd` process of its own),
//! `email` (broker to SMTP); this file holds the helpers they share.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use common::amqp::{TestQueues, close_connections_named, header};
use common::smtp::SmtpSink;
use common::*;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use std::collections::HashMap;
use std::time::Duration;

mod dead_letters;
mod delivery;
mod email;
mod embedder;
mod poison;
mod schedule;
mod tls;

fn http_effect(provider: &str) -> String {
    format!(
        r#"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "1s"
status_url = "{provider}/v1/effects/{{key}}"
"#
    )
}

fn smtp_effect(sink: &SmtpSink) -> String {
    format!(
        r#"
[consumers.effect]
kind = "smtp"
host = "127.0.0.1"
port = {port}
message_id_domain = "test.claimd"
from = "claimd <noreply@test.claimd>"
timeout = "1s"
"#,
        port = sink.addr.port()
    )
}

async fn wait_connected(running: &claimd::service::run::Running) {
    let ok = eventually(Duration::from_secs(15), || async {
        running.amqp.connected()
    })
    .await;
    assert!(
        ok,
        "AMQP consumers did not connect: {:?}",
        running
            .amqp
            .consumers()
            .iter()
            .map(|s| (s.name().to_string(), s.last_error()))
            .collect::<Vec<_>>()
    );
}

/// A worker on a fresh PostgreSQL database whose `payments` consumer reads fresh queues and
/// calls the sandbox, connected. `None` (skipped) outside CI without a broker or a database.
async fn payments_on_postgres(
    prefix: &str,
) -> Option<(
    TestQueues,
    TestStore,
    claimd::provider::sandbox::Sandbox,
    claimd::service::run::Running,
)> {
    let q = TestQueues::new(prefix).await?;
    let store = TestStore::pg().await?;
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &q.consumer_toml("payments", "", &http_effect(&provider)),
    ))
    .await;
    wait_connected(&running).await;
    Some((q, store, sandbox, running))
}
