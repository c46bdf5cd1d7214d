//! Three outcome destinations on one consumer, run as a `claimd` process on PostgreSQL:
//! RabbitMQ, a signed webhook and NATS JetStream. The webhook's receiver is down for 20 s
//! and the worker is SIGKILLed in the middle: RabbitMQ and NATS get every event while the
//! webhook is still down (it holds back only its own), `/metrics` shows the backlog per
//! destination, and in the end all three have every event, under the same ids.

use super::amqp::{bind, drain};
use super::webhooks::{Received, SECRET, receiver};
use super::{all_completed, config, event_rows, post_many};
use crate::common::amqp::{TestQueues, amqp_url};
use crate::common::nats::TestStream;
use crate::common::{TestStore, Worker, client, consumer_toml, eventually, free_port, sandbox};
use claimd::provider::sandbox::SandboxOptions;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How long the webhook's receiver stays down.
const DOWN_FOR: Duration = Duration::from_secs(20);

/// The ids each destination holds: RabbitMQ's queue (drained into `amqp`), the NATS
/// stream, the webhook receiver.
async fn ids_at(
    q: &TestQueues,
    amqp: &mut HashSet<String>,
    s: &TestStream,
    hooks: &Mutex<Received>,
) -> (HashSet<String>, HashSet<String>, HashSet<String>) {
    amqp.extend(drain(q).await.into_iter().map(|m| m.0));
    let nats: HashSet<String> = s
        .stored()
        .await
        .iter()
        .filter_map(|m| crate::common::nats::header(m, "Nats-Msg-Id"))
        .collect();
    let webhook: HashSet<String> = hooks
        .lock()
        .unwrap()
        .taken
        .iter()
        .map(|(h, _)| h["webhook-id"].to_str().unwrap().to_string())
        .collect();
    (amqp.clone(), nats, webhook)
}

