//! Order keys: 200 charges and refunds for 20 orders, each order's messages sent one after the
//! other, through a provider that fails and answers ambiguously, with workers SIGKILLed
//! mid-run: no message of an order is applied before the one received before it settled, and
//! each is applied once.

use crate::common::*;
use claimd::domain::claim::{Claim, ClaimState};
use claimd::provider::sandbox::SandboxOptions;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const ORDERS: usize = 20;
const PER_ORDER: usize = 10;

fn consumer(provider: &str, extra: &str) -> String {
    consumer_toml(
        "payments",
        provider,
        &format!("order_key = \"{{order_id}}\"\nconcurrency = 16\nlease = \"3s\"\n{extra}"),
    )
}

/// Posts until a worker answers 202 or 200 (a worker may be dead or restarting).
async fn post_until_taken(bases: &[String], id: &str, body: &str) {
    let c = client();
    for round in 0.. {
        let base = &bases[round % bases.len()];
        let answer = c
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", id)
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
            .await;
        if let Ok(r) = answer
            && (r.status() == 202 || r.status() == 200)
        {
            return;
        }
        assert!(round < 400, "no worker took {id}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn all_claims(store: &claimd::store::Store) -> Vec<Claim> {
    let mut out = Vec::new();
    for o in 0..ORDERS {
        for k in 0..PER_ORDER {
            if let Some(c) = store
                .get("payments", "", &format!("o{o}-{k}"))
                .await
                .unwrap()
            {
                out.push(c);
            }
        }
    }
    out
}

async fn lines_hold_through_faults_and_kills(store: TestStore) {
    let (sandbox, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(15),
        fail_rate: 0.15,
        ambiguous_rate: 0.1,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let instances = if matches!(store, TestStore::Pg(_)) {
        2
    } else {
        1
    };
    let mut ports = Vec::new();
    let mut configs = Vec::new();
    for i in 0..instances {
        let port = free_port();
        let toml = config_toml(&store.url(), &consumer(&provider, "")).replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        );
        let path = dir.path().join(format!("claimd-{i}.toml"));
        std::fs::write(&path, toml).unwrap();
        ports.push(port);
        configs.push(path);
    }
    let log = dir.path().join("workers.log");
    let mut workers = Vec::new();
    for i in 0..instances {
        workers.push(Some(Worker::spawn(&configs[i], ports[i], &log).await));
    }
    let bases: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let db = claimd::store::open(&store.url(), 4).await.unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let producers: Vec<_> = (0..ORDERS)
        .map(|o| {
            let (bases, sent) = (bases.clone(), sent.clone());
            tokio::spawn(async move {
                for k in 0..PER_ORDER {
                    let kind = if k % 2 == 0 { "charge" } else { "refund" };
                    let body = format!(
                        r#"{{"order_id":"o{o}","kind":"{kind}","seq":{k},"amount_cents":{}}}"#,
                        100 + k
                    );
                    post_until_taken(&bases, &format!("o{o}-{k}"), &body).await;
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    // Kill each instance once, mid-run, and start it again.
    for (i, at) in [(0, 50), (instances - 1, 120)] {
        let reached = eventually(Duration::from_secs(60), || {
            let sent = sent.clone();
            async move { sent.load(Ordering::SeqCst) >= at }
        })
        .await;
        assert!(reached, "the producers stalled before {at} messages");
        workers[i].take().unwrap().kill();
        tokio::time::sleep(Duration::from_millis(300)).await;
        workers[i] = Some(Worker::spawn(&configs[i], ports[i], &log).await);
    }
    for p in producers {
        p.await.unwrap();
    }
    let done = eventually(Duration::from_secs(120), || {
        let db = db.clone();
        async move {
            let claims = all_claims(&db).await;
            claims.len() == ORDERS * PER_ORDER
                && claims.iter().all(|c| c.state == ClaimState::Completed)
        }
    })
    .await;
    let claims = all_claims(&db).await;
    let states: BTreeMap<String, usize> = claims.iter().fold(BTreeMap::new(), |mut m, c| {
        *m.entry(c.state.as_str().to_string()).or_default() += 1;
        m
    });
    assert!(done, "not every message completed: {states:?}");
    let applied: BTreeMap<String, (u64, chrono::DateTime<chrono::Utc>)> = sandbox
        .effects()
        .into_iter()
        .map(|e| (e.key, (e.applied, e.first_applied_utc)))
        .collect();
    let mut closest = Duration::MAX;
    for o in 0..ORDERS {
        let line: Vec<&Claim> = (0..PER_ORDER)
            .map(|k| {
                let id = format!("o{o}-{k}");
                claims.iter().find(|c| c.message_id == id).unwrap()
            })
            .collect();
        for c in &line {
            assert_eq!(c.order_key.as_deref(), Some(format!("o{o}").as_str()));
            let (times, _) = applied[&c.idem_key];
            assert_eq!(times, 1, "{} applied {times} times", c.message_id);
        }
        for pair in line.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            assert!(before.id < after.id, "claimed in the order sent");
            let settled = before
                .processed_utc
                .expect("a completed claim has its time");
            let (_, performed) = applied[&after.idem_key];
            assert!(
                performed >= settled,
                "{} was applied at {performed} before {} settled at {settled}",
                after.message_id,
                before.message_id
            );
            closest = closest.min((performed - settled).to_std().unwrap_or_default());
        }
    }
    let requests = sandbox.requests();
    println!(
        "order keys ({}): {} messages in {ORDERS} lines, {instances} instance(s) each SIGKILLed once, \
         {requests} provider requests, all completed in {:.1} s; each applied once, none before \
         the message ahead of it settled (closest: {} ms after)",
        if instances == 2 { "postgres" } else { "sqlite" },
        ORDERS * PER_ORDER,
        started.elapsed().as_secs_f64(),
        closest.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lines_hold_through_faults_and_kills_sqlite() {
    lines_hold_through_faults_and_kills(TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lines_hold_through_faults_and_kills_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    lines_hold_through_faults_and_kills(store).await;
}
