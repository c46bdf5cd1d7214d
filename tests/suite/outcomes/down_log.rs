//! An outcome webhook that is down is logged when it goes down and when it comes back, naming
//! the outcome destination, not once a round (which was 7 lines a second, each calling it
//! "the provider").

use super::post_many;
use crate::common::{TestStore, config_toml, consumer_toml, free_port, ready_worker, sandbox};
use claimd::provider::sandbox::SandboxOptions;
use std::time::Duration;

/// The log's warnings about the destination `hooks`.
fn warnings(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("hooks") && l.contains("WARN"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_outcome_webhook_is_logged_once_per_change_naming_the_destination() {
    let store = TestStore::sqlite();
    let (_sb, provider) = sandbox(SandboxOptions::default()).await;
    let hook_port = free_port();
    let consumer = format!(
        r#"{}
[[consumers.outcomes]]
kind = "http"
name = "hooks"
url = "http://127.0.0.1:{hook_port}/hook"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
timeout = "2s"
poll = "50ms"
"#,
        consumer_toml("payments", &provider, "")
    );
    let dir = tempfile::tempdir().unwrap();
    let w = ready_worker(&config_toml(&store.url(), &consumer), dir.path(), "w").await;
    let log = dir.path().join("w.log");
    post_many(&w.base, "payments", "down", 40).await;
    let down_for = Duration::from_secs(10);
    tokio::time::sleep(down_for).await;
    let lines = warnings(&log);
    eprintln!(
        "{} warnings in {down_for:?} with the webhook down:\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(
        !lines.is_empty(),
        "the destination going down is logged: {lines:?}"
    );
    assert!(
        lines.len() <= 2,
        "{} warnings in {down_for:?}: logged once per change, not once a round",
        lines.len()
    );
    assert!(
        lines
            .iter()
            .all(|l| l.contains("outcome destination") && !l.contains("the provider")),
        "the lines name the outcome destination: {lines:?}"
    );

    // It comes back: one line says so, and no more warnings.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", hook_port))
        .await
        .unwrap();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(|| async { axum::http::StatusCode::NO_CONTENT }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let back = crate::common::eventually(Duration::from_secs(40), || async {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("hooks") && l.contains("confirms events again"))
    })
    .await;
    assert!(back, "the destination's recovery is logged");
    assert_eq!(
        warnings(&log).len(),
        lines.len(),
        "no warning after it is back"
    );
    w.kill();
}
