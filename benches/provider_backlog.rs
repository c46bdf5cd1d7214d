//! A backlog left by a provider outage drains at the configured pace: 100,000 claims waiting
//! for their provider (handed back after answers that applied nothing, their leases just
//! ended) are taken by the sweeper and sent to the sandbox provider under
//! `effect.rate_limit = "500/s"` (the provider is `claimd sandbox` in a process of its own). Prints the drain second by second (completed, pace over the
//! last 10 s, the process's RSS) and the total against the target: 100,000 / 500 = 200 s
//! within 5 %, memory flat.
//!
//! `cargo bench --features full --bench provider_backlog` (env: `BENCH_PG` admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `BENCH_BACKLOG`, default 100000;
//! `BENCH_RATE`, default 500).

mod support;

use claimd::config::Config;
use claimd::service::app::App;
use std::time::{Duration, Instant};
use support::env_or;

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

#[tokio::main]
async fn main() {
    let backlog: i64 = env_or("BENCH_BACKLOG", 100_000);
    let rate: u32 = env_or("BENCH_RATE", 500);
    let db = support::BenchDb::create("backlog").await;
    let url = db.url.clone();

    // The provider in a process of its own, so that this process's memory is claimd's alone
    // (the sandbox keeps every effect it applied).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let provider = format!("http://127.0.0.1:{port}");
    let mut sandbox = std::process::Command::new(env!("CARGO_BIN_EXE_claimd"))
        .args(["sandbox", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the sandbox provider");
    let http = claimd::provider::tls::http_client_builder()
        .build()
        .expect("HTTP client");
    while http
        .get(format!("{provider}/healthz"))
        .send()
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let toml = format!(
        r#"
[store]
url = "{url}"
max_connections = 16
[http]
listen = "127.0.0.1:0"
[sweeper]
schedule = "* * * * * *"
batch_size = 20000
[[consumers]]
name = "payments"
source = "http"
concurrency = 1024
lease = "60s"
key = "{{message_id}}"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
status_url = "{provider}/v1/effects/{{key}}"
timeout = "10s"
rate_limit = "{rate}/s"
"#
    );
    let config = Config::from_toml(&toml, "bench.toml".as_ref(), std::env::vars())
        .expect("config")
        .config;
    let app = App::open(config, true).await.expect("open");
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    // What an outage leaves: claims handed back as not applied at attempt 1, waiting, their
    // leases ending now.
    let t = Instant::now();
    sqlx::query(
        "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
           content_type, state, attempt, lease_until, handoff, handoff_attempt, waits) \
         SELECT 'payments', '', 'b-' || g, 'b-' || g, 'f', '\\x7b7d'::bytea, 'application/json', \
           'started', 1, now() + interval '3 seconds', 'not_applied', 1, 1 \
         FROM generate_series(1, $1) g",
    )
    .bind(backlog)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE claims").execute(&pool).await.unwrap();
    println!(
        "backlog of {backlog} waiting claims written in {:.1} s; rate_limit = \"{rate}/s\", target {:.0} s",
        t.elapsed().as_secs_f64(),
        backlog as f64 / f64::from(rate)
    );
    let running = claimd::service::run::start(app).await.expect("start");
    let completed = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM claims WHERE state = 'completed'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    // The drain starts when the first claim completes.
    while completed().await == 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let start = Instant::now();
    let mut history: Vec<(f64, i64)> = Vec::new();
    let mut rss = Vec::new();
    println!("| s | completed | pace over the last 10 s (/s) | RSS MiB | load |");
    println!("|---|---|---|---|---|");
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let done = completed().await;
        let s = start.elapsed().as_secs_f64();
        history.push((s, done));
        let mem = rss_mib();
        rss.push(mem);
        let back = history
            .iter()
            .rev()
            .find(|(t, _)| s - t >= 10.0)
            .copied()
            .unwrap_or((0.0, 0));
        let pace = (done - back.1) as f64 / (s - back.0).max(1.0);
        if history.len().is_multiple_of(10) || done >= backlog {
            println!(
                "| {s:.0} | {done} | {pace:.0} | {mem:.1} | {:.1} |",
                support::load1()
            );
        }
        if done >= backlog || s > 1_000.0 {
            break;
        }
    }
    let total = start.elapsed().as_secs_f64();
    let target = backlog as f64 / f64::from(rate);
    let effects: serde_json::Value = http
        .get(format!("{provider}/v1/effects"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let applied_twice = effects["effects"].as_array().map_or(0, |e| {
        e.iter().filter(|e| e["applied"].as_u64() > Some(1)).count()
    });
    let (min, max) = rss
        .iter()
        .skip(rss.len() / 10)
        .fold((f64::MAX, 0.0f64), |(lo, hi), m| (lo.min(*m), hi.max(*m)));
    println!();
    println!(
        "| backlog | rate_limit | drained in | target | off by | mean pace | RSS after the first tenth, min-max MiB | applied twice |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {backlog} | {rate}/s | {total:.1} s | {target:.0} s ± 5 % | {:+.1} % | {:.0}/s | {min:.1}-{max:.1} | {applied_twice} |",
        (total / target - 1.0) * 100.0,
        backlog as f64 / total
    );
    running.shutdown(Duration::from_secs(5)).await;
    let _ = sandbox.kill();
    let _ = sandbox.wait();
    pool.close().await;
    db.drop_now().await;
}
