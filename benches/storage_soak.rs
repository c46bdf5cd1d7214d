//! Storage soak (PostgreSQL): a worker under steady HTTP intake at a fixed rate for a long
//! time, retention every 10 s with the archive on, and one transaction left open in the middle.
//! Prints intake throughput and latency before, during and after that transaction, a timeline
//! of what `/metrics` said (dead rows of `claims`, the oldest transaction, whether
//! `ClaimdVacuumHeldBack` would have fired), and at the end each table's size against the size
//! of its live rows (`pgstattuple`).
//!
//! `cargo bench --features full --bench storage_soak` (env: `SOAK_MINUTES`, default 60;
//! `SOAK_RATE` messages a second, default 800; `SOAK_HOLD_MINUTES`, the open transaction,
//! default 10; `SOAK_CLIENTS`, default 32; `BENCH_PG` admin URL).

mod support;

use claimd::config::Config;
use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use claimd::service::app::App;
use claimd::service::run;
use sqlx::{Connection, Row};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::env_or;

/// One intake answer: seconds since the start, latency ms, 2xx.
type Sample = (f64, f64, bool);

/// What `/metrics` said at a moment: seconds since the start, dead and live rows of
/// `claims`, the oldest transaction's age (s).
type Scrape = (f64, f64, f64, f64);

#[tokio::main]
async fn main() {
    let minutes: f64 = env_or("SOAK_MINUTES", 60.0);
    let rate: f64 = env_or("SOAK_RATE", 800.0);
    let hold_min: f64 = env_or("SOAK_HOLD_MINUTES", 10.0);
    let clients: usize = env_or("SOAK_CLIENTS", 32);
    let total = Duration::from_secs_f64(minutes * 60.0);
    let hold = Duration::from_secs_f64(hold_min * 60.0);
    let hold_from = (total.saturating_sub(hold)) / 2;
    let db = support::BenchDb::create("soak").await;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    let sandbox = Sandbox::new(SandboxOptions::default());
    let served = sandbox.clone();
    tokio::spawn(async move { served.serve(listener, std::future::pending()).await });
    let toml = format!(
        r#"
[store]
url = "{url}"
max_connections = 16
[http]
listen = "127.0.0.1:0"
[sweeper]
schedule = "*/10 * * * * *"
[retention]
schedule = "*/10 * * * * *"
keep_terminal_for = "10m"
archive_after = "2m"
[[consumers]]
name = "payments"
source = "http"
concurrency = 64
lease = "60s"
redrive_within = "2m"
key = "{{message_id}}"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "10s"
status_url = "{provider}/v1/effects/{{key}}"
"#,
        url = db.url
    );
    let config = Config::from_toml(&toml, Path::new("soak.toml"), std::env::vars())
        .expect("config")
        .config;
    let app = App::open(config, true).await.expect("open");
    let running = run::start(app).await.expect("start");
    let base = format!("http://{}", running.http_addr);
    let started = Instant::now();

    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let mut load = Vec::new();
    let every = Duration::from_secs_f64(clients as f64 / rate);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .build()
        .unwrap();
    for c in 0..clients {
        let (client, samples, url) = (
            client.clone(),
            samples.clone(),
            format!("{base}/v1/messages/payments"),
        );
        load.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut i = 0u64;
            while started.elapsed() < total {
                tick.tick().await;
                let t = Instant::now();
                let ok = client
                    .post(&url)
                    .header("Idempotency-Key", format!("s-{c}-{i}"))
                    .header("Content-Type", "application/json")
                    .body(format!("{{\"amount\": {i}}}"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                let at = started.elapsed().as_secs_f64();
                let ms = t.elapsed().as_secs_f64() * 1e3;
                samples.lock().unwrap().push((at, ms, ok));
                i += 1;
            }
        }));
    }

    // The open transaction: it wrote (a transaction id), then idles.
    let holder = {
        let url = db.url.clone();
        tokio::spawn(async move {
            tokio::time::sleep(hold_from).await;
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::raw_sql("BEGIN; SELECT txid_current()")
                .execute(&mut c)
                .await
                .unwrap();
            tokio::time::sleep(hold).await;
            sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap();
        })
    };

    let scrapes = scrape_until(&base, started, total).await;
    for l in load {
        l.await.unwrap();
    }
    holder.await.unwrap();
    let samples = samples.lock().unwrap().clone();
    let (from, to) = (hold_from.as_secs_f64(), (hold_from + hold).as_secs_f64());
    println!(
        "\n{minutes} min at {rate} msgs/s offered, {clients} clients; transaction open from {:.0} to {:.0} min\n",
        from / 60.0,
        to / 60.0
    );
    println!(
        "| phase | minutes | accepted | msgs/s | intake p50 / p99 / max ms | refused or failed |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, a, b) in [
        ("before", 0.0, from),
        ("during", from, to),
        ("after", to, total.as_secs_f64()),
    ] {
        phase_row(name, &samples, a, b);
    }
    println!(
        "\n| minute | msgs/s | intake p99 ms | `claims` dead rows | `claims` live rows | oldest transaction s | ClaimdVacuumHeldBack |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut held_since: Option<f64> = None;
    let mut fired_at: Option<f64> = None;
    let step = 60.0 * (minutes / 12.0).max(1.0).round();
    let mut next_row = 0.0;
    for &(at, dead, live, oldest) in &scrapes {
        // The rule: oldest transaction over 300 s, for 2 minutes.
        held_since = if oldest > 300.0 {
            held_since.or(Some(at))
        } else {
            None
        };
        let firing = held_since.is_some_and(|s| at - s >= 120.0);
        if firing && fired_at.is_none() {
            fired_at = Some(at);
        }
        if at >= next_row {
            let in_minute: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.0 >= at - 60.0 && s.0 < at)
                .collect();
            let mut lat: Vec<f64> = in_minute.iter().map(|s| s.1).collect();
            lat.sort_by(f64::total_cmp);
            println!(
                "| {:.0} | {:.0} | {:.1} | {dead:.0} | {live:.0} | {oldest:.0} | {} |",
                at / 60.0,
                in_minute.len() as f64 / 60.0,
                pct(&lat, 0.99),
                if firing { "firing" } else { "-" }
            );
            next_row = at + step;
        }
    }
    match fired_at {
        Some(at) => println!(
            "\nClaimdVacuumHeldBack fired at {:.1} min ({:.1} min into the open transaction)",
            at / 60.0,
            (at - from) / 60.0
        ),
        None => println!("\nClaimdVacuumHeldBack did not fire"),
    }
    sizes(&db.url).await;
    // What an operator's `claimd reindex` (as the owner) does to them afterwards.
    let store = claimd::store::open(&db.url, 2).await.unwrap();
    let started = Instant::now();
    let done = store
        .rebuild_indexes(&Default::default(), false)
        .await
        .unwrap()
        .unwrap();
    let chosen: Vec<_> = done
        .indexes
        .iter()
        .filter(|i| i.bytes_after.is_some())
        .collect();
    let mib = |b: i64| b as f64 / 1_048_576.0;
    println!(
        "\n`claimd reindex`: {} index(es) rebuilt in {:.1} s, {:.1} MiB -> {:.1} MiB",
        chosen.len(),
        started.elapsed().as_secs_f64(),
        mib(chosen.iter().map(|i| i.reading.bytes).sum()),
        mib(chosen.iter().filter_map(|i| i.bytes_after).sum())
    );
    sizes(&db.url).await;
    drop(running);
    db.drop_now().await;
}

