//! Outcome events to an HTTP endpoint, signed with Standard Webhooks: a receiver on loopback
//! records every delivery and the independent `standardwebhooks` package (PyPI, pinned 1.1.0)
//! verifies each one. The receiver is down at first, then fails with `503`, then takes them:
//! no event is lost, a repeat carries the same `webhook-id`, and in the end every event is
//! marked sent.

use super::{all_completed, config, consumer_with_outcomes, event_rows, post_many};
use crate::common::{TestStore, sandbox, start};
use axum::http::{HeaderMap, StatusCode};
use claimd::provider::sandbox::SandboxOptions;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

const VERIFY: &str = r#"
import json, sys
from standardwebhooks import Webhook, WebhookVerificationError
out = []
for c in json.load(sys.stdin):
    try:
        Webhook(c["secret"]).verify(c["body"], c["headers"])
        out.append("ok")
    except WebhookVerificationError as e:
        out.append("rejected: " + str(e))
print(json.dumps(out))
"#;

/// The interpreter with `standardwebhooks` (`STANDARDWEBHOOKS_PYTHON`), or `None` after
/// saying why the test skips; a failure under `CI=true`.
fn python() -> Option<String> {
    let why = match std::env::var("STANDARDWEBHOOKS_PYTHON") {
        Ok(p)
            if Command::new(&p)
                .args(["-c", "import standardwebhooks"])
                .status()
                .is_ok_and(|s| s.success()) =>
        {
            return Some(p);
        }
        Ok(p) => format!("STANDARDWEBHOOKS_PYTHON={p} cannot import standardwebhooks"),
        Err(_) => {
            "STANDARDWEBHOOKS_PYTHON is not set (.ci/run installs standardwebhooks==1.1.0)".into()
        }
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// What the receiver got: (headers, body) per delivery it answered 2xx, and how many it
/// refused.
#[derive(Default)]
pub(super) struct Received {
    pub(super) taken: Vec<(HeaderMap, String)>,
    refused: usize,
    fail_next: usize,
}

pub(super) async fn receiver(listener: tokio::net::TcpListener, got: Arc<Mutex<Received>>) {
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let got = got.clone();
            async move {
                let mut g = got.lock().unwrap();
                if g.fail_next > 0 {
                    g.fail_next -= 1;
                    g.refused += 1;
                    return StatusCode::SERVICE_UNAVAILABLE;
                }
                g.taken.push((headers, body));
                StatusCode::NO_CONTENT
            }
        }),
    );
    axum::serve(listener, app).await.unwrap();
}

