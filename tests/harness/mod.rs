//! The fault-injection harness: real `claimd run` processes on one PostgreSQL database, the
//! sandbox provider and an SMTP sink in this process, a client that sends a ledger of messages
//! (new, duplicate, concurrent duplicate, changed payload, bad input, emails) at least once —
//! over HTTP intake or through RabbitMQ — and a chaos loop that SIGKILLs and restarts workers
//! and can stop PostgreSQL and RabbitMQ. At the end it checks the store, the provider, the SMTP
//! sink and the dead-letter queues against the ledger and prints the table. In the hostile mode
//! a proxy in front of the sandbox lies the way proxies and providers do (`hostile.rs`) and
//! signed events about look-alike objects are sent (`lookalike.rs`); the checks then include
//! "settled by another object's evidence" and "never sent, key held".
//!
//! Used by `tests/reliability.rs` (short, in CI) and `examples/chaos.rs` (long runs).
#![allow(dead_code)]

mod alerts;
mod archive;
mod broker;
mod check;
pub mod dbeffect;
pub mod events;
mod faults;
mod fleet;
mod gate;
pub mod hostile;
pub mod intakes;
mod ledger;
pub mod lookalike;
pub mod orders;
mod outcome;
pub mod periodic;
mod reindex;
mod terminate;
mod waits;

use broker::*;
use check::*;
use events::EventTap;
use fleet::*;
pub use hostile::HostileOptions;
use ledger::*;
pub use outcome::{HostileCheck, Outcome, assert_invariants};
use waits::*;

use crate::common::hangup::{self, HangUp, Post, Seen};
use crate::common::smtp::SmtpSink;
use crate::common::{amqp::amqp_url, claimd_bin, free_port, proxy, try_raw_post};
use gate::Gate;

/// The keys of the combined runs' encryption at rest (test keys, never used elsewhere).
const CHAOS_KEYS: &str = "k1=Y2xhaW1kLWNoYW9zLXNlYWxpbmcta2V5LW9uZS0zMmI=\nfp=Y2xhaW1kLWNoYW9zLWZpbmdlcnByaW50LWtleS0zMmI=\n";

use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use claimd::store::{ClaimFilter, Store};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use reqwest::header::HeaderValue;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How the ledger reaches the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intake {
    /// `POST /v1/messages/{consumer}` to any worker; 503 and connection errors are retried on
    /// another worker. "Acknowledged" is a 202 or 200.
    Http,
    /// Published to the consumer's RabbitMQ queue (persistent, publisher confirms; an
    /// unconfirmed publish is published again). "Acknowledged" is the broker's confirm: from
    /// then on the message must not be lost.
    Amqp,
}

