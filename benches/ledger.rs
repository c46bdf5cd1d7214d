//! `claimd reconcile --ledger` at volume: N completed claims in PostgreSQL against N provider
//! objects listed by a paginating stand-in (Stripe's shape: newest first, 100 a page,
//! `starting_after`, `has_more`) on loopback. The stand-in makes each page from its index, so
//! it holds nothing; the process's peak RSS (`VmHWM`) is the reconciliation's. Every key
//! agrees but the last 10 claims (missing at the provider) and 10 extra objects (orphans), so
//! the run is a real match, not a short cut.
//!
//! `cargo bench --features full --bench ledger` (env: `BENCH_PG` admin URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; `BENCH_LEDGER_N`, default 5000; the figures
//! in docs/performance.md are at 100000).

mod support;

use axum::Router;
use axum::extract::{Query, State};
use axum::routing::get;
use claimd::config::Config;
use claimd::service::app::App;
use serde_json::json;
use std::collections::HashMap;
use std::time::Instant;
use support::env_or;

/// The process's memory, `field` of /proc/self/status (`VmRSS`, `VmHWM`), in MiB.
fn mem_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Objects `FIRST..last`: object i carries key `payments::m{i}` and amount i; listed newest
/// (highest index) first.
#[derive(Clone)]
struct StandIn {
    last: i64,
    created: i64,
}

/// The lowest object index: claims `m0..m9` have no object (missing).
const FIRST: i64 = 10;

async fn list(
    State(s): State<StandIn>,
    Query(q): Query<HashMap<String, String>>,
) -> axum::Json<serde_json::Value> {
    let limit: i64 = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(10);
    // Newest first: the first page starts at the highest index.
    let start = q
        .get("starting_after")
        .and_then(|id| id.strip_prefix("pi_"))
        .and_then(|i| i.parse::<i64>().ok())
        .map_or(s.last - 1, |i| i - 1);
    let end = (start - limit + 1).max(FIRST);
    let data: Vec<serde_json::Value> = (end..=start)
        .rev()
        .map(|i| {
            json!({"id": format!("pi_{i:09}"), "object": "payment_intent", "amount": i,
                   "currency": "eur", "created": s.created, "status": "succeeded",
                   "metadata": {"claimd_key": format!("payments::m{i}")}})
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data, "has_more": end > FIRST}))
}

#[tokio::main]
async fn main() {
    let n: i64 = env_or("BENCH_LEDGER_N", 5_000);
    let db = support::BenchDb::create("ledger").await;
    let url = db.url.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    let created = chrono::Utc::now().timestamp();
    // Claims m0 .. m(n-1); objects m10 .. m(n+9): 10 missing, 10 orphans.
    let stand_in = StandIn {
        last: n + FIRST,
        created,
    };
    tokio::spawn(async move {
        let app = Router::new()
            .route("/v1/payment_intents", get(list))
            .with_state(stand_in);
        axum::serve(listener, app).await.unwrap();
    });
    let toml = format!(
        r#"
[store]
url = "{url}"
[http]
listen = "127.0.0.1:0"
[[consumers]]
name = "payments"
source = "http"
key = "{{consumer}}:{{tenant}}:{{message_id}}"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payment_intents"
[consumers.effect.ledger]
url = "{provider}/v1/payment_intents?limit=100"
"#
    );
    let config = Config::from_toml(&toml, "bench.toml".as_ref(), std::env::vars())
        .expect("config")
        .config;
    let app = App::open(config, true).await.expect("open");
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let t = Instant::now();
    sqlx::query(
        "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
           content_type, state) \
         SELECT 'payments', '', 'm' || g, 'payments::m' || g, 'f', \
           convert_to('{\"amount\": ' || g || ', \"currency\": \"eur\"}', 'UTF8'), \
           'application/json', 'completed' \
         FROM generate_series(0, $1 - 1) g",
    )
    .bind(n)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE claims").execute(&pool).await.unwrap();
    let fill_s = t.elapsed().as_secs_f64();
    let rss_before = mem_mib("VmRSS:");
    let commands = claimd::ops::operator_command::OperatorCommands::new(None);
    let now = app.store.now().await.unwrap();
    let t = Instant::now();
    let run = claimd::ops::ledger::run(
        &app.store,
        app.claimer.consumers(),
        &commands,
        None,
        now - chrono::Duration::hours(1),
        now + chrono::Duration::minutes(1),
    )
    .await
    .expect("ledger run");
    let secs = t.elapsed().as_secs_f64();
    let peak = mem_mib("VmHWM:");
    let l = &run.consumers[0];
    assert_eq!(l.counts.agreeing as i64, n - 10, "{:?}", l.counts);
    assert_eq!(l.by_kind.get("orphan"), Some(&10));
    assert_eq!(l.by_kind.get("missing"), Some(&10));
    println!(
        "claims written in {fill_s:.1} s; load {:.2}",
        support::load1()
    );
    println!(
        "| claims | provider objects | pages | findings | time s | keys/s | RSS before MiB | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {n} | {} | {} | {} | {secs:.2} | {:.0} | {rss_before:.0} | {peak:.0} |",
        n,
        l.counts.pages,
        l.findings.len(),
        (n + FIRST) as f64 / secs,
    );
    drop(app);
    db.drop_now().await;
}
