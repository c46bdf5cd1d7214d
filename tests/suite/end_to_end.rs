//! The whole path under concurrency: 1,000 posts (800 messages + 200 duplicates) from 16
//! clients, each key applied exactly once at a key-honouring provider, every claim completed;
//! and two workers sharing one PostgreSQL database, both receiving every message.

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use claimd::store::ClaimFilter;
use common::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

const UNIQUE: usize = 800;
const DUPLICATES: usize = 200;

/// Posts every (base, key) pair with 16 concurrent clients; returns status and duplicate flag.
async fn post_concurrently(posts: Vec<(String, String)>) -> Vec<(String, u16, bool)> {
    let queue = Arc::new(Mutex::new(posts));
    let results = Arc::new(Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    for _ in 0..16 {
        let queue = queue.clone();
        let results = results.clone();
        clients.push(tokio::spawn(async move {
            let c = client();
            loop {
                let Some((base, key)) = queue.lock().await.pop() else {
                    return;
                };
                let r = c
                    .post(format!("{base}/v1/messages/payments"))
                    .header("Idempotency-Key", &key)
                    .header("Content-Type", "application/json")
                    .body(format!("{{\"order\":\"{key}\",\"amount\":100}}"))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let v: serde_json::Value = r.json().await.unwrap();
                results
                    .lock()
                    .await
                    .push((key, status, v["duplicate"] == true));
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    Arc::try_unwrap(results).unwrap().into_inner()
}

fn workload() -> Vec<String> {
    let mut keys: Vec<String> = (0..UNIQUE).map(|i| format!("order-{i}")).collect();
    for i in 0..DUPLICATES {
        keys.push(format!("order-{}", (i * 7) % UNIQUE));
    }
    fastrand::shuffle(&mut keys);
    keys
}

async fn check_outcome(
    results: &[(String, u16, bool)],
    sandbox: &claimd::provider::sandbox::Sandbox,
    store: &claimd::store::Store,
    expected_posts: usize,
) {
    assert_eq!(results.len(), expected_posts);
    let mut created: HashMap<&str, usize> = HashMap::new();
    for (key, status, duplicate) in results {
        match status {
            202 => {
                assert!(!duplicate);
                *created.entry(key).or_default() += 1;
            }
            200 => assert!(duplicate, "a 200 must say duplicate: true"),
            other => panic!("unexpected status {other} for {key}"),
        }
    }
    assert_eq!(created.len(), UNIQUE, "every message claimed");
    assert!(created.values().all(|n| *n == 1), "exactly one 202 per key");
    assert!(
        eventually(Duration::from_secs(60), || async {
            store
                .list(&ClaimFilter {
                    state: Some(ClaimState::Completed),
                    limit: 10_000,
                    ..Default::default()
                })
                .await
                .unwrap()
                .len()
                == UNIQUE
        })
        .await,
        "every claim completes"
    );
    let effects = sandbox.effects();
    assert_eq!(effects.len(), UNIQUE, "the provider saw every key");
    assert!(
        effects.iter().all(|e| e.applied == 1),
        "each key applied exactly once"
    );
    let counts = store.counts(None).await.unwrap();
    assert_eq!(counts[0].received as usize, expected_posts);
    assert_eq!(counts[0].duplicates as usize, expected_posts - UNIQUE);
}

async fn one_worker(store: TestStore) {
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let toml = config_toml(&store.url(), &consumer_toml("payments", &provider, ""));
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let posts = workload().into_iter().map(|k| (base.clone(), k)).collect();
    let results = post_concurrently(posts).await;
    check_outcome(
        &results,
        &sandbox,
        &running.app().store,
        UNIQUE + DUPLICATES,
    )
    .await;
    // A re-post under a used key with another body is refused.
    let r = client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", "order-1")
        .body("{\"order\":\"order-1\",\"amount\":999}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    assert_eq!(
        running.app().store.counts(None).await.unwrap()[0].payload_mismatches,
        1
    );
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_posts_with_duplicates_apply_once_each_sqlite() {
    one_worker(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_posts_with_duplicates_apply_once_each_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    one_worker(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_sharing_postgres_apply_each_key_once() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (sandbox, provider) = sandbox(SandboxOptions::default()).await;
    let toml = config_toml(&store.url(), &consumer_toml("payments", &provider, ""));
    let a = start(&toml).await;
    let b = start(&toml).await;
    let (base_a, base_b) = (
        format!("http://{}", a.http_addr),
        format!("http://{}", b.http_addr),
    );
    // Both workers receive every post.
    let mut posts = Vec::new();
    for k in workload() {
        posts.push((base_a.clone(), k.clone()));
        posts.push((base_b.clone(), k));
    }
    fastrand::shuffle(&mut posts);
    let results = post_concurrently(posts).await;
    check_outcome(
        &results,
        &sandbox,
        &a.app().store,
        2 * (UNIQUE + DUPLICATES),
    )
    .await;
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
}
