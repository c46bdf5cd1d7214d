//! Throughput, side by side: claimd against the two usual alternatives, over the real path
//! (HTTP intake → claim → provider call to the sandbox on loopback → settle).
//!
//! Designs (each server runs in its own process, a re-exec of this binary with `--mode`, so its
//! peak RSS (`VmHWM`) is its own; the client and the sandbox provider run in the parent):
//!
//! - `direct`: an axum handler that calls the provider and answers when it returns. No claims:
//!   the unsafe ceiling.
//! - `txn`: the single-transaction inbox. BEGIN; INSERT claim ... ON CONFLICT DO NOTHING;
//!   provider call; UPDATE settle; COMMIT, holding a pooled PostgreSQL connection (and the row
//!   lock) during the call.
//! - `claimd-sqlite`, `claimd-pg`: the real worker (`claimd::run::start`); the client gets 202
//!   and the effect runs after; "settled" is `processed_utc - received_utc` from the store and
//!   throughput counts until the last claim is settled.
//!
//! Then a database-only section: claim + settle from `BENCH_POOL` tasks through `PgStore`,
//! against the same single-row INSERT + UPDATE sent with sqlx directly (the machine's ceiling),
//! and the batched calls (`claim_many` + `settle_many`).
//!
//! `cargo bench --bench throughput`. Environment (defaults in brackets):
//! `BENCH_N` posts per run [100000], 10% of them duplicates of an earlier message;
//! `BENCH_LATENCIES` provider latency in ms, comma-separated [0,10,50];
//! `BENCH_CONCURRENCY` client connections [64]; `BENCH_POOL` database pool size [16];
//! `BENCH_CONSUMER_CONCURRENCY` claimd's consumer `concurrency` [= BENCH_CONCURRENCY];
//! `BENCH_DESIGNS` [direct,txn,claimd-sqlite,claimd-pg,claimd-pg-park,claimd-pg-unbatched,
//! claimd-pg-wide]: `claimd-pg-park` is `on_unknown = "park"`, which takes the call slot
//! before claiming (the intake order before claims-ahead), `claimd-pg-unbatched` has
//! `[store] batch_writes = false`, `claimd-pg-wide` consumer concurrency
//! `BENCH_WIDE_CONCURRENCY` [256]: more effects in flight than client connections; `BENCH_DB_CALLERS` concurrent callers of the batched store
//! [256]; `BENCH_DB_N` claims in the
//! database-only section [50000, 0 skips it]; `BENCH_BATCH` batch size there [64];
//! `BENCH_INFLIGHT` one extra claimd-pg run (`claimd-pg-memory`) `latency_ms:concurrency:n` for memory with many
//! effects in flight [2000:1000:10000, empty skips it]; `BENCH_PG` admin URL
//! [postgres://postgres@127.0.0.1:5432/postgres]; `BENCH_CSV` [target/bench/throughput.csv].

mod support;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use claimd::app::App;
use claimd::claim::{ClaimState, NewClaim, fingerprint};
use claimd::config::Config;
use claimd::sandbox::{Sandbox, SandboxOptions};
use claimd::store::postgres::PgStore;
use claimd::store::{ClaimOutcome, ClaimStore, NewEvent, SettleItem, Settlement};
use sqlx::Connection;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};
use support::{env_or, load1};
use tokio::io::{AsyncBufReadExt, BufReader};

fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Post `p`: its message number (dups repeat the message posted 99 posts before) and body.
fn message_of(p: usize) -> usize {
    if p % 10 == 9 && p >= 100 { p - 99 } else { p }
}

fn body_of(m: usize) -> String {
    format!(
        "{{\"amount\":{},\"currency\":\"EUR\",\"order\":\"o-{m}\"}}",
        m % 9973 + 1
    )
}

fn unique_messages(n: usize) -> usize {
    (0..n).filter(|&p| message_of(p) == p).count()
}

// ---------------------------------------------------------------------------------------------
// Child side: one server per process.
// ---------------------------------------------------------------------------------------------

#[derive(Clone)]
struct Handler {
    http: reqwest::Client,
    provider: String,
    pool: Option<sqlx::PgPool>,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

struct Flight(Arc<AtomicUsize>);

impl Drop for Flight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Handler {
    fn enter(&self) -> Flight {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        Flight(self.in_flight.clone())
    }