/// What one run does.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name in the table.
    pub name: String,
    /// HTTP intake or RabbitMQ.
    pub intake: Intake,
    /// Distinct messages.
    pub messages: usize,
    /// Worker processes.
    pub workers: usize,
    /// SIGKILL + restart this many times during the run (spread evenly).
    pub kills: usize,
    /// Provider behaviour.
    pub provider: SandboxOptions,
    /// `on_unknown` of the consumer.
    pub on_unknown: &'static str,
    /// Take PostgreSQL away from the workers for this long in the middle.
    pub db_outage: Option<Duration>,
    /// Stop the real server (`pg_ctlcluster stop`/`start`) instead of cutting the workers'
    /// connections at a proxy. The real stop also hits anything else using the server.
    pub real_db_restart: bool,
    /// Client concurrency.
    pub clients: usize,
    /// Seed for the ledger and the chaos.
    pub seed: u64,
    /// Also send the bad-input matrix and changed payloads.
    pub bad_input: bool,
    /// Emails (SMTP effect to a sink on loopback, `on_unknown = "park"`) sent besides the
    /// payments.
    pub emails: usize,
    /// Stop RabbitMQ (`rabbitmqctl stop_app`) for this long in the middle, then start it.
    pub broker_outage: Option<Duration>,
    /// Take the provider down for this long two thirds of the way in: its port refuses
    /// connections and calls in progress are cut.
    pub provider_outage: Option<Duration>,
    /// Share of HTTP sends whose client hangs up mid-request (mid-headers, mid-body, right
    /// after the body, 0.5-30 ms later, with a reset, after part of the answer): not an
    /// acknowledgement, so the client sends again, as a real client retries after its timeout.
    pub hang_ups: f64,
    /// Share of payment ids sent by two tenants (`acme` and `globex`, same body): each
    /// (tenant, id) must be applied once under its own key.
    pub two_tenants: f64,
    /// The payments consumer publishes outcome events to RabbitMQ, checked against the store
    /// at the end (every settled claim has its event, none for an unsettled one).
    pub outcome_events: bool,
    /// The hostile provider (`None`: the sandbox answers the workers itself): a proxy that
    /// answers `503` after the sandbox applied, `409` while a key is in flight, `503`
    /// without forwarding, `processing` for some payments, and signed look-alike events
    /// about other tenants', consumers' and objects' payments (`hostile.rs`, `lookalike.rs`).
    pub hostile: Option<HostileOptions>,
    /// Order ids sent to the `orders` consumer (order lines under `hold`, some messages
    /// scheduled, some of those cancelled; `orders.rs`), over HTTP whatever the intake; 0: none.
    pub orders: usize,
    /// `pg_terminate_backend` of one to three random worker backends every 0.5–2 s while the
    /// ledger is sent (`terminate.rs`).
    pub terminate_backends: bool,
    /// Fast restarts of the real PostgreSQL server (`pg_ctlcluster restart -m fast`: every
    /// connection gets `57P01`), spread over the send phase between the kills. The real
    /// restart also hits anything else using the server.
    pub pg_restarts: usize,
    /// Messages to the `ledger` consumer, a database effect contended on one counter row
    /// (`dbeffect.rs`), over the scenario's intake; 0: none.
    pub db_effect: usize,
    /// The shipped paging rules evaluated against a live worker's `/metrics` every second
    /// through the send phase and the drain (`alerts.rs`): no page about claims without a
    /// stuck claim.
    pub alerts: bool,
    /// Messages sent on each of the other ways in — NATS JetStream (a private server killed
    /// and started again half way), CloudEvents over HTTP, producers' enqueues with rollbacks
    /// and vanished clients — to two consumers with fairness and per-tenant limits
    /// (`intakes.rs`); 0: none.
    pub intakes: usize,
    /// The payments consumer's outcome events also go to a webhook receiver that is down for
    /// the first half of the send phase (needs `outcome_events`).
    pub second_destination: bool,
    /// The payments consumer's `payload_retention`, with retention running every second:
    /// finished claims are erased while their messages are still redelivered, which must
    /// stay duplicates (and changed payloads mismatches); `None`: no erasure.
    pub payload_retention: Option<Duration>,
    /// An operator runs `claimd reindex --all` every 2–5 s while the ledger is sent, and once
    /// more after the run (`reindex.rs`).
    pub reindex: bool,
}

/// `None` (skip, reason printed) when the scenario needs RabbitMQ and none answers outside CI.
async fn broker_available(s: &Scenario) -> bool {
    if s.intake != Intake::Amqp && !s.outcome_events {
        return true;
    }
    match Connection::connect(&amqp_url(), ConnectionProperties::default()).await {
        Ok(c) => {
            let _ = c.close(200, "ok".into()).await;
            true
        }
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("RabbitMQ is required under CI=true: {e}");
            }
            eprintln!("SKIPPED: {}: no RabbitMQ ({e})", s.name);
            false
        }
    }
}

