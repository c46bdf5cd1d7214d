//! Soak: a worker with a one-second sweeper schedule under steady load, for a long time.
//! Prints how often the sweeper fired and the largest gap between passes, so "no pass is
//! skipped for good" (upstream tokio-cron-scheduler issue #113) is measured, not assumed.
//!
//! `SOAK_SECONDS=3600 SOAK_RATE=50 cargo bench --features full --bench sweeper_soak` (defaults: 60 s, 50 msg/s,
//! SQLite in a temporary directory; `SOAK_STORE=postgres://...` for PostgreSQL).

mod support;

use claimd::config::Config;
use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use claimd::service::app::App;
use claimd::service::run;
use std::path::Path;
use std::time::{Duration, Instant};
use support::env_or;

#[tokio::main]
async fn main() {
    let seconds: u64 = env_or("SOAK_SECONDS", 60);
    let rate: u64 = env_or("SOAK_RATE", 50);
    let dir = tempfile::tempdir().unwrap();
    let store = std::env::var("SOAK_STORE")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("soak.db").display()));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    let sandbox = Sandbox::new(SandboxOptions {
        latency: Duration::from_millis(20),
        fail_rate: 0.2,
        ..Default::default()
    });
    let served = sandbox.clone();
    tokio::spawn(async move { served.serve(listener, std::future::pending()).await });

    let toml = format!(
        r#"
[store]
url = "{store}"
[http]
listen = "127.0.0.1:0"
[sweeper]
schedule = "* * * * * *"
[[consumers]]
name = "payments"
source = "http"
lease = "3s"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "1s"
status_url = "{provider}/v1/effects/{{key}}"
"#
    );
    let config = Config::from_toml(&toml, Path::new("soak.toml"), std::env::vars())
        .expect("config")
        .config;
    let app = App::open(config, true).await.expect("open");
    let store_handle = app.store.clone();
    let running = run::start(app).await.expect("start");
    let base = format!("http://{}/v1/messages/payments", running.http_addr);

    let client = claimd::provider::tls::http_client_builder()
        .build()
        .expect("HTTP client");
    let started = Instant::now();
    let mut beats = Vec::new();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / rate.max(1)));
    let mut next_sample = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        let c = client.clone();
        let url = base.clone();
        let key = format!("soak-{sent}");
        tokio::spawn(async move {
            let _ = c
                .post(url)
                .header("Idempotency-Key", key)
                .body("{}")
                .send()
                .await;
        });
        sent += 1;
        if Instant::now() >= next_sample {
            next_sample += Duration::from_millis(250);
            if let Ok(Some(t)) = store_handle.last_sweep().await
                && beats.last() != Some(&t)
            {
                beats.push(t);
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    let counts = store_handle.counts(None).await.unwrap();
    let mut gaps: Vec<i64> = beats
        .windows(2)
        .map(|w| (w[1] - w[0]).num_milliseconds())
        .collect();
    gaps.sort_unstable();
    let pct = |q: f64| {
        gaps.get(((gaps.len() as f64 * q) as usize).min(gaps.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "| duration_s | sent | completed | started_left | passes_seen | p50_gap_ms | p99_gap_ms | max_gap_ms |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let c = counts.first().cloned().unwrap_or_default();
    println!(
        "| {seconds} | {sent} | {} | {} | {} | {} | {} | {} |",
        c.completed,
        c.started,
        beats.len(),
        pct(0.5),
        pct(0.99),
        gaps.last().copied().unwrap_or(0)
    );
    running.shutdown(Duration::from_secs(5)).await;
}
