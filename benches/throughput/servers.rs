//! The servers under test, each run in a child process of its own (`--mode`): the direct
//! handler, the single-transaction inbox and claimd itself (the job-queue peers run from the
//! crate `peers/`, see `peers`).

use super::*;

#[derive(Clone)]
pub(crate) struct Handler {
    pub(crate) http: reqwest::Client,
    pub(crate) provider: String,
    pub(crate) pool: Option<sqlx::PgPool>,
    pub(crate) in_flight: Arc<AtomicUsize>,
    pub(crate) peak: Arc<AtomicUsize>,
}

pub(crate) struct Flight(Arc<AtomicUsize>);

impl Drop for Flight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Handler {
    pub(crate) fn enter(&self) -> Flight {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        Flight(self.in_flight.clone())
    }

    pub(crate) async fn call(&self, key: &str, body: Bytes) -> Result<(u16, String), String> {
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

pub(crate) fn key_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Design 1: call the provider in the handler, no claim.
pub(crate) async fn direct(
    State(h): State<Handler>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
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
pub(crate) const SINGLE_ROW_INSERT: &str = "\
    INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
      content_type, lease_owner, lease_until) \
    VALUES ('payments', '', $1, $1, $2, $3, 'application/json', 'bench', \
      now() + interval '60 seconds') \
    ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING id";

pub(crate) const TXN_SETTLE: &str = "\
    UPDATE claims SET state = 'completed', processed_utc = now(), provider_status = $2, \
      provider_response = $3, lease_owner = NULL, lease_until = NULL, updated_utc = now() \
    WHERE id = $1 AND attempt = 1 AND state = 'started'";

/// Design 2: one transaction around the call.
pub(crate) async fn txn(State(h): State<Handler>, headers: HeaderMap, body: Bytes) -> StatusCode {
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

pub(crate) fn claimd_toml(
    store: &str,
    provider: &str,
    pool: u32,
    concurrency: u32,
    on_unknown: &str,
    latency_ms: u64,
    http_version: &str,
) -> String {
    // The call must outlive the provider's latency (the memory runs use seconds).
    let timeout_s = (latency_ms * 3 / 1000).max(10);
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
timeout = "{timeout_s}s"
http_version = "{http_version}"
status_url = "{provider}/v1/effects/{{key}}"
"#
    )
}

/// The exchange and queue outcome events go to when `BENCH_OUTCOMES_AMQP` is set.
const OUTCOMES: &str = "claimd-bench.outcomes";

/// `[consumers.outcomes]` to RabbitMQ at `url` (`1`: the local broker), after declaring the
/// exchange and an emptied queue bound to all its events (an event no queue takes is not
/// confirmed, and would be tried again for ever).
async fn outcomes_amqp(url: &str) -> String {
    use lapin::options::{
        ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueuePurgeOptions,
    };
    use lapin::types::FieldTable;
    let url = if url == "1" {
        "amqp://guest:guest@127.0.0.1:5672/%2f"
    } else {
        url
    };
    let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .expect("BENCH_OUTCOMES_AMQP: connect to RabbitMQ");
    let ch = conn.create_channel().await.expect("channel");
    ch.exchange_declare(
        OUTCOMES.into(),
        lapin::ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("declare the outcome exchange");
    ch.queue_declare(
        OUTCOMES.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("declare the outcome queue");
    ch.queue_bind(
        OUTCOMES.into(),
        OUTCOMES.into(),
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("bind the outcome queue");
    ch.queue_purge(OUTCOMES.into(), QueuePurgeOptions::default())
        .await
        .expect("purge the outcome queue");
    let _ = conn.close(200, "ok".into()).await;
    format!("[consumers.outcomes]\nkind = \"amqp\"\nurl = \"{url}\"\nexchange = \"{OUTCOMES}\"\n")
}

pub(crate) async fn child(mode: &str) {
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
                http: claimd::provider::tls::http_client_builder()
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
            // As the `claimd` binary does first thing, or the peak RSS would not be its.
            claimd::service::run::return_large_buffers_to_the_system();
            let store = std::env::var("BENCH_STORE").expect("BENCH_STORE");
            let conc: u32 = env_or("BENCH_CONSUMER_CONCURRENCY", 64);
            let on_unknown: String = env_or("BENCH_ON_UNKNOWN", "reconcile".to_string());
            let latency_ms: u64 = env_or("BENCH_LATENCY_MS", 0);
            let http_version: String = env_or("BENCH_HTTP_VERSION", "1.1".to_string());
            let mut toml = claimd_toml(
                &store,
                &provider,
                pool_size,
                conc,
                &on_unknown,
                latency_ms,
                &http_version,
            );
            if let Ok(amqp) = std::env::var("BENCH_OUTCOMES_AMQP") {
                toml.push_str(&outcomes_amqp(&amqp).await);
            }
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
            let running = claimd::service::run::start(app).await.expect("start");
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