/// `/metrics` every 10 s until `total` has passed since `started`.
async fn scrape_until(base: &str, started: Instant, total: Duration) -> Vec<Scrape> {
    let mut out = Vec::new();
    let client = reqwest::Client::new();
    while started.elapsed() < total {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let Ok(r) = client.get(format!("{base}/metrics")).send().await else {
            continue;
        };
        let text = r.text().await.unwrap_or_default();
        let value = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        out.push((
            started.elapsed().as_secs_f64(),
            value("claimd_store_dead_rows{table=\"claims\"}"),
            value("claimd_store_live_rows{table=\"claims\"}"),
            value("claimd_store_oldest_transaction_seconds"),
        ));
    }
    out
}

fn phase_row(name: &str, samples: &[Sample], from: f64, to: f64) {
    let inside: Vec<&Sample> = samples.iter().filter(|s| s.0 >= from && s.0 < to).collect();
    let mut lat: Vec<f64> = inside.iter().filter(|s| s.2).map(|s| s.1).collect();
    lat.sort_by(f64::total_cmp);
    let failed = inside.iter().filter(|s| !s.2).count();
    let secs = (to - from).max(1.0);
    println!(
        "| {name} | {:.1} | {} | {:.0} | {:.1} / {:.1} / {:.1} | {failed} |",
        secs / 60.0,
        lat.len(),
        lat.len() as f64 / secs,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat.last().copied().unwrap_or(0.0)
    );
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Each table's heap and index bytes against its live rows' bytes, after a last vacuum.
async fn sizes(url: &str) {
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .execute(&mut c)
        .await
        .unwrap();
    println!(
        "\n| table | live rows | live rows MiB | heap MiB | indexes MiB | (heap + indexes) / live |"
    );
    println!("|---|---|---|---|---|---|");
    let (mut all_rows, mut all_live, mut all_bytes) = (0i64, 0i64, 0i64);
    let mib = |b: i64| b as f64 / 1_048_576.0;
    for table in ["claims", "claim_events", "outcome_events", "claims_archive"] {
        let parts: Vec<String> = sqlx::query_scalar(
            "SELECT c.oid::regclass::text FROM pg_class c WHERE c.oid = to_regclass($1) \
               AND c.relkind = 'r' \
             UNION ALL SELECT inhrelid::regclass::text FROM pg_inherits \
               WHERE inhparent = to_regclass($1)",
        )
        .bind(table)
        .fetch_all(&mut c)
        .await
        .unwrap();
        let (mut rows, mut live, mut heap, mut index) = (0i64, 0i64, 0i64, 0i64);
        for p in &parts {
            let r = sqlx::query(
                "SELECT tuple_count, tuple_len, table_len, pg_indexes_size($1::regclass) AS idx \
                 FROM pgstattuple($1::regclass)",
            )
            .bind(p)
            .fetch_one(&mut c)
            .await
            .unwrap();
            rows += r.get::<i64, _>("tuple_count");
            live += r.get::<i64, _>("tuple_len");
            heap += r.get::<i64, _>("table_len");
            index += r.get::<i64, _>("idx");
        }
        println!(
            "| {table} | {rows} | {:.1} | {:.1} | {:.1} | {:.1}× |",
            mib(live),
            mib(heap),
            mib(index),
            (heap + index) as f64 / live.max(1) as f64
        );
        (all_rows, all_live, all_bytes) =
            (all_rows + rows, all_live + live, all_bytes + heap + index);
    }
    println!(
        "| all four | {all_rows} | {:.1} | | | {:.1}× |",
        mib(all_live),
        all_bytes as f64 / all_live.max(1) as f64
    );
}
