//! NATS JetStream intake against the real server on 127.0.0.1:4222 (and a private server for
//! the restart): the RabbitMQ intake's tests, adapted. Competing workers and redelivered
//! copies (each key applied once), every kind of bad message dead-lettered with a readable
//! reason, a message past `max_deliver` set aside, a store outage (held, nothing lost, nothing
//! doubled), a server restart and a SIGKILLed worker (0 lost, 0 doubled).
//!
//! Each test uses streams with a random suffix and deletes them. Without a server the tests
//! print `SKIPPED: ...`; under `CI=true` they fail.
//!
//! By role: `delivery` (good messages, outages, the restart), `dead_letters` (bad messages),
//! `kill` (a `claimd` process SIGKILLed while holding messages); this file holds the helpers.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use claimd::store::Store;
use common::nats::{TestStream, header, headers};
use common::*;
use std::time::Duration;

mod dead_letters;
mod delivery;
mod kill;
pub(crate) mod poison;
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

async fn completed(store: &Store, consumer: &str) -> usize {
    claims_in(store, consumer, Some(ClaimState::Completed))
        .await
        .len()
}

async fn wait_connected(running: &claimd::service::run::Running) {
    let ok = eventually(Duration::from_secs(15), || async {
        running.nats.connected()
    })
    .await;
    assert!(
        ok,
        "NATS consumers did not connect: {:?}",
        running
            .nats
            .consumers()
            .iter()
            .map(|s| (s.name().to_string(), s.last_error()))
            .collect::<Vec<_>>()
    );
}

/// Every key the sandbox saw was applied once, and there are `n` of them.
fn applied_once_each(sandbox: &claimd::provider::sandbox::Sandbox, n: usize) {
    let effects = sandbox.effects();
    assert_eq!(effects.len(), n, "every key reached the provider");
    let twice: Vec<_> = effects.iter().filter(|e| e.applied != 1).collect();
    assert!(twice.is_empty(), "keys applied more than once: {twice:?}");
}