    async fn call(&self, key: &str, body: Bytes) -> Result<(u16, String), String> {
        let r = self
            .http
            .post(&self.provider)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = r.status().as_u16();
        let text = r.text().await.map_err(|e| e.to_string())?;
        Ok((status, text))
    }
}

fn key_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Design 1: call the provider in the handler, no claim.
async fn direct(State(h): State<Handler>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let _f = h.enter();
    let Some(key) = key_of(&headers) else {
        return StatusCode::BAD_REQUEST;
    };
    match h.call(&key, body).await {
        Ok((s, _)) => StatusCode::from_u16(s).unwrap_or(StatusCode::BAD_GATEWAY),
        Err(_) => StatusCode::BAD_GATEWAY,
    }
}

/// The single-row claim insert of the `txn` design and of the database-only ceiling.
const SINGLE_ROW_INSERT: &str = "\
    INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
      content_type, lease_owner, lease_until) \
    VALUES ('payments', '', $1, $1, $2, $3, 'application/json', 'bench', \
      now() + interval '60 seconds') \
    ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING id";

const TXN_SETTLE: &str = "\
    UPDATE claims SET state = 'completed', processed_utc = now(), provider_status = $2, \
      provider_response = $3, lease_owner = NULL, lease_until = NULL, updated_utc = now() \
    WHERE id = $1 AND attempt = 1 AND state = 'started'";

/// Design 2: one transaction around the call.
async fn txn(State(h): State<Handler>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let _f = h.enter();
    let Some(key) = key_of(&headers) else {
        return StatusCode::BAD_REQUEST;
    };
    let pool = h.pool.as_ref().expect("txn has a pool");
    let work = async {
        let mut tx = pool.begin().await?;
        let id: Option<i64> = sqlx::query_scalar(SINGLE_ROW_INSERT)
            .bind(&key)
            .bind(fingerprint(&body))
            .bind(body.to_vec())
            .fetch_optional(&mut *tx)
            .await?;
        let Some(id) = id else {
            tx.commit().await?;
            return Ok::<StatusCode, sqlx::Error>(StatusCode::OK);
        };
        let (status, text) = match h.call(&key, body).await {
            Ok(a) => a,
            Err(_) => {
                tx.rollback().await?;
                return Ok(StatusCode::BAD_GATEWAY);
            }
        };
        sqlx::query(TXN_SETTLE)
            .bind(id)
            .bind(i32::from(status))
            .bind(text)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY))
    };
    work.await.unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
}

fn claimd_toml(
    store: &str,
    provider: &str,
    pool: u32,
    concurrency: u32,
    on_unknown: &str,
) -> String {
    format!(
        r#"
[store]
url = "{store}"
max_connections = {pool}
[http]
listen = "127.0.0.1:0"
intake_wait = "2s"
[sweeper]
schedule = "*/10 * * * * *"
[[consumers]]
name = "payments"
source = "http"
concurrency = {concurrency}
lease = "60s"
on_unknown = "{on_unknown}"
key = "{{message_id}}"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "10s"
status_url = "{provider}/v1/effects/{{key}}"
"#
    )
}

