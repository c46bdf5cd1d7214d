//! Memory at the HTTP edge under a flood of large bodies: 300 clients post 1 MiB bodies for
//! 15 s to a `claimd run` whose provider is slow (500 ms, concurrency 64). Prints claimd's peak
//! RSS, its RSS 20 s after the load, what was acknowledged and refused, and checks that every
//! acknowledged post was applied exactly once. Exits non-zero if one was not.
//!
//! ```sh
//! cargo build && cargo run --example edge_memory
//! EDGE_CLIENTS=300 EDGE_BODY_BYTES=1048576 EDGE_SECONDS=15 EDGE_LATENCY_MS=500 \
//!   EDGE_CONCURRENCY=64 EDGE_HTTP='body_budget_bytes = 67108864' cargo run --example edge_memory
//! ```
//! `CLAIMD_BIN` picks the binary (default `target/debug/claimd`, else `target/release/claimd`);
//! `EDGE_STORE` a store URL (default: SQLite in a temporary directory); `EDGE_HTTP` extra
//! `[http]` lines for claimd.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn claimd_bin() -> PathBuf {
    if let Ok(p) = std::env::var("CLAIMD_BIN") {
        return p.into();
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let debug = root.join("target/debug/claimd");
    if debug.exists() {
        debug
    } else {
        root.join("target/release/claimd")
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `VmRSS` and `VmHWM` of a process, in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_up(c: &reqwest::Client, url: &str) {
    for _ in 0..200 {
        if c.get(url).send().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} did not come up");
}

#[tokio::main]
async fn main() {
    let clients: usize = env_or("EDGE_CLIENTS", 300);
    let body_bytes: usize = env_or("EDGE_BODY_BYTES", 1_048_576);
    let seconds: u64 = env_or("EDGE_SECONDS", 15);
    let latency_ms: u64 = env_or("EDGE_LATENCY_MS", 500);
    let concurrency: u32 = env_or("EDGE_CONCURRENCY", 64);
    let http_extra: String = env_or("EDGE_HTTP", String::new());
    let bin = claimd_bin();
    let dir = tempfile::tempdir().unwrap();
    let store: String = env_or(
        "EDGE_STORE",
        format!("sqlite://{}", dir.path().join("claims.db").display()),
    );

    let sandbox_port = free_port();
    let _sandbox = Kill(
        Command::new(&bin)
            .args([
                "sandbox",
                "--listen",
                &format!("127.0.0.1:{sandbox_port}"),
                "--latency-ms",
                &latency_ms.to_string(),
            ])
            .env("CLAIMD_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the sandbox"),
    );
    let port = free_port();
    let config = dir.path().join("edge.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[store]
url = "{store}"
[http]
listen = "127.0.0.1:{port}"
max_body_bytes = {max_body}
{http_extra}
[[consumers]]
name = "payments"
source = "http"
concurrency = {concurrency}
lease = "60s"
[consumers.effect]
kind = "http"
url = "http://127.0.0.1:{sandbox_port}/v1/payments"
timeout = "10s"
status_url = "http://127.0.0.1:{sandbox_port}/v1/effects/{{key}}"
"#,
            max_body = body_bytes.max(1_048_576),
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("claimd.log")).unwrap();
    let worker = Kill(
        Command::new(&bin)
            .args(["run", "--config"])
            .arg(&config)
            .env("CLAIMD_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start claimd"),
    );
    let pid = worker.0.id();
    let base = format!("http://127.0.0.1:{port}");
    let c = claimd::provider::tls::http_client_builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(clients)
        .build()
        .unwrap();
    wait_up(&c, &format!("{base}/healthz")).await;
    wait_up(&c, &format!("http://127.0.0.1:{sandbox_port}/v1/effects")).await;
    let (rss_start, _) = rss_kib(pid);

    // Sample RSS through the load.
    let peak_sampled = Arc::new(AtomicU64::new(0));
    let sampling = {
        let peak = peak_sampled.clone();
        tokio::spawn(async move {
            loop {
                let (rss, _) = rss_kib(pid);
                peak.fetch_max(rss, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let body = bytes::Bytes::from(vec![b'x'; body_bytes]);
    let refused = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let stop_at = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for w in 0..clients {
        let c = c.clone();
        let base = base.clone();
        let body = body.clone();
        let refused = refused.clone();
        let failed = failed.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut i = 0;
            while Instant::now() < stop_at {
                let key = format!("w{w}-{i}");
                // The same key and body until it is acknowledged (what a client does on 503).
                loop {
                    let r = c
                        .post(format!("{base}/v1/messages/payments"))
                        .header("Idempotency-Key", &key)
                        .header("Content-Type", "application/octet-stream")
                        .body(body.clone())
                        .send()
                        .await;
                    match r.map(|r| r.status().as_u16()) {
                        Ok(202) | Ok(200) => {
                            acked.push(key.clone());
                            break;
                        }
                        Ok(503) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                    if Instant::now() >= stop_at + Duration::from_secs(30) {
                        break;
                    }
                }
                i += 1;
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    let load_s = started.elapsed().as_secs_f64();
    let (_, hwm_after_load) = rss_kib(pid);

    // Every acknowledged post applied once: wait for the claims to finish.
    let mut applied: HashMap<String, u64> = HashMap::new();
    let drain = Instant::now();
    while drain.elapsed() < Duration::from_secs(120) {
        let v: serde_json::Value = c
            .get(format!("http://127.0.0.1:{sandbox_port}/v1/effects"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        applied = v
            .as_array()
            .or_else(|| v["effects"].as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|e| Some((e["key"].as_str()?.to_string(), e["applied"].as_u64()?)))
                    .collect()
            })
            .unwrap_or_default();
        if acked
            .iter()
            .all(|k| applied.contains_key(&format!("payments::{k}")))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let applied_once = acked
        .iter()
        .filter(|k| applied.get(&format!("payments::{k}")) == Some(&1))
        .count();
    let doubled = applied.values().filter(|n| **n > 1).count();
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(drain.elapsed())).await;
    let (rss_later, hwm) = rss_kib(pid);
    sampling.abort();
    let mib = |kib: u64| format!("{:.0} MiB", kib as f64 / 1024.0);

    println!(
        "{clients} clients x {} KiB bodies for {seconds} s, provider {latency_ms} ms, concurrency {concurrency}{}",
        body_bytes / 1024,
        if http_extra.is_empty() {
            String::new()
        } else {
            format!(", [http] {}", http_extra.replace('\n', "; "))
        }
    );
    println!("{:<44} {:>12}", "figure", "value");
    for (k, v) in [
        ("claimd RSS before the load", mib(rss_start)),
        ("claimd peak RSS (VmHWM)", mib(hwm.max(hwm_after_load))),
        ("claimd RSS 20 s after the load", mib(rss_later)),
        ("posts acknowledged (202/200)", acked.len().to_string()),
        (
            "acknowledged per second",
            format!("{:.0}", acked.len() as f64 / load_s),
        ),
        (
            "refused 503 + Retry-After (then retried)",
            refused.load(Ordering::Relaxed).to_string(),
        ),
        (
            "other failures (timeouts, resets)",
            failed.load(Ordering::Relaxed).to_string(),
        ),
        (
            "acknowledged and applied exactly once",
            applied_once.to_string(),
        ),
        ("keys applied more than once", doubled.to_string()),
    ] {
        println!("{k:<44} {v:>12}");
    }
    if applied_once != acked.len() || doubled > 0 {
        eprintln!("FAILED: not every acknowledged post was applied exactly once");
        std::process::exit(1);
    }
}
