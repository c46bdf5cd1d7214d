//! The Rust job-queue peers as designs: `underway` (0.2, its own sqlx 0.8) and `apalis` (1.0,
//! `apalis-postgres`), each on the run's own PostgreSQL database. A post stores one durable
//! job holding the message's key and body and is answered `202` once the job is committed —
//! the promise claimd's `202` makes; the queue's worker, at the same consumer concurrency,
//! makes the same provider call with the same `Idempotency-Key` and retries it on a 5xx or a
//! connection error. A repeated post is a second job (neither queue removes duplicates by
//! itself): the provider's idempotency absorbs it. "Settled" is the job's completion time.

use super::*;
use serde::{Deserialize, Serialize};

/// The peer designs (and their `--mode`s).
pub(crate) const PEERS: [&str; 1] = ["underway"];

/// One message, as a job's input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Payment {
    key: String,
    body: String,
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
        .unwrap()
}

/// The intake both peers share: `POST /v1/messages/{consumer}` → `enqueue(key, body)` →
/// `202`, or `503` when the job could not be stored.
fn intake<F, Fut>(enqueue: F) -> Router
where
    F: Fn(Payment) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let handler = move |headers: HeaderMap, body: Bytes| {
        let enqueue = enqueue.clone();
        async move {
            let Some(key) = key_of(&headers) else {
                return StatusCode::BAD_REQUEST;
            };
            let body = String::from_utf8_lossy(&body).into_owned();
            match enqueue(Payment { key, body }).await {
                Ok(()) => StatusCode::ACCEPTED,
                Err(_) => StatusCode::SERVICE_UNAVAILABLE,
            }
        }
    };
    Router::new().route("/v1/messages/{consumer}", post(handler))
}

/// `underway`: one single-step job per post; its worker runs `concurrency` steps at once.
pub(crate) async fn underway_server(
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

/// Waits until the peer's queue holds no unfinished job; then (completion latencies in ms
/// sorted, last completion in seconds since the epoch).
pub(crate) async fn wait_jobs(design: &str, store: &str, polls: &mut i64) -> (Vec<f64>, f64) {
    let (open, done) = match design {
        "underway" => (
            "SELECT count(*) FROM underway.task WHERE state IN ('pending', 'in_progress')",
            "SELECT (EXTRACT(EPOCH FROM completed_at - created_at) * 1000)::float8, \
                    EXTRACT(EPOCH FROM completed_at)::float8 \
             FROM underway.task WHERE state = 'succeeded'",
        ),
        other => panic!("no job table for {other}"),
    };
    let mut c = sqlx::PgConnection::connect(store).await.unwrap();
    loop {
        *polls += 1;
        let n: i64 = sqlx::query_scalar(open).fetch_one(&mut c).await.unwrap();
        if n == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    *polls += 1;
    let rows: Vec<(f64, f64)> = sqlx::query_as(done).fetch_all(&mut c).await.unwrap();
    let last = rows.iter().map(|r| r.1).fold(0.0, f64::max);
    let mut lat: Vec<f64> = rows.iter().map(|r| r.0).collect();
    lat.sort_by(f64::total_cmp);
    (lat, last)
}
