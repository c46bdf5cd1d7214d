//! `peer-server --mode underway|apalis`: one of the Rust job-queue peers claimd is measured
//! against in `benches/throughput`, as a server the bench drives like its own designs.
//!
//! A post (`POST /v1/messages/{consumer}` with an `Idempotency-Key` header) stores one durable
//! job holding the key and the body and is answered `202` once the job is committed — the
//! promise claimd's `202` makes. The queue's worker, at the same consumer concurrency, makes
//! the same provider call with the same `Idempotency-Key` and retries it on a 5xx or a
//! connection error. A repeated post is a second job (neither queue removes duplicates by
//! itself): the provider's idempotency absorbs it.
//!
//! The protocol with the bench is the one of the bench's own re-executed servers: the
//! environment gives `BENCH_STORE` (PostgreSQL URL of the run's own database), `BENCH_PROVIDER`,
//! `BENCH_POOL` and `BENCH_CONSUMER_CONCURRENCY`; the server prints `READY <addr>` when it
//! listens, runs until its stdin closes, then prints `PEAK 0` (in-flight is not sampled) and
//! exits.
//!
//! Built apart from claimd (its own crate) so that claimd's tests and lints never compile the
//! peers and the second sqlx `underway` needs.

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One message, as a job's input.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    key: String,
    body: String,
    /// When the post was accepted, in ms since the epoch: the bench reads it back to measure
    /// settle latency where the queue keeps only second-resolution times (apalis' `run_at`).
    enqueued_ms: u64,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Calls the provider like claimd's HTTP effect; `Err` when the call should be retried.
async fn pay(http: &reqwest::Client, url: &str, p: &Payment) -> Result<(), String> {
    let r = http
        .post(url)
        .header("Idempotency-Key", &p.key)
        .header("Content-Type", "application/json")
        .body(p.body.clone())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let _ = r.bytes().await;
    if status.is_server_error() {
        return Err(format!("provider answered {status}"));
    }
    Ok(())
}

fn provider_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("reqwest client")
}

/// The intake both peers share: `POST /v1/messages/{consumer}` → `enqueue(payment)` → `202`,
/// or `503` when the job could not be stored.
fn intake<F, Fut>(enqueue: F) -> Router
where
    F: Fn(Payment) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let handler = move |headers: HeaderMap, body: Bytes| {
        let enqueue = enqueue.clone();
        async move {
            let Some(key) = headers
                .get("Idempotency-Key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
            else {
                return StatusCode::BAD_REQUEST;
            };
            let body = String::from_utf8_lossy(&body).into_owned();
            let p = Payment {
                key,
                body,
                enqueued_ms: now_ms(),
            };
            match enqueue(p).await {
                Ok(()) => StatusCode::ACCEPTED,
                Err(_) => StatusCode::SERVICE_UNAVAILABLE,
            }
        }
    };
    Router::new().route("/v1/messages/{consumer}", post(handler))
}

/// `underway` 0.2: one single-step job per post; its worker runs `concurrency` steps at once.
async fn underway_server(
    store: &str,
    provider: &str,
    pool_size: u32,
    concurrency: usize,
) -> Router {
    let pool = sqlx08::postgres::PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(Duration::from_secs(120))
        .connect(store)
        .await
        .expect("underway pool");
    underway::run_migrations(&pool)
        .await
        .expect("underway migrations");
    let (http, url) = (provider_client(), format!("{provider}/v1/payments"));
    let job = underway::Job::builder()
        .step(move |_cx, p: Payment| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                pay(&http, &url, &p)
                    .await
                    .map_err(underway::task::Error::Retryable)?;
                underway::To::done()
            }
        })
        .name("payments")
        .pool(pool)
        .build()
        .await
        .expect("underway job");
    let mut worker = job.worker();
    worker.set_concurrency_limit(concurrency);
    tokio::spawn(async move { worker.run().await });
    intake(move |p: Payment| {
        let job = job.clone();
        async move { job.enqueue(&p).await.map(|_| ()).map_err(|e| e.to_string()) }
    })
}

/// Where the apalis handler sends its calls.
#[derive(Clone)]
struct Provider {
    http: reqwest::Client,
    url: String,
}

/// apalis' handler: the provider call; an error leaves the task to apalis' retries.
async fn apalis_pay(
    p: Payment,
    provider: apalis::prelude::Data<Provider>,
) -> Result<(), apalis::prelude::BoxDynError> {
    pay(&provider.http, &provider.url, &p)
        .await
        .map_err(apalis::prelude::BoxDynError::from)
}

/// `apalis` 1.0 with `apalis-postgres`: one task per post, fetched in batches of
/// `concurrency` (and woken by NOTIFY), handled `concurrency` at once; a failed call is
/// retried by apalis' own attempts.
async fn apalis_server(store: &str, provider: &str, pool_size: u32, concurrency: usize) -> Router {
    use apalis::prelude::*;
    use apalis_postgres::{Config, PostgresStorage};
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(Duration::from_secs(120))
        .connect(store)
        .await
        .expect("apalis pool");
    PostgresStorage::<()>::setup(&pool)
        .await
        .expect("apalis migrations");
    let config = Config::default().queue("payments").batch_size(concurrency);
    let storage = PostgresStorage::<Payment>::new(&pool).with_config(config);
    let sink = storage.clone();
    let worker = WorkerBuilder::new("payments")
        .backend(storage.with_pubsub())
        .data(Provider {
            http: provider_client(),
            url: format!("{provider}/v1/payments"),
        })
        .concurrency(concurrency)
        .build(apalis_pay);
    tokio::spawn(async move { worker.run().await });
    intake(move |p: Payment| {
        let mut sink = sink.clone();
        async move { sink.push(p).await.map_err(|e| e.to_string()) }
    })
}

#[tokio::main]
async fn main() {
    let mode = std::env::args()
        .skip_while(|a| a != "--mode")
        .nth(1)
        .expect("usage: peer-server --mode underway|apalis");
    let store = std::env::var("BENCH_STORE").expect("BENCH_STORE");
    let provider = std::env::var("BENCH_PROVIDER").expect("BENCH_PROVIDER");
    let pool_size: u32 = env_or("BENCH_POOL", 16);
    let concurrency: usize = env_or("BENCH_CONSUMER_CONCURRENCY", 64);
    let router = match mode.as_str() {
        "underway" => underway_server(&store, &provider, pool_size, concurrency).await,
        "apalis" => apalis_server(&store, &provider, pool_size, concurrency).await,
        other => panic!("unknown peer {other}"),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, router).await });
    println!("READY {addr}");
    std::io::stdout().flush().expect("stdout");
    // Runs until the bench closes stdin.
    tokio::task::spawn_blocking(|| {
        use std::io::BufRead as _;
        for _ in std::io::stdin().lock().lines().map_while(Result::ok) {}
    })
    .await
    .expect("stdin reader");
    println!("PEAK 0");
    std::io::stdout().flush().expect("stdout");
    std::process::exit(0);
}
