//! The Rust job-queue peers as designs: `underway` (0.2, its own sqlx 0.8) and `apalis` (1.0,
//! `apalis-postgres`), each on the run's own PostgreSQL database. Their servers live in the
//! crate `peers/` (binary `peer-server`), built on demand here, so that claimd's own build
//! and tests never compile them; see that crate for what a post and a job do.

use super::*;
use std::path::PathBuf;

/// The peer designs (and their `--mode`s).
pub(crate) const PEERS: [&str; 2] = ["underway", "apalis"];

/// The program that serves `mode`: this bench re-executed, or for a peer the `peer-server`
/// binary beside it (built now with `cargo build --release -p claimd-peers`, once per run of
/// the bench).
pub(crate) fn server_exe(mode: &str) -> PathBuf {
    let me = std::env::current_exe().unwrap();
    if !PEERS.contains(&mode) {
        return me;
    }
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "--release", "-p", "claimd-peers"])
            .status()
            .expect("run cargo build -p claimd-peers");
        assert!(status.success(), "cargo build -p claimd-peers failed");
    });
    // target/release/deps/throughput-… → target/release/peer-server
    me.parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("peer-server")
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
        // apalis keeps `run_at` to the second: the post's own time is in the job (ms).
        "apalis" => (
            "SELECT count(*) FROM apalis.jobs WHERE status NOT IN ('Done', 'Killed') \
               AND (status <> 'Failed' OR attempts < max_attempts)",
            "SELECT (EXTRACT(EPOCH FROM done_at) * 1000 \
                     - (convert_from(job, 'UTF8')::jsonb ->> 'enqueued_ms')::float8)::float8, \
                    EXTRACT(EPOCH FROM done_at)::float8 \
             FROM apalis.jobs WHERE status = 'Done'",
        ),
        other => panic!("no job table for {other}"),
    };
    let mut c = sqlx::PgConnection::connect(store).await.unwrap();
    loop {
        *polls += 1;
        // The queue's tables appear when its server has migrated.
        let n: i64 = sqlx::query_scalar(open)
            .fetch_one(&mut c)
            .await
            .unwrap_or(1);
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