#[tokio::test]
async fn signed_events_reach_a_receiver_that_was_down_and_failing_and_none_is_lost() {
    let Some(python) = python() else { return };
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    let (_sb, provider) = sandbox(SandboxOptions::default()).await;
    // The receiver's port is chosen now and listened on later: down at first.
    let port = crate::common::free_port();
    let outcomes = format!(
        "kind = \"http\"\nurl = \"http://127.0.0.1:{port}/hook\"\nsecret = \"{SECRET}\"\ntimeout = \"2s\""
    );
    let consumer = consumer_with_outcomes("payments", &provider, "", &outcomes);
    let w = start(&config(&ts, &consumer)).await;
    let base = format!("http://{}", w.http_addr);
    post_many(&base, "payments", "m", 20).await;
    assert!(all_completed(&w.app().store, "payments", 20).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        event_rows(&ts.url()).await.iter().all(|r| !r.3),
        "nothing sent while the receiver is down"
    );
    // Up, but failing its first 5 requests.
    let got = Arc::new(Mutex::new(Received {
        fail_next: 5,
        ..Default::default()
    }));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(receiver(listener, got.clone()));
    post_many(&base, "payments", "n", 20).await;
    assert!(all_completed(&w.app().store, "payments", 40).await);
    let sent = crate::common::eventually(Duration::from_secs(90), || async {
        let rows = event_rows(&ts.url()).await;
        rows.len() == 40 && rows.iter().all(|r| r.3)
    })
    .await;
    assert!(sent, "every event sent in the end");
    let (taken, refused) = {
        let g = got.lock().unwrap();
        (g.taken.clone(), g.refused)
    };
    assert_eq!(refused, 5);
    let ids: HashSet<String> = taken
        .iter()
        .map(|(h, _)| h["webhook-id"].to_str().unwrap().to_string())
        .collect();
    let expected: HashSet<String> = event_rows(&ts.url())
        .await
        .iter()
        .map(|r| r.0.clone())
        .collect();
    assert_eq!(ids, expected, "every event delivered, none invented");
    assert_eq!(
        taken.len(),
        40,
        "one delivery each in normal operation after the outage"
    );
    // Every delivery verifies with the independent implementation.
    let ops: Vec<Value> = taken
        .iter()
        .map(|(h, body)| {
            let header = |n: &str| h[n].to_str().unwrap().to_string();
            json!({
                "secret": SECRET,
                "body": body,
                "headers": {
                    "webhook-id": header("webhook-id"),
                    "webhook-timestamp": header("webhook-timestamp"),
                    "webhook-signature": header("webhook-signature"),
                },
            })
        })
        .collect();
    let mut child = Command::new(&python)
        .args(["-c", VERIFY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&ops).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(answers.iter().all(|a| a == "ok"), "{answers:?}");
    for (h, body) in &taken {
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["id"], h["webhook-id"].to_str().unwrap());
        assert_eq!(v["state"], "completed");
        assert_eq!(v["consumer"], "payments");
    }
    // A tampered body is refused by the same implementation (the check is not vacuous).
    let mut bad = ops[0].clone();
    bad["body"] = json!(
        ops[0]["body"]
            .as_str()
            .unwrap()
            .replace("completed", "failed")
    );
    let mut child = Command::new(&python)
        .args(["-c", VERIFY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&[bad]).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let answers: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(answers[0].starts_with("rejected"), "{answers:?}");
    w.shutdown(Duration::from_secs(2)).await;
}

/// A measurement, not a check of speed: how fast a backlog drains to a receiver that takes
/// 40 ms an answer (a cross-region round trip). Prints one line; docs/outcome-events.md has the
/// figures. `cargo test --features full --test suite backlog_drain -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: a measurement; cargo test --features full --test suite backlog_drain -- --ignored --nocapture"]
async fn backlog_drain_to_a_slow_receiver() {
    const N: usize = 1000;
    let Some(ts) = TestStore::pg().await else {
        return;
    };
    let (_sb, provider) = sandbox(SandboxOptions::default()).await;
    let port = crate::common::free_port();
    let outcomes = format!(
        "kind = \"http\"\nurl = \"http://127.0.0.1:{port}/hook\"\nsecret = \"{SECRET}\"\ntimeout = \"2s\""
    );
    let consumer = consumer_with_outcomes("payments", &provider, "", &outcomes);
    let w = start(&config(&ts, &consumer)).await;
    let base = format!("http://{}", w.http_addr);
    post_many(&base, "payments", "m", N).await;
    assert!(all_completed(&w.app().store, "payments", N as i64).await);
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = {
        let taken = taken.clone();
        axum::Router::new().route(
            "/hook",
            axum::routing::post(move || {
                let taken = taken.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    StatusCode::NO_CONTENT
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let up = std::time::Instant::now();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let drained = crate::common::eventually(Duration::from_secs(600), || async {
        event_rows(&ts.url()).await.iter().all(|r| r.3)
    })
    .await;
    assert!(drained);
    let s = up.elapsed().as_secs_f64();
    eprintln!(
        "backlog drain: {N} events to a 40 ms receiver in {s:.1} s ({:.0} events/s), {} deliveries",
        N as f64 / s,
        taken.load(std::sync::atomic::Ordering::Relaxed)
    );
}
