//! The long run of the fault-injection harness: one PostgreSQL database, three `claimd run`
//! processes SIGKILLed and restarted over and over, a provider that is slow, fails (503) and
//! fails ambiguously (applies, then 500 or a dropped connection), a database outage in the
//! middle, duplicates, concurrent duplicates, changed payloads and bad input. Prints the
//! checks as a table and exits non-zero if an invariant fails.
//!
//! ```sh
//! cargo build --release --features full && cargo run --release --features full --example chaos
//! CHAOS_MESSAGES=100000 CHAOS_KILLS=60 CHAOS_SEED=7 CHAOS_REAL_DB_RESTART=1 cargo run --release --features full --example chaos
//! CHAOS_INTAKE=amqp CHAOS_BROKER_OUTAGE_S=10 CHAOS_SEED=7 cargo run --release --features full --example chaos
//! CHAOS_IGNORE_KEYS=1 CHAOS_AMBIGUOUS_RATE=0.1 cargo run --release --features full --example chaos  # keys ignored, reconcile
//! ```
//! `CHAOS_REAL_DB_RESTART=1` stops and starts the real PostgreSQL server (`pg_ctlcluster`, as
//! root); without it the workers' connections are cut at a proxy instead. `CHAOS_INTAKE=amqp`
//! publishes the ledger to RabbitMQ instead of posting it, and `CHAOS_BROKER_OUTAGE_S` (default
//! 10 with amqp, 0 to skip) stops RabbitMQ (`rabbitmqctl stop_app`) for that long a third of the
//! way in. `CHAOS_PROVIDER_OUTAGE_S` (default 30: ten leases, 0 to skip) takes the provider down (its port
//! refuses connections, calls in progress are cut) two thirds of the way in, and
//! `CHAOS_PROVIDER_RATE_LIMIT` (default 400, 0 for none) is the most POSTs a second the provider
//! takes (`429` beyond it). `CHAOS_HOSTILE=1` puts the hostile provider in front of the
//! sandbox (503 after applying, 409 while a key is in flight, look-alike events; shares in
//! docs/reliability.md). The combined run (docs/reliability.md, "The combined run") adds
//! `CHAOS_ORDERS=n` order ids to an `orders` consumer with order lines, schedules and cancels,
//! `CHAOS_DB_EFFECT=n` messages to a database effect contended on one counter row, and
//! `CHAOS_TERMINATE=1`, `pg_terminate_backend` of random backends every 0.5-2 s:
//! `CHAOS_ORDERS=20000 CHAOS_DB_EFFECT=20000 CHAOS_TERMINATE=1 cargo run --release --features full --example chaos`.
//! `CHAOS_ALERTS=1` evaluates the shipped paging rules against `/metrics` every second and
//! fails the run on a page about stuck claims while none is stuck.
//! Nothing else should be using the broker or the database server meanwhile.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/harness/mod.rs"]
mod harness;

