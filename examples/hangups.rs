//! Issue 11, item 1, measured: clients that hang up after sending. For each store (SQLite,
//! PostgreSQL) one in-process worker takes 3,000 posts (distinct keys) from 32 clients that
//! close the connection 0.5–30 ms after writing the whole request, without reading the answer,
//! while 4 clients re-send 300 of those posts and read the answer (a client retrying after its
//! timeout). The provider (sandbox) takes 20 ms per call. Eight seconds after the last post
//! it counts the committed claims and how many are still `started`, parked, applied more than
//! once, and acknowledged (a `202`/`200` read) but not applied.
//!
//! Two consumers' settings per store: `reconcile` with a 120 s lease (a claim nobody performs
//! waits the whole lease), and `park` with a 10 s lease, where the example also waits past the
//! lease and counts the claims the sweeper parked for a person although the provider never saw
//! their key.
//!
//! ```sh
//! cargo run --release --features full --example hangups
//! HANGUPS_POSTS=3000 HANGUPS_CLIENTS=32 HANGUPS_LATENCY_MS=20 HANGUPS_WAIT_S=8 HANGUPS_SEED=7 cargo run --release --features full --example hangups
//! ```
//! PostgreSQL at `CLAIMD_TEST_PG` (default `postgres://postgres@127.0.0.1:5432/postgres`); the
//! example makes and drops its own database. Prints the machine's load average before and after
//! (the figures depend on it: 2 cores shared with builds give more hang-ups mid-claim).

#[path = "../tests/common/mod.rs"]
mod common;

use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use claimd::store::ClaimFilter;
use common::hangup::{self, HangUp, Post};
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// One row of the table.
struct Row {
    store: &'static str,
    on_unknown: &'static str,
    lease_s: u64,
    posts: usize,
    acked: usize,
    claims: usize,
    started: usize,
    parked: usize,
    applied_twice: usize,
    acked_unapplied: usize,
    /// After the lease (park only): parked, of which the provider never saw the key.
    parked_after_lease: Option<(usize, usize)>,
    seconds: f64,
}

struct Settings {
    posts: usize,
    clients: usize,
    retries: usize,
    latency: Duration,
    wait: Duration,
    seed: u64,
}

fn hang_up_after_sending(r: &mut fastrand::Rng) -> HangUp {
    HangUp::After(Duration::from_micros(r.u64(500..30_000)))
}

