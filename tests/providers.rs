//! Driving real provider APIs safely: secrets that must be set, request shaping, status checks
//! that read the answer and the cap on re-sends, against the sandbox and a user's provider.

mod common;

use claimd::claim::{Claim, ClaimState};
use claimd::sandbox::SandboxOptions;
use common::*;
use std::time::Duration;

/// An unset `${VAR}` in a provider header stops `claimd run` with exit 2 naming the key; with
/// the default written out it starts.
#[test]
fn an_unset_provider_secret_refuses_to_start() {
    let store = TestStore::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", "http://127.0.0.1:9", ""),
    )
    .replace(
        "Bearer provider-secret-token",
        "Bearer ${CLAIMD_TEST_UNSET_SECRET_7C1}",
    );
    std::fs::write(&cfg, &toml).unwrap();
    let (code, _out, err) = cli(&["migrate", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("consumers[0].effect.headers.Authorization")
            && err.contains("CLAIMD_TEST_UNSET_SECRET_7C1"),
        "{err}"
    );
    std::fs::write(&cfg, toml.replace("SECRET_7C1}", "SECRET_7C1:-}")).unwrap();
    let (code, _out, err) = cli(&["migrate", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
}

async fn post(base: &str, key: &str, body: &str) -> u16 {
    client()
        .post(format!("{base}/v1/messages/payments"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn wait_state(store: &claimd::store::Store, id: &str, state: ClaimState) -> Claim {
    eventually(Duration::from_secs(30), || async {
        let c = store.get("payments", "", id).await.unwrap();
        c.is_some_and(|c| c.state == state)
    })
    .await;
    let c = store
        .get("payments", "", id)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{id} was never claimed"));
    assert_eq!(c.state, state, "{id}: {:?}", c.last_error);
    c
}

fn lines(events: &[claimd::store::ClaimEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| format!("{} {}", e.action, e.outcome))
        .collect()
}

/// A provider that ignores keys and applies every call, whose answers are always lost: under
/// `on_unknown = "redrive"` claimd sends at most `max_sends` times, records each re-send with
/// its reason, counts them in `report` and `/metrics`, and parks the claim saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resends_are_recorded_counted_and_capped_by_max_sends() {
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(SandboxOptions {
        ignore_keys: true,
        ambiguous_rate: 1.0,
        ..Default::default()
    })
    .await;
    let toml = config_toml(
        &store.url(),
        &consumer_toml(
            "payments",
            &provider,
            "on_unknown = \"redrive\"\nmax_sends = 3\nkey = \"{message_id}\"",
        ),
    );
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post(&base, "pay-1", "{}").await, 202);
    let s = running.app().store.clone();
    let c = wait_state(&s, "pay-1", ClaimState::NeedsAttention).await;
    let why = c.last_error.clone().unwrap();
    assert!(why.contains("max_sends = 3"), "{why}");
    assert_eq!(c.resent_count, 2);
    let applied: u64 = sandbox
        .effects()
        .iter()
        .filter(|e| e.key == "pay-1")
        .map(|e| e.applied)
        .sum();
    assert_eq!(applied, 3, "the first send and two re-sends, no more");
    let history = s.events(c.id).await.unwrap();
    let resends: Vec<_> = history.iter().filter(|e| e.action == "resend").collect();
    assert_eq!(resends.len(), 3, "{:?}", lines(&history));
    assert!(
        resends[..2].iter().all(|e| e.outcome == "unknown_outcome"
            && e.detail
                .as_deref()
                .unwrap_or("")
                .contains("outcome was unknown")),
        "{:?}",
        lines(&history)
    );
    assert_eq!(resends[2].outcome, "capped");
    // Several sweeper passes later nothing more was sent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sandbox.requests(), 3);
    let report = get_json(&format!("{base}/v1/report")).await;
    let payments = report["consumers"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["consumer"] == "payments"))
        .cloned()
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(payments["resent"], 1, "{payments}");
    let metrics = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("claimd_resent_total{consumer=\"payments\",reason=\"unknown_outcome\"} 2"),
        "{metrics}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// Under `reconcile`, the unknown call is in the history before the lookup that found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unknown_call_before_an_inline_lookup_is_in_the_history() {
    let store = TestStore::sqlite();
    let (_sandbox, provider) = sandbox(SandboxOptions {
        ambiguous_rate: 1.0,
        ..Default::default()
    })
    .await;
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", &provider, "key = \"{message_id}\""),
    );
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    assert_eq!(post(&base, "pay-2", "{}").await, 202);
    let s = running.app().store.clone();
    let c = wait_state(&s, "pay-2", ClaimState::Completed).await;
    assert!(c.reconciled);
    let history = lines(&s.events(c.id).await.unwrap());
    assert_eq!(
        history,
        ["perform unknown", "lookup found", "reconcile found"],
        "{history:?}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}