use claimd::provider::sandbox::SandboxOptions;
use std::time::Duration;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let seed: u64 = env_or("CHAOS_SEED", fastrand::u64(..1_000_000));
    let amqp = std::env::var("CHAOS_INTAKE").is_ok_and(|v| v == "amqp");
    let broker_outage_s: u64 = env_or("CHAOS_BROKER_OUTAGE_S", if amqp { 10 } else { 0 });
    let scenario = harness::Scenario {
        name: format!(
            "long run, {}, seed {seed}",
            if amqp { "RabbitMQ" } else { "HTTP" }
        ),
        intake: if amqp {
            harness::Intake::Amqp
        } else {
            harness::Intake::Http
        },
        messages: env_or("CHAOS_MESSAGES", 100_000),
        workers: env_or("CHAOS_WORKERS", 3),
        kills: env_or("CHAOS_KILLS", 60),
        provider: SandboxOptions {
            latency: Duration::from_millis(env_or("CHAOS_LATENCY_MS", 10)),
            fail_rate: env_or("CHAOS_FAIL_RATE", 0.05),
            ambiguous_rate: env_or("CHAOS_AMBIGUOUS_RATE", 0.02),
            // CHAOS_IGNORE_KEYS=1: a provider without idempotency, reconciled instead of
            // re-sent (issue 14's "key-ignoring provider behind the dropping proxy").
            ignore_keys: env_or("CHAOS_IGNORE_KEYS", 0u8) == 1,
            // A provider that takes at most this many POSTs a second (429 beyond it); 0: none.
            rate_limit: Some(env_or("CHAOS_PROVIDER_RATE_LIMIT", 400u32)).filter(|r| *r > 0),
        },
        on_unknown: if env_or("CHAOS_IGNORE_KEYS", 0u8) == 1 {
            "reconcile"
        } else {
            "redrive"
        },
        db_outage: Some(Duration::from_secs(env_or("CHAOS_DB_OUTAGE_S", 20))),
        real_db_restart: env_or("CHAOS_REAL_DB_RESTART", 0u8) == 1,
        clients: env_or("CHAOS_CLIENTS", 32),
        seed,
        bad_input: true,
        emails: env_or("CHAOS_EMAILS", 2_000),
        broker_outage: (broker_outage_s > 0).then(|| Duration::from_secs(broker_outage_s)),
        // Ten leases of the harness's workers (3 s each).
        provider_outage: match env_or("CHAOS_PROVIDER_OUTAGE_S", 30u64) {
            0 => None,
            s => Some(Duration::from_secs(s)),
        },
        hang_ups: env_or("CHAOS_HANGUPS", 0.1),
        two_tenants: env_or("CHAOS_TWO_TENANTS", 0.05),
        // CHAOS_EVENTS=0: without outcome events (and their check against the store).
        outcome_events: env_or("CHAOS_EVENTS", 1u8) == 1,
        // CHAOS_HOSTILE=1: the hostile provider in front of the sandbox (docs/reliability.md).
        hostile: (env_or("CHAOS_HOSTILE", 0u8) == 1).then(|| {
            let d = harness::HostileOptions::default();
            harness::HostileOptions {
                applied_503: env_or("CHAOS_HOSTILE_APPLIED_503", d.applied_503),
                unforwarded_503: env_or("CHAOS_HOSTILE_503", d.unforwarded_503),
                pending: env_or("CHAOS_HOSTILE_PENDING", d.pending),
                lookalikes: env_or("CHAOS_HOSTILE_LOOKALIKES", 1u8) == 1,
                send_deadline: Duration::from_millis(env_or(
                    "CHAOS_HOSTILE_SEND_DEADLINE_MS",
                    d.send_deadline.as_millis() as u64,
                )),
            }
        }),
        // CHAOS_ORDERS=n: n order ids to an `orders` consumer with order lines, schedules and
        // cancels (docs/reliability.md, "The combined run").
        orders: env_or("CHAOS_ORDERS", 0),
        // CHAOS_TERMINATE=1: pg_terminate_backend of random worker backends every 0.5-2 s.
        terminate_backends: env_or("CHAOS_TERMINATE", 0u8) == 1,
        // CHAOS_PG_RESTARTS=n: n fast restarts of the real PostgreSQL server (as root).
        pg_restarts: env_or("CHAOS_PG_RESTARTS", 0),
        // CHAOS_DB_EFFECT=n: n messages to a database effect contended on one counter row.
        db_effect: env_or("CHAOS_DB_EFFECT", 0),
        // CHAOS_ALERTS=1: the shipped paging rules against /metrics every second; no false page.
        alerts: env_or("CHAOS_ALERTS", 0u8) == 1,
        // CHAOS_INTAKES=n: n messages on each of NATS (a private server restarted half way),
        // CloudEvents and producers' enqueues, to consumers with fairness and per-key limits.
        intakes: env_or("CHAOS_INTAKES", 0),
        // CHAOS_HOOKS=1: outcome events also to a webhook down for the first half.
        second_destination: env_or("CHAOS_HOOKS", 0u8) == 1,
        payload_retention: None,
        // CHAOS_REINDEX=1: an operator runs `claimd reindex --all` every 2-5 s.
        reindex: env_or("CHAOS_REINDEX", 0u8) == 1,
    };
    eprintln!("{scenario:?}");
    let db = common::PgDb::create()
        .await
        .expect("PostgreSQL is required");
    let outcome = harness::run(&scenario, &db.url)
        .await
        .expect("RabbitMQ is required for CHAOS_INTAKE=amqp");
    println!("{}\n{}", harness::Outcome::header(), outcome.row());
    harness::assert_invariants(&outcome, true);
    println!("all invariants hold");
}