async fn child(mode: &str) {
    let provider: String = std::env::var("BENCH_PROVIDER").expect("BENCH_PROVIDER");
    let pool_size: u32 = env_or("BENCH_POOL", 16);
    let peak = Arc::new(AtomicUsize::new(0));
    let addr = match mode {
        "direct" | "txn" => {
            let pool = if mode == "txn" {
                let url = std::env::var("BENCH_STORE").expect("BENCH_STORE");
                Some(
                    sqlx::postgres::PgPoolOptions::new()
                        .max_connections(pool_size)
                        .acquire_timeout(Duration::from_secs(120))
                        .connect(&url)
                        .await
                        .expect("txn pool"),
                )
            } else {
                None
            };
            let h = Handler {
                http: reqwest::Client::builder()
                    .timeout(Duration::from_secs(30))
                    .build()
                    .unwrap(),
                provider: format!("{provider}/v1/payments"),
                pool,
                in_flight: Arc::new(AtomicUsize::new(0)),
                peak: peak.clone(),
            };
            let route = if mode == "direct" {
                post(direct)
            } else {
                post(txn)
            };
            let router = Router::new()
                .route("/v1/messages/{consumer}", route)
                .with_state(h);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, router).await });
            addr
        }
        "claimd" => {
            let store = std::env::var("BENCH_STORE").expect("BENCH_STORE");
            let conc: u32 = env_or("BENCH_CONSUMER_CONCURRENCY", 64);
            let on_unknown: String = env_or("BENCH_ON_UNKNOWN", "reconcile".to_string());
            let toml = claimd_toml(&store, &provider, pool_size, conc, &on_unknown);
            let config = Config::from_toml(&toml, Path::new("bench.toml"), std::env::vars())
                .expect("config")
                .config;
            let app = App::open(config, true).await.expect("open app");
            let claimer = app.claimer.clone();
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    let n: usize = claimer.consumers().map(|c| c.in_flight()).sum();
                    peak.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            let running = claimd::run::start(app).await.expect("start");
            let addr = running.http_addr;
            std::mem::forget(running);
            addr
        }
        other => panic!("unknown mode {other}"),
    };
    println!("READY {addr}");
    std::io::stdout().flush().unwrap();
    // Runs until the parent closes stdin.
    tokio::task::spawn_blocking(|| {
        use std::io::BufRead as _;
        for _ in std::io::stdin().lock().lines().map_while(Result::ok) {}
    })
    .await
    .unwrap();
    println!("PEAK {}", peak.load(Ordering::SeqCst));
    std::io::stdout().flush().unwrap();
    std::process::exit(0);
}

// ---------------------------------------------------------------------------------------------
// Parent side: the client, the sandbox, the measurements.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Run {
    design: String,
    latency_ms: u64,
    consumer_concurrency: u32,
    n: usize,
}

#[derive(Debug, Default, Clone)]
struct Row {
    msgs_per_s: f64,
    ack_p50: f64,
    ack_p99: f64,
    settled_p50: f64,
    settled_p99: f64,
    rss_mib: f64,
    peak_in_flight: usize,
    xacts_per_msg: Option<f64>,
    retries: u64,
    non_2xx: u64,
    load_before: f64,
    load_after: f64,
}

struct Pg {
    admin: String,
}

impl Pg {
    async fn create(&self, name: &str) -> String {
        let mut c = sqlx::PgConnection::connect(&self.admin).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut c)
        .await
        .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut c)
            .await
            .unwrap();
        format!("{}/{name}", self.admin.rsplit_once('/').unwrap().0)
    }

    async fn drop_db(&self, name: &str) {
        let mut c = sqlx::PgConnection::connect(&self.admin).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut c)
        .await
        .unwrap();
    }

    /// Committed + rolled-back transactions of database `name` so far (pg_stat_database).
    async fn xacts(&self, name: &str) -> i64 {
        let mut c = sqlx::PgConnection::connect(&self.admin).await.unwrap();
        sqlx::query_scalar(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
        )
        .bind(name)
        .fetch_one(&mut c)
        .await
        .unwrap()
    }
}

struct ClientResult {
    ack_ms: Vec<f64>,
    retries: u64,
    non_2xx: u64,
}

async fn drive_client(base: &str, n: usize, concurrency: usize) -> ClientResult {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let non_2xx = Arc::new(AtomicU64::new(0));
    let url = format!("{base}/v1/messages/payments");
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, next, retries, non_2xx, url) = (
            client.clone(),
            next.clone(),
            retries.clone(),
            non_2xx.clone(),
            url.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let p = next.fetch_add(1, Ordering::Relaxed);
                if p >= n {
                    return lat;
                }
                let m = message_of(p);
                let key = format!("m-{m}");
                let body = body_of(m);
                let t = Instant::now();
                loop {
                    match client
                        .post(&url)
                        .header("Idempotency-Key", &key)
                        .header("Content-Type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                    {
                        Ok(r) if r.status() == StatusCode::SERVICE_UNAVAILABLE => {
                            retries.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Ok(r) => {
                            if !r.status().is_success() {
                                non_2xx.fetch_add(1, Ordering::Relaxed);
                            }
                            let _ = r.bytes().await;
                            break;
                        }
                        Err(_) => {
                            retries.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }));
    }
    let mut ack_ms = Vec::with_capacity(n);
    for t in tasks {
        ack_ms.extend(t.await.unwrap());
    }
    ack_ms.sort_by(f64::total_cmp);
    ClientResult {
        ack_ms,
        retries: retries.load(Ordering::Relaxed),
        non_2xx: non_2xx.load(Ordering::Relaxed),
    }
}

