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

mod broker;
mod check;
pub mod events;
mod fleet;
mod gate;
pub mod hostile;
mod ledger;
pub mod lookalike;
mod outcome;

use broker::*;
use check::*;
use events::EventTap;
use fleet::*;
pub use hostile::HostileOptions;
use ledger::*;
pub use outcome::{HostileCheck, Outcome, assert_invariants};

use crate::common::hangup::{self, HangUp, Post, Seen};
use crate::common::smtp::SmtpSink;
use crate::common::{amqp::amqp_url, claimd_bin, free_port, proxy, try_raw_post};
use gate::Gate;

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
    let queues = (s.intake == Intake::Amqp).then(|| Arc::new(Queues::new()));
    let tap = match s.outcome_events {
        true => Some(EventTap::new().await),
        false => None,
    };

    // Workers reach PostgreSQL through a proxy the chaos loop can cut.
    let proxy = Arc::new(proxy::Proxy::start("127.0.0.1:5432").await);
    let worker_db = db_url.replacen("127.0.0.1:5432", &proxy.addr.to_string(), 1);
    let config = dir.path().join("claimd.toml");
    std::fs::write(
        &config,
        worker_toml(
            s,
            &worker_db,
            &provider,
            smtp_gate.port,
            queues.as_deref(),
            tap.as_ref().map(EventTap::toml).as_deref(),
        ),
    )
    .unwrap();
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
    let events_out = pending_rx.map(|rx| {
        lookalike::EventDriver::start(
            rx,
            fleet.ports(),
            store.clone(),
            s.seed,
            s.hostile.as_ref().is_some_and(|h| h.lookalikes),
        )
    });

    // The ledger of sends.
    let mut r = rng(s.seed);
    let mut sends = Vec::new();
    let mut duplicates_sent = 0;
    let mut emails = Vec::new();
    let mut two_tenant_ids = Vec::new();
    // Changed payloads go to the first ids (no tenant): two-tenant ids come after them.
    let changed = if s.bad_input {
        (s.messages / 50).max(3)
    } else {
        0
    };
    for m in 0..s.messages + s.emails {
        let (consumer, id, body) = if m < s.messages {
            let body = format!("{{\"amount\":{}}}", r.u32(1..100_000));
            ("payments", format!("m{}-{m}", s.seed), body)
        } else {
            let id = format!("e{}-{m}", s.seed);
            emails.push(id.clone());
            let body = format!(
                "{{\"to\":\"user{m}@example.com\",\"subject\":\"receipt {m}\",\"text\":\"thanks\"}}"
            );
            ("email", id, body)
        };
        // Some payment ids are sent by two tenants with the same body: two messages, two keys.
        let tenants: &[&'static str] = if consumer == "payments"
            && m >= changed
            && s.two_tenants > 0.0
            && r.f64() < s.two_tenants
        {
            two_tenant_ids.push(id.clone());
            &["acme", "globex"]
        } else {
            &[""]
        };
        for tenant in tenants {
            sends.push(Send_::Message {
                consumer,
                tenant,
                id: id.clone(),
                body: body.clone(),
            });
        }
        let tenant = tenants[0];
        if r.f64() < 0.15 {
            duplicates_sent += 1;
            sends.push(Send_::Message {
                consumer,
                tenant,
                id: id.clone(),
                body: body.clone(),
            });
        }
        if r.f64() < 0.03 {
            duplicates_sent += 1; // the second of the pair is a duplicate
            sends.push(Send_::Concurrent {
                consumer,
                tenant,
                id,
                body,
            });
        }
    }
    let mut mismatches_sent = 0;
    let mut bad_sent = 0;
    let mut seq = 0;
    if s.bad_input {
        for k in 0..changed {
            mismatches_sent += 1;
            seq += 1;
            sends.push(Send_::Changed {
                seq,
                id: format!("m{}-{k}", s.seed),
            });
        }
        for _ in 0..(s.messages / 100).max(2) {
            for case in BadCase::all(s.intake) {
                bad_sent += 1;
                seq += 1;
                sends.push(Send_::Bad { seq, case });
            }
        }
    }
    // Changed payloads go after their originals were claimed: a second wave.
    let (mut first, later): (Vec<_>, Vec<_>) = sends
        .into_iter()
        .partition(|x| !matches!(x, Send_::Changed { .. }));
    // Payments, emails, duplicates and bad input interleaved, as traffic arrives (seeded).
    r.shuffle(&mut first);
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
    let chaos = {
        let done = done.clone();
        let kills_done = kills_done.clone();
        let kills = s.kills;
        let workers = s.workers;
        let outage = s.db_outage;
        let broker = s.broker_outage;
        let provider_outage = s.provider_outage;
        let gate = gate.clone();
        let real = s.real_db_restart;
        let proxy = proxy.clone();
        let seed = s.seed;
        let timeline = timeline.clone();
        tokio::spawn(async move {
            let note = |what: String| timeline.lock().unwrap().push((chrono::Utc::now(), what));
            let mut r = rng(seed ^ 0x5eed);
            let (mut did_outage, mut did_broker, mut did_provider) = (false, false, false);
            while !done.load(Ordering::SeqCst) && kills_done.load(Ordering::SeqCst) < kills {
                tokio::time::sleep(Duration::from_millis(r.u64(150..600))).await;
                let i = r.usize(0..workers);
                let at = chrono::Utc::now();
                let killed = fleet.restart(i).await.unwrap_or_default();
                timeline
                    .lock()
                    .unwrap()
                    .push((at, format!("SIGKILL worker {i} ({killed})")));
                note(format!("worker {i} up again"));
                let k = kills_done.fetch_add(1, Ordering::SeqCst) + 1;
                if let Some(d) = broker
                    && !did_broker
                    && k >= kills / 3
                {
                    did_broker = true;
                    note("broker down".into());
                    broker_outage(d).await;
                    note("broker up".into());
                }
                if let Some(d) = outage
                    && !did_outage
                    && k >= kills / 2
                {
                    did_outage = true;
                    note("database down".into());
                    outage_now(&proxy, real, d).await;
                    note("database up".into());
                }
                if let Some(d) = provider_outage
                    && !did_provider
                    && k >= kills * 2 / 3
                {
                    did_provider = true;
                    note("provider down".into());
                    gate.outage(d).await;
                    note("provider up".into());
                }
            }
            if let Some(d) = broker
                && !did_broker
            {
                broker_outage(d).await;
            }
            if let Some(d) = outage
                && !did_outage
            {
                outage_now(&proxy, real, d).await;
            }
            if let Some(d) = provider_outage
                && !did_provider
            {
                gate.outage(d).await;
            }
            fleet
        })
    };

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
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    done.store(true, Ordering::SeqCst);
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
        for c in ["payments", "email"] {
            dead_seqs.extend(q.dead_seqs(&conn, c).await);
        }
        let _ = conn.close(200, "ok".into()).await;
    }
    let mut settled = wait_settled(&store, Duration::from_secs(120)).await;
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
            let relayed = events::wait_relayed(&store, Duration::from_secs(120)).await;
            let got = tap.drain().await;
            tap.delete().await;
            Some((relayed, got))
        }
        None => None,
    };
    let moments = timeline.lock().unwrap().clone();
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
        outcome.events_all_relayed = relayed;
    }
    drop(fleet);
    Some(outcome)
}

/// Waits until every queue of the run is empty (nothing ready) twice in a row, a second apart.
async fn wait_drained(q: &Queues) {
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let end = Instant::now() + Duration::from_secs(300);
    let mut empty_twice = 0;
    while Instant::now() < end && empty_twice < 2 {
        let mut empty = true;
        for c in ["payments", "email"] {
            match q.ready(&conn, c).await {
                Some((0, _)) => {}
                _ => empty = false,
            }
        }
        empty_twice = if empty { empty_twice + 1 } else { 0 };
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let _ = conn.close(200, "ok".into()).await;
}

/// Waits until the store holds at least `n` claims.
async fn wait_claimed(store: &Store, n: usize, within: Duration) {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Ok(counts) = store.counts(None).await {
            let claims: i64 = counts
                .iter()
                .map(|c| c.completed + c.failed + c.needs_attention + c.started)
                .sum();
            if claims as usize >= n {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until no claim is `started` or `pending`.
async fn wait_settled(store: &Store, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if store
            .open_counts()
            .await
            .map(|c| c.iter().all(|c| c.started == 0 && c.pending == 0))
            .unwrap_or(false)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}
