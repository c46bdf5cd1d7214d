//! Every provider example runs locally as its header comment says: the sandbox started with
//! the flags the comment gives (`--key-field idempotency_key` for Square, `--ignore-keys` for
//! the SMS API, none for Stripe), the example loaded with the environment the comment sets,
//! and the comment's message sent through it: the claim completes and the sandbox applied the
//! effect once.

use crate::common;

use claimd::config::Config;
use claimd::domain::claim::ClaimState;
use claimd::provider::sandbox::{Sandbox, SandboxModes, SandboxOptions};
use common::*;
use std::path::Path;
use std::time::Duration;

struct Example {
    file: &'static str,
    /// The sandbox command line the header comment gives.
    sandbox_line: &'static str,
    modes: SandboxModes,
    ignore_keys: bool,
    /// The environment the header comment sets, `{sandbox}` for the sandbox's URL.
    env: &'static [(&'static str, &'static str)],
    consumer: &'static str,
    message_id: &'static str,
    body: &'static str,
}

async fn run_example(ex: Example) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(ex.file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.lines()
            .any(|l| l.trim_start_matches(['#', ' ']) == ex.sandbox_line),
        "{} documents `{}`",
        ex.file,
        ex.sandbox_line
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sandbox = Sandbox::with_modes(
        SandboxOptions {
            ignore_keys: ex.ignore_keys,
            ..Default::default()
        },
        ex.modes,
    );
    let served = sandbox.clone();
    tokio::spawn(async move {
        let _ = served.serve(listener, std::future::pending()).await;
    });
    for (k, v) in ex.env {
        let line = format!("{k}={}", v.replace("{sandbox}", "http://127.0.0.1:8090"));
        assert!(text.contains(&line), "{} sets {line}", ex.file);
    }
    let store = TestStore::sqlite();
    let mut env: Vec<(String, String)> = ex
        .env
        .iter()
        .map(|(k, v)| (k.to_string(), v.replace("{sandbox}", &url)))
        .collect();
    env.extend([
        ("CLAIMD_STORE_URL".to_string(), store.url()),
        (
            "CLAIMD__HTTP__LISTEN".to_string(),
            "127.0.0.1:0".to_string(),
        ),
        (
            "CLAIMD__SWEEPER__SCHEDULE".to_string(),
            "* * * * * *".to_string(),
        ),
    ]);
    let config = Config::from_toml(&text, &path, env)
        .unwrap_or_else(|e| panic!("{}: {e}", ex.file))
        .config;
    let app = claimd::service::app::App::open(config, true)
        .await
        .expect("open app");
    let running = claimd::service::run::start(app)
        .await
        .expect("the example starts");
    let r = client()
        .post(format!(
            "http://{}/v1/messages/{}",
            running.http_addr, ex.consumer
        ))
        .header("Idempotency-Key", ex.message_id)
        .header("Content-Type", "application/json")
        .body(ex.body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().await.unwrap());
    let s = running.app().store.clone();
    let done = eventually(Duration::from_secs(20), || {
        let s = s.clone();
        async move {
            s.get(ex.consumer, "", ex.message_id)
                .await
                .unwrap()
                .is_some_and(|c| c.state == ClaimState::Completed)
        }
    })
    .await;
    let claim = s.get(ex.consumer, "", ex.message_id).await.unwrap();
    assert!(done, "{}: the message completes: {claim:?}", ex.file);
    let effects = sandbox.effects();
    assert_eq!(effects.len(), 1, "{}: {effects:?}", ex.file);
    assert_eq!(effects[0].applied, 1, "{}: applied once", ex.file);
    running.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_square_example_runs_against_the_sandbox() {
    run_example(Example {
        file: "config/examples/square.toml",
        sandbox_line: "claimd sandbox --key-field idempotency_key &",
        modes: SandboxModes {
            key_field: Some("idempotency_key".into()),
            ..Default::default()
        },
        ignore_keys: false,
        env: &[
            ("SQUARE_API", "{sandbox}"),
            ("SQUARE_ACCESS_TOKEN", "sandbox"),
        ],
        consumer: "square-payments",
        message_id: "order-7",
        body: r#"{"source_id": "cnon:card-nonce-ok", "amount": 1999, "currency": "USD"}"#,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sms_example_runs_against_the_sandbox() {
    run_example(Example {
        file: "config/examples/sms.toml",
        sandbox_line: "claimd sandbox --ignore-keys &",
        modes: SandboxModes::default(),
        ignore_keys: true,
        env: &[("SMS_API", "{sandbox}"), ("SMS_API_TOKEN", "sandbox")],
        consumer: "sms",
        message_id: "otp-42",
        body: r#"{"to": "+4915100000000", "text": "Your code is 4711"}"#,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stripe_example_runs_against_the_sandbox() {
    run_example(Example {
        file: "config/examples/stripe.toml",
        sandbox_line: "claimd sandbox &",
        modes: SandboxModes::default(),
        ignore_keys: false,
        env: &[
            ("STRIPE_API", "{sandbox}"),
            ("STRIPE_SECRET_KEY", "sk_test_local"),
            ("STRIPE_WEBHOOK_SECRET", "whsec_local"),
        ],
        consumer: "stripe-payments",
        message_id: "order-1001",
        body: r#"{"amount": 1999, "currency": "eur", "order": "1001", "payment_method": "pm_card_visa"}"#,
    })
    .await;
}
