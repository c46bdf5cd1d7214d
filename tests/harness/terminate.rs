//! `pg_terminate_backend` of random backends during the run: what every connection
//! sees on a PostgreSQL fast restart or failover (`57P01`), one or a few connections at a
//! time, every 0.5–2 s, busy backends first every other time. Any backend of the run's
//! database but its own: the workers' (their pools, their `LISTEN` connections) and the
//! harness's, whose reads retry.

use super::*;

/// Terminates one to three random backends of the test database every 0.5–2 s until
/// `done`; returns how many backends it terminated, and how many of those were running a
/// database effect's statement. Notes each round in the timeline.
pub(super) fn start(
    db_url: String,
    seed: u64,
    done: Arc<std::sync::atomic::AtomicBool>,
    timeline: Arc<Mutex<Vec<Moment>>>,
) -> tokio::task::JoinHandle<(usize, usize)> {
    tokio::spawn(async move {
        use sqlx::Connection;
        let mut r = rng(seed ^ 0x7e44);
        let mut counts = (0, 0);
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
            // What each terminated backend was doing: the statement of a database effect's
            // transaction is counted apart, to show the faults reach it.
            // Every other round the busy backends (in a statement or a transaction) come first:
            // most of a pool is idle, and an idle connection's end tests only the reconnect.
            let killed: Result<Vec<(bool, String)>, _> = sqlx::query_as(
                "SELECT pg_terminate_backend(pid), coalesce(query, '') \
                 FROM pg_stat_activity WHERE datname = current_database() \
                 AND pid <> pg_backend_pid() \
                 ORDER BY $2 AND state = 'idle', random() LIMIT $1",
            )
            .bind(n)
            .bind(r.bool())
            .fetch_all(&mut *c)
            .await;
            match killed {
                Ok(rows) => {
                    let k = rows.iter().filter(|(t, _)| *t).count();
                    let in_effect = rows
                        .iter()
                        .filter(|(t, q)| *t && q.contains(super::dbeffect::TABLE))
                        .count();
                    counts.0 += k;
                    counts.1 += in_effect;
                    timeline.lock().unwrap().push((
                        chrono::Utc::now(),
                        format!("terminated {k} backends ({in_effect} in a database effect)"),
                    ));
                }
                // A real restart ended this connection too: a new one next time.
                Err(_) => conn = None,
            }
        }
        counts
    })
}