/// Runs one scenario against a fresh database `db_url` and returns the checks (`None`: the
/// scenario needs RabbitMQ and there is none, outside CI).
pub async fn run(s: &Scenario, db_url: &str) -> Option<Outcome> {
    if !broker_available(s).await {
        return None;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener_addr = listener.local_addr().unwrap();
    // The provider's door forwards to the sandbox, or to the hostile proxy in front of it.
    let (hostile, pending_rx) = match &s.hostile {
        Some(h) => {
            let (p, rx) =
                hostile::HostileProxy::start(h.clone(), listener.local_addr().unwrap(), s.seed)
                    .await;
            (Some(p), Some(rx))
        }
        None => (None, None),
    };
    let gate = Gate::start(match &hostile {
        Some(h) => h.addr,
        None => listener.local_addr().unwrap(),
    })
    .await;
    let provider = format!("http://127.0.0.1:{}", gate.port);
    let sandbox = Sandbox::new(s.provider.clone());
    let served = sandbox.clone();
    tokio::spawn(async move { served.serve(listener, std::future::pending()).await });
    let smtp = SmtpSink::start().await;
    // The SMTP server's door: notes each recipient a worker got as far as naming.
    let smtp_gate = Gate::start(smtp.addr).await;
    // The orders consumer's door: straight to the sandbox (never the hostile proxy, whose
    // pending answers and look-alike events are about payments), noting into the payments
    // door's record of keys seen.
    let orders_gate = Gate::start_beside(listener_addr, &gate).await;
    let queues = (s.intake == Intake::Amqp).then(|| Arc::new(Queues::new(s.db_effect > 0)));
    let tap = match s.outcome_events {
        true => Some(EventTap::new().await),
        false => None,
    };
    let hooks = (s.second_destination && tap.is_some()).then(|| Arc::new(events::HookTap::new()));
    let outcomes = match (&tap, &hooks) {
        (Some(t), Some(h)) => Some(h.toml(t)),
        (Some(t), None) => Some(t.toml()),
        _ => None,
    };
    let intakes = match s.intakes {
        0 => None,
        _ => Some(Arc::new(intakes::Intakes::start(db_url, s.seed).await?)),
    };

    // Workers reach PostgreSQL through a proxy the chaos loop can cut.
    let proxy = Arc::new(proxy::Proxy::start("127.0.0.1:5432").await);
    let worker_db = db_url.replacen("127.0.0.1:5432", &proxy.addr.to_string(), 1);
    let config = dir.path().join("claimd.toml");
    // Every run seals what the workers store (encryption at rest), under keys this process
    // opens its own store with: the checks read the rows as an operator's tools do.
    let keys = dir.path().join("keys");
    std::fs::write(&keys, CHAOS_KEYS).unwrap();
    claimd::store::sealing::install(std::sync::Arc::new(
        claimd::domain::sealed::Keyring::new(CHAOS_KEYS, "k1", "fp").unwrap(),
    ))
    .unwrap();
    let encryption = format!(
        "[encryption]\nenabled = true\nkeys_file = \"{}\"\nactive = \"k1\"\nfingerprint_key = \"fp\"\n",
        keys.display()
    );
    std::fs::write(
        &config,
        encryption
            + &worker_toml(
                s,
                &worker_db,
                &provider,
                smtp_gate.port,
                queues.as_deref(),
                outcomes.as_deref(),
            )
            + &if s.orders > 0 {
                orders::consumer_toml(&format!("http://127.0.0.1:{}", orders_gate.port), s)
            } else {
                String::new()
            }
            + &if s.db_effect > 0 {
                let source = match &queues {
                    Some(q) => q.consumer_toml("ledger"),
                    None => "source = \"http\"\n".to_string(),
                };
                dbeffect::consumer_toml().replacen("source = \"http\"\n", &source, 1)
            } else {
                String::new()
            }
            + &intakes
                .as_ref()
                .map(|i| i.consumer_toml(&format!("http://127.0.0.1:{}", orders_gate.port)))
                .unwrap_or_default()
            + &if s.intakes > 0 {
                periodic::consumer_toml(&format!("http://127.0.0.1:{}", orders_gate.port))
            } else {
                String::new()
            },
    )
    .unwrap();
    if s.db_effect > 0 {
        dbeffect::create_tables(db_url).await;
    }
    let store = claimd::store::open(db_url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let mut fleet = Fleet {
        config,
        log: dir.path().join("workers.log"),
        workers: (0..s.workers)
            .map(|_| WorkerProc {
                child: None,
                port: free_port(),
                started: 0,
            })
            .collect(),
    };
    for i in 0..s.workers {
        fleet.restart(i).await;
    }
    let scraping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = s
        .alerts
        .then(|| alerts::start(fleet.ports(), scraping.clone()));
    let events_out = pending_rx.map(|rx| {
        lookalike::EventDriver::start(
            rx,
            fleet.ports(),
            store.clone(),
            s.seed,
            s.hostile.as_ref().is_some_and(|h| h.lookalikes),
        )
    });

    let Plan {
        first,
        later,
        duplicates_sent,
        emails,
        two_tenant_ids,
        mismatches_sent,
        bad_sent,
    } = plan(s);
    let ledger = Arc::new(Ledger {
        acked: Mutex::new(HashSet::new()),
        dup_acks: AtomicUsize::new(0),
        mismatch_refusals: AtomicUsize::new(0),
        bad_refused: AtomicUsize::new(0),
        attempts: AtomicU64::new(0),
        hung_up: AtomicUsize::new(0),
        hang_ups: s.hang_ups,
        seed: s.seed,
    });
    let expected_dead = Arc::new(Mutex::new(HashSet::new()));
    let via = match &queues {
        Some(q) => Via::Amqp(q.clone()),
        None => Via::Http(fleet.ports()),
    };
    let total_sends = first.len() + later.len();
    // The orders, beside the ledger, over the same span.
    let delivered = Arc::new(AtomicUsize::new(0));
    let share: LedgerShare = {
        let delivered = delivered.clone();
        let total = total_sends.max(1) as f64;
        Arc::new(move || delivered.load(Ordering::Relaxed) as f64 / total)
    };
    let order_sends = (s.orders > 0).then(|| {
        let orders = orders::plan(s.seed, s.orders);
        tokio::spawn(orders::drive(
            orders,
            fleet.ports(),
            ledger.clone(),
            4,
            Duration::from_millis(s.kills as u64 * 400),
            share.clone(),
        ))
    });
    // Pace the clients so the send phase lasts about as long as the kills take (~0.4 s each).
    let pace = Duration::from_millis(
        (s.kills as u64 * 400 * s.clients as u64) / total_sends.max(1) as u64,
    );

    // Chaos: kill and restart workers evenly over the send phase; a broker outage a third of
    // the way in, a database outage half way, a provider outage two thirds of the way.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kills_done = Arc::new(AtomicUsize::new(0));
    // What the chaos loop did when, for explaining a claim that ends badly.
    let timeline: Arc<Mutex<Vec<Moment>>> = Arc::default();
    let restarted = Arc::new(AtomicUsize::new(0));
    let ports = fleet.ports();
    let chaos = faults::start(
        faults::Faults {
            kills: s.kills,
            workers: s.workers,
            db_outage: s.db_outage,
            broker_outage: s.broker_outage,
            provider_outage: s.provider_outage,
            real_db_restart: s.real_db_restart,
            pg_restarts: s.pg_restarts,
            seed: s.seed,
        },
        fleet,
        vec![gate.clone(), orders_gate.clone()],
        proxy.clone(),
        faults::Progress {
            done: done.clone(),
            kills_done: kills_done.clone(),
            restarted: restarted.clone(),
            timeline: timeline.clone(),
            sent: share.clone(),
        },
    );
    let span = Duration::from_millis(s.kills as u64 * 400);
    let intake_sends = intakes.as_ref().map(|i| {
        i.drive(
            s.intakes,
            ports.clone(),
            db_url.to_string(),
            span,
            share.clone(),
            timeline.clone(),
        )
    });
    if let Some(h) = hooks.clone() {
        let share = share.clone();
        tokio::spawn(async move {
            keep_pace(&share, 0.5).await;
            h.open().await;
        });
    }
    let terminator = s
        .terminate_backends
        .then(|| terminate::start(db_url.to_string(), s.seed, done.clone(), timeline.clone()));
    let reindexer = s
        .reindex
        .then(|| reindex::start(db_url.to_string(), s.seed, done.clone(), timeline.clone()));
    let first_ids: HashSet<(&str, String)> = first
        .iter()
        .filter_map(|x| match x {
            Send_::Message { tenant, id, .. } | Send_::Concurrent { tenant, id, .. } => {
                Some((*tenant, id.clone()))
            }
            _ => None,
        })
        .collect();
    for (w, wave) in [first, later].into_iter().enumerate() {
        if w == 1 && queues.is_some() {
            // A broker confirm is not a claim: wait until the first wave is claimed, so a
            // changed payload meets its original's claim, not the other way round.
            wait_claimed(&store, first_ids.len(), Duration::from_secs(300)).await;
        }
        let queue = Arc::new(Mutex::new(wave));
        let mut tasks = Vec::new();
        for t in 0..s.clients {
            let (queue, ledger, via) = (queue.clone(), ledger.clone(), via.clone());
            let delivered = delivered.clone();
            let expected_dead = expected_dead.clone();
            tasks.push(tokio::spawn(async move {
                let c = claimd::provider::tls::http_client_builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                let publisher = Publisher::new();
                let mut n = t;
                loop {
                    let Some(item) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    n += 1;
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                    deliver(item, &via, &c, &publisher, n, &ledger, &expected_dead).await;
                    delivered.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    let order_sends = match order_sends {
        Some(t) => Some(t.await.unwrap()),
        None => None,
    };
    let intake_sends = match intake_sends {
        Some(t) => Some(t.await.unwrap()),
        None => None,
    };
    if let Some(sent) = &intake_sends {
        ledger.acked.lock().unwrap().extend(sent.acknowledged());
    }
    done.store(true, Ordering::SeqCst);
    let terminated = match terminator {
        Some(t) => t.await.unwrap(),
        None => (0, 0),
    };
    if let Some(t) = reindexer {
        reindex::finish(db_url, t.await.unwrap()).await;
    }
    let mut fleet = chaos.await.unwrap();
    // Every worker up for the final sweeps.
    for i in 0..s.workers {
        if fleet.workers[i]
            .child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
        {
            fleet.restart(i).await;
        }
    }
    let mut dead_seqs = HashSet::new();
    if let Some(q) = &queues {
        wait_drained(q).await;
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .unwrap();
        for c in &q.consumers {
            dead_seqs.extend(q.dead_seqs(&conn, c).await);
        }
        let _ = conn.close(200, "ok".into()).await;
    }
    // Every message the stream took is claimed before the claims are waited for.
    if let Some(i) = &intakes {
        let end = Instant::now() + Duration::from_secs(120);
        while i.unacknowledged().await > 0 && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    // With orders, the harness resolves parked order claims as an operator would.
    let (mut settled, resolved) = match s.orders {
        0 => (wait_settled(&store, Duration::from_secs(120)).await, 0),
        _ => {
            let ports = fleet.ports();
            orders::settle_as_operator(&store, &ports, &sandbox, Duration::from_secs(120)).await
        }
    };
    // The provider's events of every payment answered `processing` so far; later ones are
    // settled by their polls.
    let provider_events = match (&hostile, events_out) {
        (Some(h), Some(driver)) => {
            h.close();
            let counts = driver.finish().await;
            settled = wait_settled(&store, Duration::from_secs(120)).await;
            Some((h.counts.clone(), counts))
        }
        _ => None,
    };
    if let Some(q) = &queues {
        // Dead letters the harness expected: all there (any copy), nothing else.
        let expected = expected_dead.lock().unwrap().clone();
        let missing = expected.difference(&dead_seqs).count();
        let unexpected = dead_seqs.difference(&expected).count();
        assert_eq!(unexpected, 0, "dead letters the harness did not expect");
        let refused = expected.len() - missing;
        ledger
            .mismatch_refusals
            .store(refused.min(mismatches_sent), Ordering::Relaxed);
        ledger
            .bad_refused
            .store(refused.saturating_sub(mismatches_sent), Ordering::Relaxed);
        if missing > 0 {
            // Leave the count short: the invariant check names it.
            eprintln!("{missing} bad messages were not dead-lettered");
        }
        q.delete().await;
    }
    // The relays catch up (a killed one's lease runs out first), then the stream is read.
    let events = match &tap {
        Some(tap) => {
            // A webhook that was down for half a long run has a backlog to take, one request
            // at a time: the wait grows with the run.
            let within = Duration::from_secs(120).max(started.elapsed() / 2);
            let relayed = events::wait_relayed(&store, within).await;
            let got = tap.drain().await;
            tap.delete().await;
            Some((relayed, got))
        }
        None => None,
    };
    scraping.store(true, Ordering::SeqCst);
    let alerts = match scraper {
        Some(t) => Some(t.await.unwrap()),
        None => None,
    };
    let moments = timeline.lock().unwrap().clone();
    if s.payload_retention.is_some() {
        archive::archive_finished(db_url).await;
    }
    let mut outcome = check(
        s,
        &store,
        db_url,
        &sandbox,
        &smtp,
        [&gate, &smtp_gate],
        &moments,
        &ledger,
        &emails,
        &two_tenant_ids,
        settled,
        Sent {
            total: total_sends,
            duplicates: duplicates_sent,
            mismatches: mismatches_sent,
            bad: bad_sent,
        },
        kills_done.load(Ordering::SeqCst),
        started,
        provider_events.as_ref().map(|(h, e)| (&**h, &**e)),
    )
    .await;
    if let Some((relayed, got)) = events {
        let claims = store
            .list(&ClaimFilter {
                consumer: Some("payments".into()),
                limit: 10_000_000,
                ..Default::default()
            })
            .await
            .unwrap();
        outcome.events = Some(events::compare("payments", &claims, &got));
        outcome.hook_events = hooks
            .as_ref()
            .map(|h| events::compare("payments", &claims, &h.received()));
        outcome.events_all_relayed = relayed;
    }
    (outcome.terminated_backends, outcome.terminated_in_effect) = terminated;
    outcome.pg_restarts = restarted.load(Ordering::SeqCst);
    outcome.alerts = alerts;
    if s.db_effect > 0 {
        outcome.db_effect = Some(dbeffect::check(db_url, &store).await);
    }
    // Encryption at rest held through every fault: each payload the payments and email
    // consumers (HTTP or a broker) kept is sealed; erased ones are empty. (The SQL enqueue path
    // writes in clear until a worker takes the claim, so its consumers are left out.)
    {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(db_url).await.unwrap();
        let (payloads, clear): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE position('$claimd$v1$'::bytea IN payload) <> 1)
             FROM (SELECT consumer, payload FROM claims UNION ALL
                   SELECT consumer, payload FROM claims_archive) c
             WHERE consumer IN ('payments', 'email') AND length(payload) > 0",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        assert!(payloads > 0, "stored payloads to look at");
        assert_eq!(clear, 0, "payloads stored in clear, of {payloads}");
    }
    if s.intakes > 0 {
        outcome.periodic = Some(periodic::check(&store, &sandbox).await);
    }
    if let Some(sent) = &intake_sends {
        let c = intakes::check(db_url, &store, &sandbox, sent).await;
        outcome.sent += c.nats + c.cloudevents + c.enqueued + c.abandoned;
        outcome.intakes = Some(c);
    }
    if let Some(sent) = &order_sends {
        let claims = store
            .list(&ClaimFilter {
                consumer: Some("orders".into()),
                limit: 10_000_000,
                ..Default::default()
            })
            .await
            .unwrap();
        outcome.orders = Some(orders::OrderCheck {
            resolved,
            ..orders::check(&store, &claims, &sandbox.effects(), sent, &moments).await
        });
        outcome.sent += sent.messages.load(Ordering::Relaxed);
    }
    drop(fleet);
    Some(outcome)
}
