//! The reliability suite at CI size: every scenario of the fault-injection harness, short.
//! The long run (100,000 messages, 50+ kills) is `examples/chaos.rs`; see docs/reliability.md.

mod common;
mod harness;

use claimd::provider::sandbox::SandboxOptions;
use harness::{HostileOptions, Intake, Outcome, Scenario, assert_invariants};
use std::time::Duration;

fn base(name: &str, seed: u64) -> Scenario {
    Scenario {
        name: name.into(),
        intake: Intake::Http,
        messages: 300,
        workers: 3,
        kills: 6,
        provider: SandboxOptions {
            latency: Duration::from_millis(5),
            ..Default::default()
        },
        on_unknown: "redrive",
        db_outage: None,
        real_db_restart: false,
        clients: 12,
        seed,
        bad_input: false,
        emails: 0,
        broker_outage: None,
        provider_outage: None,
        hang_ups: 0.1,
        two_tenants: 0.05,
        outcome_events: true,
        hostile: None,
        orders: 0,
        terminate_backends: false,
        pg_restarts: 0,
        db_effect: 0,
        alerts: false,
        intakes: 0,
        second_destination: false,
        payload_retention: None,
        reindex: false,
    }
}

/// The combined run: every part of the harness on at once, under every fault at once.
fn every_feature(name: &str, seed: u64) -> Scenario {
    Scenario {
        emails: 30,
        orders: 120,
        terminate_backends: true,
        db_effect: 300,
        kills: 20,
        db_outage: Some(Duration::from_secs(3)),
        alerts: true,
        hostile: Some(HostileOptions::default()),
        provider_outage: Some(Duration::from_secs(3)),
        broker_outage: Some(Duration::from_secs(3)),
        intakes: 150,
        second_destination: true,
        payload_retention: Some(Duration::from_secs(2)),
        reindex: true,
        ..base(name, seed)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_scenarios_hold_every_invariant() {
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..1_000_000));
    eprintln!("CHAOS_SEED={seed}");
    let scenarios = vec![
        (
            Scenario {
                bad_input: true,
                emails: 30,
                ..base("HTTP: kills + duplicates + bad input + emails", seed)
            },
            true,
        ),
        (
            Scenario {
                intake: Intake::Amqp,
                bad_input: true,
                emails: 30,
                broker_outage: Some(Duration::from_secs(3)),
                ..base(
                    "RabbitMQ: kills + broker restart + duplicates + bad input + emails",
                    seed + 4,
                )
            },
            true,
        ),
        (
            Scenario {
                provider: SandboxOptions {
                    latency: Duration::from_millis(5),
                    fail_rate: 0.2,
                    ambiguous_rate: 0.1,
                    ..Default::default()
                },
                provider_outage: Some(Duration::from_secs(3)),
                ..base(
                    "kills + flaky provider (503, ambiguous 500/drop, down 3 s)",
                    seed + 1,
                )
            },
            true,
        ),
        (
            Scenario {
                provider: SandboxOptions {
                    latency: Duration::from_millis(5),
                    ambiguous_rate: 0.1,
                    ignore_keys: true,
                    ..Default::default()
                },
                on_unknown: "reconcile",
                ..base("provider ignores keys, reconcile", seed + 2)
            },
            true,
        ),
        (
            Scenario {
                db_outage: Some(Duration::from_secs(4)),
                ..base("kills + database outage", seed + 3)
            },
            true,
        ),
        (
            Scenario {
                hostile: Some(HostileOptions::default()),
                ..base(
                    "hostile provider (503 after apply, 409 in flight, look-alike events)",
                    seed + 5,
                )
            },
            true,
        ),
        (
            every_feature(
                "every feature at once: payments (pending outcomes, signed events and polls, two destinations), emails, order lines with schedules and cancels, a contended database effect, NATS, CloudEvents, enqueue with fairness and per-tenant limits; kills + terminated backends + database, broker, NATS and provider outages + a lying provider",
                seed + 6,
            ),
            true,
        ),
        (
            Scenario {
                intake: Intake::Amqp,
                ..every_feature(
                    "every feature at once, the payments, emails and database effect over RabbitMQ",
                    seed + 7,
                )
            },
            true,
        ),
    ];
    // CHAOS_SCENARIO=text runs only the scenarios whose name contains it (replaying one).
    let only = std::env::var("CHAOS_SCENARIO").unwrap_or_default();
    if !only.is_empty() {
        eprintln!("CHAOS_SCENARIO={only:?}: only the scenarios whose name contains it");
    }
    let mut rows = vec![Outcome::header()];
    let mut outcomes = Vec::new();
    for (s, honours) in scenarios
        .into_iter()
        .filter(|(s, _)| s.name.contains(&only))
    {
        let Some(db) = common::PgDb::create().await else {
            return;
        };
        let Some(o) = harness::run(&s, &db.url).await else {
            continue;
        };
        rows.push(o.row());
        eprintln!("{}", o.row());
        outcomes.push((o, honours));
    }
    eprintln!("{}", rows.join("\n"));
    for (o, honours) in &outcomes {
        // The hostile scenario proves something only if the proxy lied and look-alikes went out.
        if let Some(h) = o.hostile {
            assert!(
                h.applied_503 > 0 && h.unforwarded_503 > 0 && h.pending > 0,
                "the hostile provider never lied: {o:?}"
            );
            assert!(h.lookalikes > 0, "no look-alike event was sent: {o:?}");
        }
        assert_invariants(o, *honours);
    }
}
