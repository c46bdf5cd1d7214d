//! Schedules and follow-ups in the combined run: a schedule every second (`catch_up = "all"`)
//! whose every slot is a tick sent to the provider, and each tick's completion a receipt (a
//! follow-up, created in the tick's settle) carrying the tick's id from the provider's answer.
//! Ticks go at a priority above the enqueued claims' (the pickup's order).
//!
//! Checked at the end, apart from the ledger's invariants (the schedule acknowledges its own
//! messages and keeps firing while the checks run): no tick or receipt applied twice, no slot
//! missing between the first and the last, and every tick completed before the last few
//! seconds has exactly one receipt, sent once, with its tick's id.

use super::*;
use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::Sandbox;
use sha2::{Digest, Sha256};

/// The consumers of this part, left out of the ledger's checks.
pub const CONSUMERS: [&str; 2] = ["ticks", "tick-receipts"];

/// The ticks' consumer, its receipts' consumer and the schedule (`provider`: the sandbox's
/// door that skips the hostile proxy).
pub fn consumer_toml(provider: &str) -> String {
    let consumer = |name: &str| {
        format!(
            "\n[[consumers]]\nname = \"{name}\"\nsource = \"http\"\nkey = \"{{consumer}}:{{message_id}}\"\n\
             concurrency = 8\nlease = \"{WORKER_LEASE_MS}ms\"\nmax_attempts = 20\nredrive_within = \"1h\"\n\
             [consumers.effect]\nkind = \"http\"\nurl = \"{provider}/v1/{name}\"\ntimeout = \"1s\"\n\
             status_url = \"{provider}/v1/effects/{{key}}\"\n"
        )
    };
    consumer("tick-receipts")
        + &consumer("ticks")
        + "[[consumers.follow_ups]]\nstep = \"receipt\"\non = \"completed\"\nconsumer = \"tick-receipts\"\n\
           payload = '{\"tick\": \"{{answer:/id}}\", \"slot\": \"{{payload:/slot}}\"}'\n\
           \n[[schedules]]\nname = \"chaos-tick\"\ncron = \"* * * * * *\"\nconsumer = \"ticks\"\n\
           catch_up = \"all\"\n"
}

/// What the schedule and its follow-ups did.
#[derive(Debug, Default, Clone, Copy)]
pub struct PeriodicCheck {
    /// Slots claimed (ticks).
    pub ticks: usize,
    /// Slots missing between the first and the last claimed.
    pub gaps: usize,
    /// Ticks or receipts the provider applied more than once.
    pub doubled: usize,
    /// Receipt claims.
    pub receipts: usize,
    /// Ticks completed over 10 s before the check without exactly one receipt claim.
    pub without_receipt: usize,
    /// Receipts sent whose body is not their tick's id and slot, or sent other than once.
    pub wrong_receipts: usize,
}

/// Reads the ticks and receipts (after the run: the schedule still fires).
pub async fn check(store: &claimd::store::Store, sandbox: &Sandbox) -> PeriodicCheck {
    let filter = |consumer: &str| ClaimFilter {
        consumer: Some(consumer.into()),
        limit: 1_000_000,
        ..Default::default()
    };
    let ticks = store.list(&filter("ticks")).await.unwrap();
    let receipts = store.list(&filter("tick-receipts")).await.unwrap();
    let effects = sandbox.effects();
    let mut c = PeriodicCheck {
        ticks: ticks.len(),
        receipts: receipts.len(),
        doubled: effects
            .iter()
            .filter(|e| e.path.starts_with("/v1/tick") && e.applied > 1)
            .count(),
        ..Default::default()
    };
    // Slots are whole seconds: `schedule:chaos-tick:<RFC 3339>`.
    let mut slots: Vec<i64> = ticks
        .iter()
        .filter_map(|t| t.message_id.strip_prefix("schedule:chaos-tick:"))
        .filter_map(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .map(|d| d.timestamp())
        .collect();
    slots.sort_unstable();
    c.gaps = slots
        .windows(2)
        .map(|w| (w[1] - w[0] - 1).max(0) as usize)
        .sum();
    let recent = chrono::Utc::now() - chrono::Duration::seconds(10);
    for t in ticks
        .iter()
        .filter(|t| t.state == ClaimState::Completed && t.received_utc < recent)
    {
        let child = format!("{}:receipt", t.message_id);
        let mine: Vec<_> = receipts.iter().filter(|r| r.message_id == child).collect();
        if mine.len() != 1 {
            c.without_receipt += 1;
            continue;
        }
        if mine[0].state != ClaimState::Completed {
            continue;
        }
        let sent = |key: &str| effects.iter().find(|e| e.key == key);
        let (Some(tick), Some(receipt)) = (sent(&t.idem_key), sent(&mine[0].idem_key)) else {
            c.wrong_receipts += 1;
            continue;
        };
        let slot = t.message_id.trim_start_matches("schedule:chaos-tick:");
        let body = serde_json::json!({"slot": slot, "tick": tick.response["id"]}).to_string();
        if receipt.applied != 1 || receipt.body_sha256 != hex::encode(Sha256::digest(body)) {
            c.wrong_receipts += 1;
        }
    }
    eprintln!("schedule and follow-ups: {c:?}");
    c
}

/// The schedule's and the follow-ups' invariants.
pub fn assert_held(c: &PeriodicCheck) {
    assert!(c.ticks > 0, "the schedule claimed no slot: {c:?}");
    assert_eq!(c.doubled, 0, "a tick or receipt applied twice: {c:?}");
    assert_eq!(
        c.gaps, 0,
        "slots missing between the first and the last: {c:?}"
    );
    assert_eq!(
        c.without_receipt, 0,
        "a completed tick without one receipt: {c:?}"
    );
    assert_eq!(
        c.wrong_receipts, 0,
        "a receipt sent other than once with its tick's id: {c:?}"
    );
}
