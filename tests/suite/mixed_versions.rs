//! A rolling upgrade under load: two instances of the previous build on one PostgreSQL take
//! payments while they are replaced, one at a time, by the current build, each old instance
//! SIGKILLed (not stopped) and the new one started on its port, which migrates the schema
//! while the other old instance keeps working. The provider ignores idempotency keys, so a
//! second call would be a second charge. Then: every accepted message is `completed`, each
//! applied exactly once, none lost, and intake answered no error (a refused connection, the
//! instance being down, is tried on the other, as a load balancer would).

use crate::common;

use claimd::provider::sandbox::SandboxOptions;
use common::previous_build::{previous_claimd, spawn_ready};
use common::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::Mutex;

/// Messages sent.
const N: usize = 600;

#[derive(Default)]
struct Intake {
    accepted: Vec<String>,
    errors: Vec<String>,
}

/// Posts `N` payments, four at a time, about 40 a second, each to one of `ports` in turn,
/// to the other when the connection is refused.
async fn load(ports: [u16; 2], done: Arc<Mutex<Intake>>) {
    let c = client();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut senders = Vec::new();
    for _ in 0..4 {
        let (c, next, done) = (c.clone(), next.clone(), done.clone());
        senders.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= N {
                    return;
                }
                let id = format!("pay-{i}");
                let mut tries = 0;
                loop {
                    let port = ports[(i + tries) % 2];
                    let sent = c
                        .post(format!("http://127.0.0.1:{port}/v1/messages/payments"))
                        .header("Idempotency-Key", &id)
                        .body(format!("{{\"amount\": {i}}}"))
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                    match sent {
                        Ok(r) if r.status().is_success() => {
                            done.lock().await.accepted.push(id.clone());
                            break;
                        }
                        Ok(r) => {
                            let status = r.status();
                            let body = r.text().await.unwrap_or_default();
                            done.lock()
                                .await
                                .errors
                                .push(format!("{id}: {status} {body}"));
                            break;
                        }
                        // Down (killed, not started yet): the other instance.
                        Err(e) if e.is_connect() && tries < 200 => {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        // Killed while the request was in flight: its claim may exist or
                        // not; the same message again is a duplicate or a new claim.
                        Err(_) if tries < 200 => {
                            tries += 1;
                        }
                        Err(e) => {
                            done.lock().await.errors.push(format!("{id}: {e}"));
                            break;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    for s in senders {
        s.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: builds the previous claimd once (minutes), then a rolling upgrade under load"]
async fn a_rolling_upgrade_under_load_loses_and_doubles_nothing() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let Some(previous) = previous_claimd() else {
        return;
    };
    let (sandbox, provider) = sandbox(SandboxOptions {
        latency: Duration::from_millis(300),
        ignore_keys: true,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port()];
    let configs: Vec<std::path::PathBuf> = ports
        .iter()
        .enumerate()
        .map(|(n, port)| {
            let consumer = consumer_toml(
                "payments",
                &provider,
                "lease = \"4s\"\nkey = \"{message_id}\"",
            );
            let toml = config_toml(&store.url(), &consumer).replace(
                "listen = \"127.0.0.1:0\"",
                &format!("listen = \"127.0.0.1:{port}\""),
            );
            let path = dir.path().join(format!("instance{n}.toml"));
            std::fs::write(&path, toml).unwrap();
            path
        })
        .collect();
    let log = |name: &str| dir.path().join(format!("{name}.log"));
    let old_a = spawn_ready(&previous, &configs[0], ports[0], &log("old-a")).await;
    let old_b = spawn_ready(&previous, &configs[1], ports[1], &log("old-b")).await;

    let intake = Arc::new(Mutex::new(Intake::default()));
    let loading = tokio::spawn(load(ports, intake.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    old_a.kill();
    let new_a = spawn_ready(&claimd_bin(), &configs[0], ports[0], &log("new-a")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    old_b.kill();
    let _new_b = spawn_ready(&claimd_bin(), &configs[1], ports[1], &log("new-b")).await;
    loading.await.unwrap();

    let intake = intake.lock().await;
    assert!(
        intake.errors.is_empty(),
        "intake answered errors: {:?}",
        intake.errors
    );
    assert_eq!(intake.accepted.len(), N, "every message accepted");
    let url = store.url();
    let s = claimd::store::open(&url, 2).await.unwrap();
    let all_done = eventually(Duration::from_secs(60), || async {
        let mut done = 0;
        for id in &intake.accepted {
            if s.get("payments", "", id)
                .await
                .ok()
                .flatten()
                .is_some_and(|c| c.state == claimd::domain::claim::ClaimState::Completed)
            {
                done += 1;
            }
        }
        done == N
    })
    .await;
    let effects = sandbox.effects();
    let mut doubled = Vec::new();
    let mut missing = Vec::new();
    for id in &intake.accepted {
        match effects.iter().find(|e| &e.key == id).map(|e| e.applied) {
            Some(1) => {}
            Some(n) => doubled.push(format!("{id} x{n}")),
            None => missing.push(id.clone()),
        }
    }
    let migrated: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(&mut {
            use sqlx::Connection;
            sqlx::PgConnection::connect(&url).await.unwrap()
        })
        .await
        .unwrap();
    eprintln!(
        "\n| messages | accepted | intake errors | completed | applied once | doubled | lost | schema |\n\
         |---:|---:|---:|---|---:|---:|---:|---:|\n| {N} | {} | {} | {} | {} | {} | {} | {migrated} |",
        intake.accepted.len(),
        intake.errors.len(),
        if all_done { "all" } else { "not all" },
        N - doubled.len() - missing.len(),
        doubled.len(),
        missing.len(),
    );
    assert!(doubled.is_empty(), "applied more than once: {doubled:?}");
    assert!(missing.is_empty(), "never applied: {missing:?}");
    assert!(all_done, "every accepted message completed");
    assert!(
        migrated >= 22,
        "the current build migrated beside the previous one"
    );
    drop(new_a);
}