async fn measure(
    s: &Settings,
    store_name: &'static str,
    store_url: &str,
    on_unknown: &'static str,
    lease_s: u64,
) -> Row {
    let started_at = Instant::now();
    let (sandbox, provider) = common::sandbox(SandboxOptions {
        latency: s.latency,
        ..Default::default()
    })
    .await;
    let consumer = common::consumer_toml(
        "payments",
        &provider,
        &format!("concurrency = 64\nlease = \"{lease_s}s\"\non_unknown = \"{on_unknown}\"\n"),
    );
    let running = common::start(&common::config_toml(store_url, &consumer)).await;
    let addr = running.http_addr;
    let posts = hangup::payments("h-", s.posts, 0, s.seed);
    let mut r = fastrand::Rng::with_seed(s.seed ^ 0x7e7);
    let retries: Vec<Post> = (0..s.retries)
        .map(|_| posts[r.usize(0..posts.len())].clone())
        .collect();
    let (hung, read) = tokio::join!(
        hangup::send_all(addr, posts, s.clients, 0, s.seed, hang_up_after_sending),
        hangup::send_all(addr, retries, 0, 4, s.seed + 1, hang_up_after_sending),
    );
    if !read.unexpected.is_empty() {
        eprintln!(
            "{store_name}/{on_unknown}: {} re-sends not acknowledged: {:?}",
            read.unexpected.len(),
            &read.unexpected[..read.unexpected.len().min(5)]
        );
    }
    tokio::time::sleep(s.wait).await;
    let store = running.app().store.clone();
    let list = || async {
        store
            .list(&ClaimFilter {
                limit: 1_000_000,
                ..Default::default()
            })
            .await
            .unwrap()
    };
    let claims = list().await;
    let count = |claims: &[claimd::domain::claim::Claim], st: ClaimState| {
        claims.iter().filter(|c| c.state == st).count()
    };
    let applied: HashMap<String, u64> = sandbox
        .effects()
        .into_iter()
        .map(|e| (e.key, e.applied))
        .collect();
    let key_of: HashMap<&str, &str> = claims
        .iter()
        .map(|c| (c.message_id.as_str(), c.idem_key.as_str()))
        .collect();
    let acked: Vec<&String> = hung.acked.iter().chain(read.acked.iter()).collect();
    let acked_unapplied = acked
        .iter()
        .filter(|k| {
            key_of
                .get(k.as_str())
                .is_none_or(|ik| !applied.contains_key(*ik))
        })
        .count();
    let mut row = Row {
        store: store_name,
        on_unknown,
        lease_s,
        posts: hung.posts + read.posts,
        acked: hung.acked.union(&read.acked).count(),
        claims: claims.len(),
        started: count(&claims, ClaimState::Started),
        parked: count(&claims, ClaimState::NeedsAttention),
        applied_twice: applied.values().filter(|n| **n > 1).count(),
        acked_unapplied,
        parked_after_lease: None,
        seconds: 0.0,
    };
    if on_unknown == "park" {
        // Past the lease: the sweeper takes every claim left started.
        let since = Instant::now();
        let settled = common::eventually(
            Duration::from_secs(lease_s + 20).saturating_sub(s.wait),
            || async { count(&list().await, ClaimState::Started) == 0 },
        )
        .await;
        if !settled {
            eprintln!(
                "{store_name}: claims still started {:?} after the lease",
                since.elapsed()
            );
        }
        let claims = list().await;
        let applied: HashMap<String, u64> = sandbox
            .effects()
            .into_iter()
            .map(|e| (e.key, e.applied))
            .collect();
        let parked: Vec<_> = claims
            .iter()
            .filter(|c| c.state == ClaimState::NeedsAttention)
            .collect();
        let never_sent = parked
            .iter()
            .filter(|c| !applied.contains_key(&c.idem_key))
            .count();
        row.parked_after_lease = Some((parked.len(), never_sent));
    }
    running.shutdown(Duration::from_secs(5)).await;
    row.seconds = started_at.elapsed().as_secs_f64();
    row
}

#[tokio::main]
async fn main() {
    let s = Settings {
        posts: env_or("HANGUPS_POSTS", 3000),
        clients: env_or("HANGUPS_CLIENTS", 32),
        retries: env_or("HANGUPS_RETRIES", 300),
        latency: Duration::from_millis(env_or("HANGUPS_LATENCY_MS", 20)),
        wait: Duration::from_secs(env_or("HANGUPS_WAIT_S", 8)),
        seed: env_or("HANGUPS_SEED", fastrand::u64(..1_000_000)),
    };
    println!(
        "{} posts from {} clients hanging up 0.5-30 ms after sending, {} re-sent by 4 reading clients; provider {} ms; counted {} s after the last post; seed {}",
        s.posts,
        s.clients,
        s.retries,
        s.latency.as_millis(),
        s.wait.as_secs(),
        s.seed
    );
    println!("load average before: {}", loadavg());
    let mut rows = Vec::new();
    for (on_unknown, lease_s) in [("reconcile", 120), ("park", 10)] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("claims.db").display());
        rows.push(measure(&s, "SQLite", &url, on_unknown, lease_s).await);
        let db = common::PgDb::create()
            .await
            .expect("PostgreSQL is required");
        rows.push(measure(&s, "PostgreSQL", &db.url, on_unknown, lease_s).await);
    }
    println!("load average after: {}", loadavg());
    println!(
        "| store | on_unknown | lease | posts | acknowledged | committed claims | started after {} s | parked | applied > 1 | acknowledged, not applied | parked after the lease (never sent) | s |",
        s.wait.as_secs()
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} s | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |",
            r.store,
            r.on_unknown,
            r.lease_s,
            r.posts,
            r.acked,
            r.claims,
            r.started,
            r.parked,
            r.applied_twice,
            r.acked_unapplied,
            r.parked_after_lease
                .map(|(p, n)| format!("{p} ({n})"))
                .unwrap_or_else(|| "-".into()),
            r.seconds
        );
    }
}