/// Store-side view of a claimd run: (settle latencies in ms sorted, last processed time in
/// seconds since the epoch), after waiting until nothing is `started`. Counts its own
/// PostgreSQL transactions in `polls`.
async fn wait_settled(store: &str, polls: &mut i64) -> (Vec<f64>, f64) {
    if store.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(store).await.unwrap();
        loop {
            let open: i64 =
                sqlx::query_scalar("SELECT count(*) FROM claims WHERE state = 'started'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            if open == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT processed_utc - received_utc, processed_utc FROM claims WHERE state = 'completed'",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let last = rows.iter().map(|r| r.1).max().unwrap_or(0) as f64 / 1000.0;
        let mut lat: Vec<f64> = rows.iter().map(|r| r.0 as f64).collect();
        lat.sort_by(f64::total_cmp);
        pool.close().await;
        (lat, last)
    } else {
        let mut c = sqlx::PgConnection::connect(store).await.unwrap();
        loop {
            *polls += 1;
            let open: i64 =
                sqlx::query_scalar("SELECT count(*) FROM claims WHERE state = 'started'")
                    .fetch_one(&mut c)
                    .await
                    .unwrap();
            if open == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        *polls += 1;
        let rows: Vec<(f64, f64)> = sqlx::query_as(
            "SELECT (EXTRACT(EPOCH FROM processed_utc - received_utc) * 1000)::float8, \
                    EXTRACT(EPOCH FROM processed_utc)::float8 \
             FROM claims WHERE state = 'completed'",
        )
        .fetch_all(&mut c)
        .await
        .unwrap();
        let last = rows.iter().map(|r| r.1).fold(0.0, f64::max);
        let mut lat: Vec<f64> = rows.iter().map(|r| r.0).collect();
        lat.sort_by(f64::total_cmp);
        (lat, last)
    }
}

async fn run_one(pg: &Pg, run: &Run, concurrency: usize, pool: u32, idx: usize) -> Row {
    // The provider, fresh for every run, in this (the client's) process.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    let sandbox = Sandbox::new(SandboxOptions {
        latency: Duration::from_millis(run.latency_ms),
        ..Default::default()
    });
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let served = sandbox.clone();
    let sb = tokio::spawn(async move {
        let _ = served
            .serve(listener, async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            })
            .await;
    });

    let dbname = format!("claimd_bench_tp_{}_{idx}", std::process::id());
    let tmp = tempfile::tempdir().unwrap();
    let (mode, store) = match run.design.as_str() {
        "direct" => ("direct", String::new()),
        "txn" => {
            let url = pg.create(&dbname).await;
            PgStore::connect(&url, 1)
                .await
                .unwrap()
                .migrate()
                .await
                .unwrap();
            ("txn", url)
        }
        "claimd-pg"
        | "claimd-pg-unbatched"
        | "claimd-pg-wide"
        | "claimd-pg-memory"
        | "claimd-pg-park" => ("claimd", pg.create(&dbname).await),
        "claimd-sqlite" => (
            "claimd",
            format!("sqlite://{}", tmp.path().join("claims.db").display()),
        ),
        other => panic!("unknown design {other}"),
    };
    let on_pg = store.starts_with("postgres");

    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--mode", mode])
        .env("BENCH_PROVIDER", &provider)
        .env("BENCH_STORE", &store)
        .env("BENCH_POOL", pool.to_string())
        .env(
            "CLAIMD__STORE__BATCH_WRITES",
            (run.design != "claimd-pg-unbatched").to_string(),
        )
        .env(
            "BENCH_CONSUMER_CONCURRENCY",
            run.consumer_concurrency.to_string(),
        )
        .env(
            "BENCH_ON_UNKNOWN",
            if run.design == "claimd-pg-park" {
                "park"
            } else {
                "reconcile"
            },
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn server process");
    let pid = child.id().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let line = out.next_line().await.unwrap().expect("child exited early");
        if let Some(a) = line.strip_prefix("READY ") {
            break format!("http://{a}");
        }
    };
    let x0 = if on_pg { pg.xacts(&dbname).await } else { 0 };

    let load_before = load1();
    let start_wall = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let t0 = Instant::now();
    let client = drive_client(&base, run.n, concurrency).await;
    let client_s = t0.elapsed().as_secs_f64();
    let mut polls = 0i64;
    let (settled, elapsed) = if mode == "claimd" {
        let (lat, last) = wait_settled(&store, &mut polls).await;
        (lat, (last - start_wall).max(client_s))
    } else {
        (client.ack_ms.clone(), client_s)
    };
    let load_after = load1();
    let rss_kib = vm_hwm_kib(pid);
    drop(child.stdin.take());
    let mut peak = 0usize;
    while let Ok(Some(line)) = out.next_line().await {
        if let Some(p) = line.strip_prefix("PEAK ") {
            peak = p.trim().parse().unwrap_or(0);
        }
    }
    let _ = child.wait().await;
    let xacts_per_msg = if on_pg {
        // Backends report their statistics when they exit; give the collector a moment.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let x1 = pg.xacts(&dbname).await;
        Some((x1 - x0 - polls) as f64 / run.n as f64)
    } else {
        None
    };
    let _ = stop_tx.send(true);
    let _ = sb.await;
    let unique = unique_messages(run.n);
    let effects = sandbox.effects();
    assert_eq!(
        effects.len(),
        unique,
        "{}: every message must reach the provider",
        run.design
    );
    assert!(
        effects.iter().all(|e| e.applied == 1),
        "{}: an effect applied twice",
        run.design
    );
    if on_pg {
        pg.drop_db(&dbname).await;
    }
    Row {
        msgs_per_s: run.n as f64 / elapsed,
        ack_p50: quantile(&client.ack_ms, 0.5),
        ack_p99: quantile(&client.ack_ms, 0.99),
        settled_p50: quantile(&settled, 0.5),
        settled_p99: quantile(&settled, 0.99),
        rss_mib: rss_kib as f64 / 1024.0,
        peak_in_flight: peak,
        xacts_per_msg,
        retries: client.retries,
        non_2xx: client.non_2xx,
        load_before,
        load_after,
    }
}

