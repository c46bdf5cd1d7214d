//! Workers killed with SIGKILL mid-call and between the provider's effect and the settle:
//! the next sweep finishes every claim without a second effect (I4, I6).

use crate::common;

use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::SandboxOptions;
use common::provider::{Script, TestProvider};
use common::*;
use std::path::PathBuf;
use std::time::Duration;

struct Setup {
    dir: tempfile::TempDir,
    config: PathBuf,
    port: u16,
    store_url: String,
}

fn setup(store: &TestStore, provider_url: &str, extra: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let consumer = consumer_toml(
        "payments",
        provider_url,
        // Keys equal to the message ids, so the provider's records read plainly.
        &format!("lease = \"4s\"\nkey = \"{{message_id}}\"\n{extra}"),
    )
    .replace("timeout = \"1s\"", "timeout = \"3s\"");
    let toml = config_toml(&store.url(), &consumer).replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    let config = dir.path().join("claimd.toml");
    std::fs::write(&config, toml).unwrap();
    Setup {
        config,
        port,
        store_url: store.url(),
        dir,
    }
}

async fn post_all(base: &str, n: usize) {
    for i in 0..n {
        let r = client()
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", format!("k{i}"))
            .body(format!("{{\"n\":{i}}}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
}

async fn states(url: &str, n: usize) -> Vec<claimd::domain::claim::Claim> {
    let s = claimd::store::open(url, 2).await.unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            s.get("payments", "", &format!("k{i}"))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    out
}

async fn all_in(url: &str, n: usize, state: ClaimState, within: Duration) -> bool {
    eventually(within, || async {
        states(url, n).await.iter().all(|c| c.state == state)
    })
    .await
}

const N: usize = 10;

/// Kill while the provider holds the calls (before or after applying), restart, check.
async fn kill_and_recover(
    store: &TestStore,
    script: Script,
    extra: &str,
) -> (TestProvider, Setup, Worker, u32) {
    let provider = TestProvider::start(script).await;
    let s = setup(store, &provider.url, extra);
    let log = s.dir.path().join("worker.log");
    let w = Worker::spawn(&s.config, s.port, &log).await;
    post_all(&w.base, N).await;
    // Every call has reached the provider and is being held there.
    assert!(
        eventually(Duration::from_secs(10), || async {
            (0..N).all(|i| provider.requests(&format!("k{i}")) >= 1)
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed_pid = w.child.id();
    w.kill();
    let before = states(&s.store_url, N).await;
    assert!(
        before.iter().all(|c| c.state == ClaimState::Started),
        "killed mid-call: still started"
    );
    // A new worker; its sweeper takes the claims once their lease expires.
    let w2 = Worker::spawn(&s.config, s.port, &log).await;
    (provider, s, w2, killed_pid)
}

/// Whether claim `k{i}`'s history has the takeover line naming the killed process (instance
/// `host-pid`) as the holder of attempt 1: who to look at when a claim was orphaned.
async fn takeover_names(url: &str, i: usize, killed_pid: u32) -> bool {
    let s = claimd::store::open(url, 2).await.unwrap();
    let c = s
        .get("payments", "", &format!("k{i}"))
        .await
        .unwrap()
        .unwrap();
    let events = s.events(c.id).await.unwrap();
    let suffix = format!("-{killed_pid}; its lease ran out without a hand-off");
    events.iter().any(|e| {
        e.action == "takeover"
            && e.outcome == "lease_expired"
            && e.attempt == 2
            && e.detail.as_deref().is_some_and(|d| {
                d.starts_with("attempt 1 was held by ") && d.contains(suffix.as_str())
            })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_the_call_completes_once_after_the_sweep() {
    let store = TestStore::sqlite();
    let url = store.url();
    let (provider, _s, _w, killed_pid) = kill_and_recover(
        &store,
        Script {
            delay_before_apply_ms: 1500,
            ..Default::default()
        },
        "",
    )
    .await;
    assert!(all_in(&url, N, ClaimState::Completed, Duration::from_secs(30)).await);
    for i in 0..N {
        assert_eq!(provider.applied(&format!("k{i}")), 1);
        assert!(
            takeover_names(&url, i, killed_pid).await,
            "k{i}: the takeover names the killed worker"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_effect_and_settle_is_reconciled_not_repeated() {
    let store = TestStore::sqlite();
    let url = store.url();
    let (provider, _s, _w, _) = kill_and_recover(
        &store,
        Script {
            delay_after_apply_ms: 2500,
            ..Default::default()
        },
        "",
    )
    .await;
    assert!(all_in(&url, N, ClaimState::Completed, Duration::from_secs(30)).await);
    for c in states(&url, N).await {
        assert_eq!(provider.applied(&c.message_id), 1);
        assert!(
            c.reconciled,
            "found at the status endpoint, not performed again"
        );
        assert_eq!(
            provider.requests(&c.message_id),
            1,
            "no second request for {}",
            c.message_id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_ignores_keys_is_not_charged_twice_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let url = store.url();
    let (sandbox, sandbox_url) = sandbox(SandboxOptions {
        latency: Duration::from_millis(1500),
        ignore_keys: true,
        ..Default::default()
    })
    .await;
    let s = setup(&store, &sandbox_url, "");
    let log = s.dir.path().join("worker.log");
    let w = Worker::spawn(&s.config, s.port, &log).await;
    post_all(&w.base, N).await;
    // Kill after the sandbox applied (its latency ends) but before the answer is read:
    // some claims die mid-call, some after the effect.
    tokio::time::sleep(Duration::from_millis(1450)).await;
    w.kill();
    let _w2 = Worker::spawn(&s.config, s.port, &log).await;
    assert!(all_in(&url, N, ClaimState::Completed, Duration::from_secs(30)).await);
    let effects = sandbox.effects();
    for i in 0..N {
        let key = format!("k{i}");
        let applied = effects
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.applied)
            .unwrap_or(0);
        assert_eq!(
            applied, 1,
            "{key} applied {applied} times at a provider that ignores keys"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_claims_wait_for_a_person_then_clear() {
    let store = TestStore::sqlite();
    let url = store.url();
    let (provider, s, _w, _) = kill_and_recover(
        &store,
        Script {
            delay_after_apply_ms: 2500,
            ..Default::default()
        },
        "on_unknown = \"park\"",
    )
    .await;
    assert!(all_in(&url, N, ClaimState::NeedsAttention, Duration::from_secs(30)).await);
    let cfg = s.config.to_str().unwrap();
    let (code, out, _) = cli(&["report", "--check", "--config", cfg]);
    assert_eq!(
        code, 3,
        "report --check must fail while claims need attention:\n{out}"
    );
    assert!(
        out.contains("needs_attention") && out.contains("on_unknown = \"park\""),
        "{out}"
    );
    let (code, out, _) = cli(&["report", "--format", "json", "--config", cfg]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["consumers"][0]["needs_attention"], N as u64);
    assert_eq!(v["attention"].as_array().unwrap().len(), N);
    for i in 0..N {
        let id = format!("k{i}");
        let (code, out, err) = cli(&[
            "claims",
            "resolve",
            "payments",
            &id,
            "--as",
            "completed",
            "--note",
            "confirmed in provider dashboard",
            "--config",
            cfg,
        ]);
        assert_eq!(code, 0, "{out}{err}");
        assert_eq!(provider.applied(&id), 1);
    }
    let (code, out, _) = cli(&["report", "--check", "--config", cfg]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = cli(&["claims", "show", "payments", "k0", "--config", cfg]);
    assert_eq!(code, 0);
    assert!(
        out.contains("confirmed in provider dashboard") && out.contains("resolve"),
        "{out}"
    );
    assert!(
        !out.contains("provider-secret-token"),
        "secrets never shown"
    );
}
