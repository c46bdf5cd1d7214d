//! Issue 11, item 1: clients that hang up. ~800 posts to one in-process worker from 24 clients
//! that close their connection at random points (mid-headers, mid-body, right after the body,
//! 0.5–30 ms after it, with a reset, after reading part of the answer) and 8 that read every
//! answer, against a provider taking 20 ms per call. The lease is 120 s, so the sweeper cannot
//! hide a claim nobody performs: after the calls' time, what a user checks must hold —
//! no claim left `started`, none parked, no key applied twice, every acknowledged key applied,
//! every committed claim performed, nothing claimed from a request that never arrived whole.
//!
//! On the code before the fix (intake awaited the claim inside the request handler, so a
//! client that hung up after the commit dropped the task that would perform it), these fail:
//! hundreds of claims stay `started` for the whole lease.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use claimd::store::ClaimFilter;
use common::hangup::{self, HangUp};
use common::*;
use std::collections::HashMap;
use std::time::Duration;

const KEYS: usize = 700;
const DUPLICATES: usize = 100;
const HANGING: usize = 24;
const READING: usize = 8;

async fn clients_hang_up(store: TestStore, on_unknown: &str) {
    let (sandbox, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(20),
        ..Default::default()
    })
    .await;
    let consumer = consumer_toml(
        "payments",
        &provider,
        &format!("concurrency = 64\nlease = \"120s\"\non_unknown = \"{on_unknown}\"\n"),
    );
    let running = start(&config_toml(&store.url(), &consumer)).await;
    let seed = std::env::var("HANGUP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..1_000_000));
    eprintln!("HANGUP_SEED={seed}");
    let posts = hangup::payments("order-", KEYS, DUPLICATES, seed);
    let sent = hangup::send_all(
        running.http_addr,
        posts,
        HANGING,
        READING,
        seed,
        HangUp::random,
    )
    .await;
    assert!(
        sent.unexpected.is_empty(),
        "reading clients got answers other than 202/200: {:?}",
        &sent.unexpected[..sent.unexpected.len().min(10)]
    );
    let store = running.app().store.clone();
    let all = || async {
        store
            .list(&ClaimFilter {
                limit: 100_000,
                ..Default::default()
            })
            .await
            .unwrap()
    };
    // The calls' time: 20 ms each, 64 at once; generously, ten seconds. A request the server
    // read before its client hung up may still commit a moment after the last client is done
    // (SQLite writes one at a time): settled is nothing started and no new claim for a second.
    let (mut quiet, mut last) = (0, usize::MAX);
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    let settled = loop {
        let claims = all().await;
        let idle = claims.iter().all(|c| c.state != ClaimState::Started);
        quiet = if idle && claims.len() == last {
            quiet + 1
        } else {
            0
        };
        last = claims.len();
        if quiet >= 4 {
            break true;
        }
        if tokio::time::Instant::now() > end {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let claims = all().await;
    let count = |s: ClaimState| claims.iter().filter(|c| c.state == s).count();
    let applied: HashMap<String, u64> = sandbox
        .effects()
        .into_iter()
        .map(|e| (e.key, e.applied))
        .collect();
    let key_of: HashMap<&str, &str> = claims
        .iter()
        .map(|c| (c.message_id.as_str(), c.idem_key.as_str()))
        .collect();
    let unperformed: Vec<&str> = claims
        .iter()
        .filter(|c| !applied.contains_key(&c.idem_key))
        .map(|c| c.message_id.as_str())
        .collect();
    let acked_unapplied: Vec<&String> = sent
        .acked
        .iter()
        .filter(|k| {
            key_of
                .get(k.as_str())
                .is_none_or(|ik| !applied.contains_key(*ik))
        })
        .collect();
    let never_whole: Vec<&str> = claims
        .iter()
        .map(|c| c.message_id.as_str())
        .filter(|id| !sent.whole.contains(*id))
        .collect();
    eprintln!(
        "{on_unknown}: {} posts ({} hung up), {} keys sent whole, {} acknowledged; {} claims: {} started, {} completed, {} failed, {} needs_attention; {} keys applied, max {} per key; {} claims never performed, {} acknowledged not applied",
        sent.posts,
        sent.hung_up,
        sent.whole.len(),
        sent.acked.len(),
        claims.len(),
        count(ClaimState::Started),
        count(ClaimState::Completed),
        count(ClaimState::Failed),
        count(ClaimState::NeedsAttention),
        applied.len(),
        applied.values().max().copied().unwrap_or(0),
        unperformed.len(),
        acked_unapplied.len(),
    );
    assert!(
        settled && count(ClaimState::Started) == 0,
        "{} committed claims still started after the calls' time (lease 120 s): a client that hung up orphaned them",
        count(ClaimState::Started)
    );
    assert_eq!(count(ClaimState::NeedsAttention), 0, "claims parked");
    assert_eq!(count(ClaimState::Failed), 0, "claims failed");
    assert!(
        applied.values().all(|n| *n <= 1),
        "a key was applied more than once"
    );
    assert!(
        acked_unapplied.is_empty(),
        "acknowledged but never applied: {acked_unapplied:?}"
    );
    assert!(
        unperformed.is_empty(),
        "committed but never performed: {unperformed:?}"
    );
    assert!(
        never_whole.is_empty(),
        "claimed from a request that never arrived whole: {never_whole:?}"
    );
    assert!(
        claims.len() >= sent.acked.len() && claims.len() <= sent.whole.len(),
        "claims between acknowledged and sent whole"
    );
    let counts = store.counts(None).await.unwrap();
    assert_eq!(counts[0].started, 0, "the report agrees: nothing started");
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_that_hang_up_orphan_nothing_sqlite_redrive() {
    clients_hang_up(TestStore::sqlite(), "redrive").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_that_hang_up_orphan_nothing_postgres_reconcile() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    clients_hang_up(store, "reconcile").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_that_hang_up_orphan_nothing_postgres_park() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    clients_hang_up(store, "park").await;
}
