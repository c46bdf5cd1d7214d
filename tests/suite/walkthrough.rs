//! README's walk-through on the shipped `config/default.toml` (ports and the SQLite file moved
//! aside): a payment the sandbox is asked to decline ends `failed` with the provider's message,
//! and a refund it applies then answers 500 for is parked by the `refunds` consumer, where the
//! sandbox's record shows the refund happened; read-only commands run on that configuration.

use crate::common;

use claimd::domain::claim::ClaimState;
use common::*;
use std::time::Duration;

/// The shipped `config/default.toml` with its ports (intake, sandbox) and SQLite file moved
/// aside: the folder, the sandbox's port and the text.
fn shipped_default() -> (tempfile::TempDir, u16, String) {
    let dir = tempfile::tempdir().unwrap();
    let (http, sandbox) = (free_port(), free_port());
    let toml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.toml"))
        .unwrap()
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{http}"))
        .replace("127.0.0.1:8090", &format!("127.0.0.1:{sandbox}"))
        .replace(
            "sqlite://claimd.db",
            &format!("sqlite://{}", dir.path().join("claimd.db").display()),
        );
    (dir, sandbox, toml)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walk_through_declines_a_payment_and_parks_a_refund() {
    let (dir, sandbox, toml) = shipped_default();
    let toml = toml.replace("*/10 * * * * *", "* * * * * *");
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    let c = client();
    let post = |consumer: &str, key: &str, body: &str| {
        c.post(format!("{base}/v1/messages/{consumer}"))
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
    };
    let r = post(
        "payments",
        "order-1002",
        r#"{"amount": 990, "currency": "EUR", "sandbox": "decline"}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let r = post(
        "refunds",
        "refund-7",
        r#"{"amount": 500, "currency": "EUR", "sandbox": "unknown"}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 202);

    let settled = |consumer: &'static str, id: &'static str, state: ClaimState| {
        let s = s.clone();
        async move {
            s.get(consumer, "", id)
                .await
                .unwrap()
                .is_some_and(|c| c.state == state)
        }
    };
    assert!(
        eventually(Duration::from_secs(20), || settled(
            "payments",
            "order-1002",
            ClaimState::Failed
        ))
        .await,
        "the declined payment fails"
    );
    assert!(
        eventually(Duration::from_secs(20), || settled(
            "refunds",
            "refund-7",
            ClaimState::NeedsAttention
        ))
        .await,
        "the refund is parked"
    );
    let failed = s.get("payments", "", "order-1002").await.unwrap().unwrap();
    assert_eq!(failed.provider_status, Some(402));
    assert!(
        failed
            .provider_response
            .as_deref()
            .unwrap_or_default()
            .contains("the card was declined"),
        "{failed:?}"
    );
    let parked = s.get("refunds", "", "refund-7").await.unwrap().unwrap();
    assert!(
        parked
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("on_unknown"),
        "{parked:?}"
    );
    // What README has the reader look up: the refund happened, once.
    let v = get_json(&format!(
        "http://127.0.0.1:{sandbox}/v1/effects/refunds::refund-7"
    ))
    .await;
    assert_eq!(v["applied"], 1, "{v}");
    // The page puts it at the top.
    let page = c
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let attention = page.find("Needs a look").unwrap();
    assert!(
        page[attention..].contains("refund-7"),
        "parked refund listed"
    );
    assert!(
        page.find("Claims by consumer").unwrap() > attention,
        "what needs a person comes before the counts"
    );
    assert!(
        page.contains("the card was declined"),
        "the failed table quotes the provider"
    );

    // Read-only commands need no provider secret.
    let cfg = dir.path().join("claimd.toml");
    std::fs::write(
        &cfg,
        toml.replace("${PROVIDER_TOKEN:-sandbox}", "${PROVIDER_TOKEN}"),
    )
    .unwrap();
    let cfg = cfg.to_string_lossy().to_string();
    let (code, out, err) = cli(&["--config", &cfg, "claims", "list", "--search", "refund"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("refund-7"), "{out}");
    let (code, _, err) = cli(&["--config", &cfg, "sweep", "--dry-run"]);
    assert_eq!(
        code, 2,
        "a command that calls providers still needs the secret: {err}"
    );
    assert!(err.contains("PROVIDER_TOKEN"), "{err}");

    running.shutdown(Duration::from_secs(2)).await;
}

/// README's pending payment on the shipped configuration: the sandbox answers "processing",
/// the claim waits `pending`, the sandbox's signed webhook settles it (long before the first
/// poll, a minute later), the search finds it by the provider's id, and `reconcile --ledger`
/// reads the sandbox's list and finds the ledgers in agreement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walk_through_s_pending_payment_is_settled_by_the_sandbox_s_webhook() {
    let (dir, sandbox, toml) = shipped_default();
    let toml = toml.replace(r#"processing_for = "10s""#, r#"processing_for = "2s""#);
    assert!(
        toml.contains(r#"processing_for = "2s""#),
        "the sandbox's wait is set"
    );
    let running = start(&toml).await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    let c = client();
    for (key, body) in [
        ("order-1001", r#"{"amount": 1250, "currency": "EUR"}"#),
        (
            "order-1003",
            r#"{"amount": 4200, "currency": "EUR", "sandbox": "processing"}"#,
        ),
    ] {
        let r = c
            .post(format!("{base}/v1/messages/payments"))
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{key}");
    }
    let state = |id: &'static str| {
        let s = s.clone();
        async move { s.get("payments", "", id).await.unwrap().map(|c| c.state) }
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            state("order-1003").await == Some(ClaimState::Pending)
        })
        .await,
        "the processing payment waits pending: {:?}",
        state("order-1003").await
    );
    // The sandbox says so too, until its wait is over.
    let v = get_json(&format!(
        "http://127.0.0.1:{sandbox}/v1/effects/payments::order-1003"
    ))
    .await;
    assert_eq!(v["response"]["status"], "processing", "{v}");
    assert!(
        eventually(Duration::from_secs(20), || async {
            state("order-1003").await == Some(ClaimState::Completed)
        })
        .await,
        "the webhook settles it long before the first poll (1 minute): {:?}",
        state("order-1003").await
    );
    let done = s.get("payments", "", "order-1003").await.unwrap().unwrap();
    let id = done.provider_id.clone().expect("the provider's id is kept");
    assert!(id.starts_with("eff_"), "{id}");

    let cfg = dir.path().join("claimd.toml");
    std::fs::write(&cfg, &toml).unwrap();
    let cfg = cfg.to_string_lossy().to_string();
    // README: the search box and `claims list --search` find a claim by the provider's id.
    let (code, out, err) = cli(&["--config", &cfg, "claims", "list", "--search", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("order-1003"), "{out}");
    // The sandbox lists what it applied; the ledgers agree.
    let (code, out, err) = cli(&[
        "--config",
        &cfg,
        "reconcile",
        "--ledger",
        "--since",
        "1h",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "the ledgers match: {err}\n{out}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let payments = report["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["consumer"] == "payments")
        .unwrap_or_else(|| panic!("payments has a ledger: {out}"))
        .clone();
    assert_eq!(payments["counts"]["agreeing"], 2, "{payments}");

    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_on_one_sqlite_file_refuses_to_start() {
    let store = TestStore::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", "http://127.0.0.1:9", ""),
    )
    .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    let cfg = dir.path().join("claimd.toml");
    std::fs::write(&cfg, &toml).unwrap();
    let first = Worker::spawn(&cfg, port, &dir.path().join("first.log")).await;
    let (code, _, err) = cli(&["run", "--config", &cfg.to_string_lossy()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("another `claimd run` is using the SQLite store"),
        "{err}"
    );
    // Read-only commands still work beside it.
    let (code, _, err) = cli(&["claims", "list", "--config", &cfg.to_string_lossy()]);
    assert_eq!(code, 0, "{err}");
    // Once the first is gone, a new one starts.
    first.kill();
    let second = Worker::spawn(&cfg, port, &dir.path().join("second.log")).await;
    second.kill();
}
