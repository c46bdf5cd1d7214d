//! `pg_terminate_backend` of random workers' backends during the run: what every connection
//! sees on a PostgreSQL fast restart or failover (`57P01`), one or a few connections at a
//! time, every 0.5–2 s. Only the workers' backends (`application_name` [`WORKER_APP`]) are
//! terminated: the harness's own connections are not under test.

use super::*;

/// The `application_name` of the workers' connections.
pub(super) const WORKER_APP: &str = "claimd_chaos_worker";

/// Terminates one to three random worker backends of the test database every 0.5–2 s until
/// `done`; returns how many backends it terminated. Notes each round in the timeline.
pub(super) fn start(
    db_url: String,
    seed: u64,
    done: Arc<std::sync::atomic::AtomicBool>,
    timeline: Arc<Mutex<Vec<Moment>>>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        use sqlx::Connection;
        let mut r = rng(seed ^ 0x7e44);
        let mut terminated = 0;
        let mut conn: Option<sqlx::PgConnection> = None;
        while !done.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(r.u64(500..2000))).await;
            if conn.is_none() {
                // Straight to the server, not through the workers' proxy: an outage there
                // does not stop this.
                conn = sqlx::PgConnection::connect(&db_url).await.ok();
            }
            let Some(c) = conn.as_mut() else { continue };
            let n = r.i64(1..=3);
            let killed: Result<i64, _> = sqlx::query_scalar(
                "SELECT count(*) FILTER (WHERE t) FROM (SELECT pg_terminate_backend(pid) AS t \
                 FROM pg_stat_activity WHERE datname = current_database() \
                 AND pid <> pg_backend_pid() AND application_name = $1 \
                 ORDER BY random() LIMIT $2) k",
            )
            .bind(WORKER_APP)
            .bind(n)
            .fetch_one(&mut *c)
            .await;
            match killed {
                Ok(k) => {
                    terminated += k as usize;
                    timeline
                        .lock()
                        .unwrap()
                        .push((chrono::Utc::now(), format!("terminated {k} backends")));
                }
                // A real restart ended this connection too: a new one next time.
                Err(_) => conn = None,
            }
        }
        terminated
    })
}