// ---------------------------------------------------------------------------------------------
// Database only.
// ---------------------------------------------------------------------------------------------

const RAW_SETTLE: &str = "\
    UPDATE claims SET state = 'completed', processed_utc = now(), updated_utc = now() \
    WHERE id = $1 AND attempt = 1 AND state = 'started'";

fn new_claim(i: usize) -> NewClaim {
    let body = body_of(i);
    NewClaim {
        consumer: "payments".into(),
        tenant: String::new(),
        message_id: format!("m-{i}"),
        idem_key: format!("m-{i}"),
        fingerprint: fingerprint(body.as_bytes()),
        payload: body.into_bytes(),
        content_type: "application/json".into(),
        worker: "bench".into(),
        lease: Duration::from_secs(60),
        claim_token: claimd::claim::new_claim_token(),
    }
}

fn applied() -> Settlement {
    Settlement {
        state: Some(ClaimState::Completed),
        provider_status: Some(200),
        provider_response: Some("{\"ok\":true}".into()),
        ..Default::default()
    }
}

const EVENT: NewEvent<'static> = NewEvent {
    actor: "bench",
    action: "perform",
    outcome: "applied",
    provider_status: Some(200),
    detail: None,
};

/// Runs `tasks` workers over `n` items, each worker calling `f(batch_start, batch_len)`.
async fn spread<F, Fut>(n: usize, tasks: usize, batch: usize, f: F) -> f64
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let mut hs = Vec::new();
    for _ in 0..tasks {
        let (next, f) = (next.clone(), f.clone());
        hs.push(tokio::spawn(async move {
            loop {
                let s = next.fetch_add(batch, Ordering::Relaxed);
                if s >= n {
                    return;
                }
                f(s, batch.min(n - s)).await;
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    n as f64 / t.elapsed().as_secs_f64()
}

async fn db_only(
    pg: &Pg,
    n: usize,
    pool: u32,
    batch: usize,
    callers: usize,
) -> Vec<(String, f64, f64, f64)> {
    let mut rows = Vec::new();
    for variant in ["raw", "claimd", "claimd-coalesced", "claimd-batched"] {
        let name = format!("claimd_bench_db_{}_{variant}", std::process::id()).replace('-', "_");
        let url = pg.create(&name).await;
        let store = PgStore::connect(&url, pool).await.unwrap();
        store.migrate().await.unwrap();
        let (store, tasks) = match variant {
            "raw" | "claimd" => (store.unbatched(), pool as usize),
            "claimd-coalesced" => (store, callers),
            _ => (store.unbatched(), pool as usize),
        };
        let x0 = pg.xacts(&name).await;
        let load = load1();
        let rate = match variant {
            "raw" => {
                let p = store.pool().clone();
                spread(n, pool as usize, 1, move |i, _| {
                    let p = p.clone();
                    async move {
                        let c = new_claim(i);
                        let id: i64 = sqlx::query_scalar(SINGLE_ROW_INSERT)
                            .bind(&c.message_id)
                            .bind(&c.fingerprint)
                            .bind(&c.payload)
                            .fetch_one(&p)
                            .await
                            .unwrap();
                        sqlx::query(RAW_SETTLE).bind(id).execute(&p).await.unwrap();
                    }
                })
                .await
            }
            "claimd" | "claimd-coalesced" => {
                let s = store.clone();
                spread(n, tasks, 1, move |i, _| {
                    let s = s.clone();
                    async move {
                        let ClaimOutcome::Created(c) = s.claim(&new_claim(i)).await.unwrap() else {
                            panic!("new claim expected")
                        };
                        assert!(s.settle(c.id, c.attempt, &applied(), &EVENT).await.unwrap());
                    }
                })
                .await
            }
            _ => {
                let s = store.clone();
                spread(n, tasks, batch, move |start, len| {
                    let s = s.clone();
                    async move {
                        let news: Vec<NewClaim> = (start..start + len).map(new_claim).collect();
                        let out = s.claim_many(&news).await.unwrap();
                        let items: Vec<SettleItem<'_>> = out
                            .iter()
                            .map(|o| match o {
                                ClaimOutcome::Created(c) => SettleItem {
                                    id: c.id,
                                    attempt: c.attempt,
                                    settlement: applied(),
                                    event: EVENT,
                                },
                                _ => panic!("new claim expected"),
                            })
                            .collect();
                        let done = s.settle_many(&items).await.unwrap();
                        assert!(done.iter().all(|d| *d));
                    }
                })
                .await
            }
        };
        let completed: i64 =
            sqlx::query_scalar("SELECT count(*) FROM claims WHERE state = 'completed'")
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(completed as usize, n, "{variant}: every claim settled");
        store.pool().close().await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let x1 = pg.xacts(&name).await;
        // Minus migration-free bookkeeping: the count above and the first xacts read.
        let per = (x1 - x0 - 1) as f64 / n as f64;
        pg.drop_db(&name).await;
        rows.push((variant.to_string(), rate, per, load));
    }
    rows
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--mode") {
        child(&args[i + 1]).await;
        return;
    }
    let n: usize = env_or("BENCH_N", 100_000);
    let concurrency: usize = env_or("BENCH_CONCURRENCY", 64);
    let pool: u32 = env_or("BENCH_POOL", 16);
    let consumer_concurrency: u32 = env_or("BENCH_CONSUMER_CONCURRENCY", concurrency as u32);
    let wide: u32 = env_or("BENCH_WIDE_CONCURRENCY", 256);
    let latencies: Vec<u64> = env_or("BENCH_LATENCIES", "0,10,50".to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let designs: Vec<String> = env_or(
        "BENCH_DESIGNS",
        "direct,txn,claimd-sqlite,claimd-pg,claimd-pg-park,claimd-pg-unbatched,claimd-pg-wide"
            .to_string(),
    )
    .split(',')
    .map(|s| s.trim().to_string())
    .filter(|s| !s.is_empty())
    .collect();
    let db_n: usize = env_or("BENCH_DB_N", 50_000);
    let db_callers: usize = env_or("BENCH_DB_CALLERS", 256);
    let batch: usize = env_or("BENCH_BATCH", 64);
    let inflight: String = env_or("BENCH_INFLIGHT", "2000:1000:10000".to_string());
    let csv_path: String = env_or("BENCH_CSV", "target/bench/throughput.csv".to_string());
    let pg = Pg {
        admin: env_or(
            "BENCH_PG",
            "postgres://postgres@127.0.0.1:5432/postgres".to_string(),
        ),
    };

    let mut runs = Vec::new();
    for &latency_ms in &latencies {
        for d in &designs {
            runs.push(Run {
                design: d.clone(),
                latency_ms,
                consumer_concurrency: if d == "claimd-pg-wide" {
                    wide
                } else {
                    consumer_concurrency
                },
                n,
            });
        }
    }
    let parts: Vec<&str> = inflight.split(':').collect();
    if let [l, c, m] = parts[..] {
        runs.push(Run {
            design: "claimd-pg-memory".into(),
            latency_ms: l.parse().unwrap(),
            consumer_concurrency: c.parse().unwrap(),
            n: m.parse().unwrap(),
        });
    }

    let mut csv = String::from(
        "design,latency_ms,n,client_concurrency,pool,consumer_concurrency,msgs_per_s,ack_p50_ms,ack_p99_ms,settled_p50_ms,settled_p99_ms,peak_rss_mib,peak_in_flight,pg_xacts_per_msg,retries_503,non_2xx,load1_before,load1_after\n",
    );
    let mut table = vec![
        format!(
            "client connections: {concurrency}; database pool: {pool} (txn, claimd-pg, claimd-sqlite); 10% of posts are duplicates"
        ),
        String::new(),
        "| design | provider latency ms | posts | consumer concurrency | msgs/s | ack p50/p99 ms | settled p50/p99 ms | peak RSS MiB | peak in flight | PG xacts/msg | 503 retries | non-2xx | load1 before→after |".into(),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|".into(),
    ];
    for (i, run) in runs.iter().enumerate() {
        eprintln!("running {run:?} (load {:.2})", load1());
        let r = run_one(&pg, run, concurrency, pool, i).await;
        let cc = if run.design.starts_with("claimd") {
            run.consumer_concurrency.to_string()
        } else {
            "-".into()
        };
        let x = r
            .xacts_per_msg
            .map(|x| format!("{x:.2}"))
            .unwrap_or("-".into());
        let line = format!(
            "| {} | {} | {} | {cc} | {:.0} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} | {} | {x} | {} | {} | {:.2}→{:.2} |",
            run.design,
            run.latency_ms,
            run.n,
            r.msgs_per_s,
            r.ack_p50,
            r.ack_p99,
            r.settled_p50,
            r.settled_p99,
            r.rss_mib,
            r.peak_in_flight,
            r.retries,
            r.non_2xx,
            r.load_before,
            r.load_after
        );
        eprintln!("{line}");
        table.push(line);
        csv.push_str(&format!(
            "{},{},{},{concurrency},{pool},{},{:.1},{:.2},{:.2},{:.2},{:.2},{:.1},{},{},{},{},{:.2},{:.2}\n",
            run.design,
            run.latency_ms,
            run.n,
            run.consumer_concurrency,
            r.msgs_per_s,
            r.ack_p50,
            r.ack_p99,
            r.settled_p50,
            r.settled_p99,
            r.rss_mib,
            r.peak_in_flight,
            r.xacts_per_msg.map(|x| format!("{x:.3}")).unwrap_or_default(),
            r.retries,
            r.non_2xx,
            r.load_before,
            r.load_after
        ));
    }
    if let Some(dir) = Path::new(&csv_path).parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&csv_path, &csv).unwrap();
    println!("{}", table.join("\n"));
    println!("\n(csv: {csv_path})");

    if db_n > 0 {
        let rows = db_only(&pg, db_n, pool, batch, db_callers).await;
        let raw = rows[0].1;
        println!(
            "\nDatabase only (PostgreSQL, no effect): {db_n} claims, each claimed and settled `completed`, pool of {pool}\n"
        );
        println!("| variant | claims/s | × raw ceiling | PG xacts/claim | load1 |");
        println!("|---|---|---|---|---|");
        for (v, rate, per, load) in rows {
            let label = match v.as_str() {
                "raw" => format!("ceiling: single-row INSERT + UPDATE with sqlx, {pool} tasks"),
                "claimd" => format!("claimd `claim` + `settle`, unbatched, {pool} tasks"),
                "claimd-coalesced" => format!(
                    "claimd `claim` + `settle`, batched writes (default), {db_callers} tasks"
                ),
                _ => {
                    format!("claimd `claim_many` + `settle_many`, batches of {batch}, {pool} tasks")
                }
            };
            println!(
                "| {label} | {rate:.0} | {:.2} | {per:.2} | {load:.2} |",
                rate / raw
            );
        }
    }
}
