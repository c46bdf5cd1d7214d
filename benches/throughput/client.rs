//! The load: a client posting the ledger (unique messages, 10% duplicates) over keep-alive
//! connections, the wait until every claim is settled, and the figures taken from both.

use super::*;

pub(crate) fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

pub(crate) fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Post `p`: its message number (dups repeat the message posted 99 posts before) and body.
pub(crate) fn message_of(p: usize) -> usize {
    if p % 10 == 9 && p >= 100 { p - 99 } else { p }
}

pub(crate) fn body_of(m: usize) -> String {
    format!(
        "{{\"amount\":{},\"currency\":\"EUR\",\"order\":\"o-{m}\"}}",
        m % 9973 + 1
    )
}

pub(crate) fn unique_messages(n: usize) -> usize {
    (0..n).filter(|&p| message_of(p) == p).count()
}

// ---------------------------------------------------------------------------------------------
// Child side: one server per process.
// ---------------------------------------------------------------------------------------------

pub(crate) struct ClientResult {
    pub(crate) ack_ms: Vec<f64>,
    pub(crate) retries: u64,
    pub(crate) non_2xx: u64,
}

/// Posts the `n` posts of the ledger over `concurrency` connections, connection `i` to
/// `bases[i % bases.len()]` (several instances share the load evenly).
pub(crate) async fn drive_client(bases: &[String], n: usize, concurrency: usize) -> ClientResult {
    let client = claimd::provider::tls::http_client_builder()
        .pool_max_idle_per_host(concurrency)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let non_2xx = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let (client, next, retries, non_2xx) = (
            client.clone(),
            next.clone(),
            retries.clone(),
            non_2xx.clone(),
        );
        let url = format!("{}/v1/messages/payments", bases[i % bases.len()]);
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
/// PostgreSQL transactions in `polls`. On PostgreSQL only claims received since `since` (the
/// run's start, seconds since the epoch) are read: a table-size run's table holds millions of
/// claims from before it (an index range scan on `claims_received`).
pub(crate) async fn wait_settled(store: &str, polls: &mut i64, since: f64) -> (Vec<f64>, f64) {
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
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM claims \
                 WHERE state = 'started' AND received_utc >= to_timestamp($1)",
            )
            .bind(since)
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
             FROM claims WHERE state = 'completed' AND received_utc >= to_timestamp($1)",
        )
        .bind(since)
        .fetch_all(&mut c)
        .await
        .unwrap();
        let last = rows.iter().map(|r| r.1).fold(0.0, f64::max);
        let mut lat: Vec<f64> = rows.iter().map(|r| r.0).collect();
        lat.sort_by(f64::total_cmp);
        (lat, last)
    }
}