/// Whether RabbitMQ and NATS hold `n` events within 30 s.
async fn healthy(
    q: &TestQueues,
    amqp: &mut HashSet<String>,
    s: &TestStream,
    hooks: &Mutex<Received>,
    n: usize,
) -> bool {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let (a, nats, _) = ids_at(q, amqp, s, hooks).await;
        if a.len() >= n && nats.len() >= n {
            return true;
        }
        if Instant::now() >= end {
            eprintln!("RabbitMQ {} and NATS {} of {n}", a.len(), nats.len());
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of `outcome_events_unsent` for `destination` in `/metrics`.
async fn unsent_metric(base: &str, destination: &str) -> Option<f64> {
    let text = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let wanted = format!("destination=\"{destination}\"");
    text.lines()
        .find(|l| l.starts_with("claimd_outcome_events_unsent{") && l.contains(&wanted))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_destination_that_is_down_and_a_kill_delay_only_that_destination() {
    let Some(q) = TestQueues::new("outcomes-three").await else {
        return;
    };
    let Some(s) = TestStream::new("outcomes").await else {
        return;
    };
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    bind(&q).await;
    let (_sb, provider) = sandbox(SandboxOptions::default()).await;
    // The receiver's port is chosen now and listened on only after DOWN_FOR.
    let hook_port = free_port();
    let destinations = format!(
        r#"
[[consumers.outcomes]]
kind = "amqp"
name = "bus"
url = {amqp:?}
exchange = {exchange:?}
poll = "50ms"

[[consumers.outcomes]]
kind = "http"
name = "hooks"
url = "http://127.0.0.1:{hook_port}/hook"
secret = "{SECRET}"
timeout = "2s"
poll = "50ms"

[[consumers.outcomes]]
kind = "nats"
url = {nats:?}
subject = {subject:?}
poll = "50ms"
"#,
        amqp = amqp_url(),
        exchange = q.dlx,
        nats = s.url,
        subject = s.subject,
    );
    // A stable instance name (as a StatefulSet gives): the process started after the kill
    // takes its relays back at once rather than after their lease.
    let consumer = format!(
        "{}{destinations}\n[run]\ninstance = \"relay-1\"\n",
        consumer_toml("payments", &provider, "")
    );
    let port = free_port();
    let toml = config(&ts, &consumer).replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claimd.toml");
    std::fs::write(&path, toml).unwrap();
    let log = dir.path().join("claimd.log");
    let store = claimd::store::open(&ts.url(), 2).await.unwrap();
    let hooks = Arc::new(Mutex::new(Received::default()));
    let mut amqp_ids: HashSet<String> = HashSet::new();

    let down_since = Instant::now();
    let w = Worker::spawn(&path, port, &log).await;
    post_many(&w.base, "payments", "a", 30).await;
    assert!(all_completed(&store, "payments", 30).await);
    assert!(
        healthy(&q, &mut amqp_ids, &s, &hooks, 30).await,
        "RabbitMQ and NATS did not get the first 30 events"
    );
    let first_healthy = down_since.elapsed();
    assert!(
        eventually(Duration::from_secs(10), || async {
            unsent_metric(&w.base, "hooks").await == Some(30.0)
                && unsent_metric(&w.base, "bus").await == Some(0.0)
                && unsent_metric(&w.base, "nats").await == Some(0.0)
        })
        .await,
        "/metrics shows the backlog per destination"
    );

    // A crash with the webhook's events held back, then a new process.
    w.kill();
    let w = Worker::spawn(&path, port, &log).await;
    let restarted = Instant::now();
    post_many(&w.base, "payments", "b", 30).await;
    assert!(all_completed(&store, "payments", 60).await);
    assert!(
        healthy(&q, &mut amqp_ids, &s, &hooks, 60).await,
        "RabbitMQ and NATS did not get all 60 events"
    );
    let after_restart = restarted.elapsed();
    let (_, _, webhook) = ids_at(&q, &mut amqp_ids, &s, &hooks).await;
    assert!(webhook.is_empty(), "the receiver is still down");
    eprintln!(
        "with the webhook down: RabbitMQ and NATS had the first 30 events {first_healthy:?} after the start, the next 30 {after_restart:?} after the restart"
    );

    // The receiver comes up after DOWN_FOR (or later, if the above took longer).
    tokio::time::sleep(DOWN_FOR.saturating_sub(down_since.elapsed())).await;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", hook_port))
        .await
        .unwrap();
    tokio::spawn(receiver(listener, hooks.clone()));
    let up_at = Instant::now();
    let all_sent = eventually(Duration::from_secs(120), || async {
        let rows = event_rows(&ts.url()).await;
        rows.len() == 180 && rows.iter().all(|r| r.3)
    })
    .await;
    assert!(all_sent, "every event of every destination sent in the end");
    eprintln!(
        "the webhook had every event {:?} after its receiver came up",
        up_at.elapsed()
    );
    let rows = event_rows(&ts.url()).await;
    let expected: HashSet<String> = rows.iter().map(|r| r.0.clone()).collect();
    assert_eq!(
        expected.len(),
        60,
        "one id per change, shared by its three rows"
    );
    let (amqp, nats, webhook) = ids_at(&q, &mut amqp_ids, &s, &hooks).await;
    assert_eq!(amqp, expected, "RabbitMQ: none lost, none invented");
    assert_eq!(nats, expected, "NATS: none lost, none invented");
    assert_eq!(webhook, expected, "webhook: none lost, none invented");
    w.kill();
    s.delete().await;
}

/// A RabbitMQ destination whose exchange is missing for 30 s (every publish refused, the
/// events' backoffs growing to 16 s and more), then created: the relay's probe of the oldest
/// waiting event (every 5 s while the destination looks down) finds it back, and every
/// waiting event goes at once rather than as each backoff runs out. Prints how long that took.
#[tokio::test]
async fn a_destination_that_comes_back_takes_its_waiting_events_at_once() {
    let Some(q) = TestQueues::new("outcomes-back").await else {
        return;
    };
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    let (_sb, provider) = sandbox(SandboxOptions::default()).await;
    // `declare = false`: claimd does not create the exchange; until the test does, RabbitMQ
    // refuses every publish to it.
    let outcomes = format!(
        "kind = \"amqp\"\nurl = {:?}\nexchange = {:?}\ndeclare = false",
        amqp_url(),
        q.dlx
    );
    let consumer = super::consumer_with_outcomes("payments", &provider, "", &outcomes);
    let w = crate::common::start(&config(&ts, &consumer)).await;
    post_many(&format!("http://{}", w.http_addr), "payments", "m", 20).await;
    assert!(all_completed(&w.app().store, "payments", 20).await);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let rows = event_rows(&ts.url()).await;
    assert_eq!(rows.len(), 20);
    assert!(
        rows.iter().all(|r| !r.3),
        "nothing sent while the exchange is missing"
    );
    let back = Instant::now();
    bind(&q).await;
    let all_sent = eventually(Duration::from_secs(120), || async {
        event_rows(&ts.url()).await.iter().all(|r| r.3)
    })
    .await;
    assert!(all_sent, "every event sent once the exchange exists");
    eprintln!(
        "RabbitMQ destination back after 30 s: all 20 waiting events sent {:?} later",
        back.elapsed()
    );
    let got: HashSet<String> = drain(&q).await.into_iter().map(|m| m.0).collect();
    let expected: HashSet<String> = rows.iter().map(|r| r.0.clone()).collect();
    assert_eq!(got, expected, "none lost, none invented");
    w.shutdown(Duration::from_secs(5)).await;
}
