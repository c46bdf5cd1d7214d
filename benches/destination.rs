//! What the breaker and the pace (`src/engine/destination.rs`) cost each provider call, alone: the
//! `admit` a call waits on before it goes and the `record` of its answer, in a loop on one task
//! and on many tasks at once (one lock per destination), without and with `rate_limit`.
//! Prints nanoseconds per call; set against a message's CPU in docs/performance.md.
//!
//! ```sh
//! cargo bench --features full --bench destination               # 1,000,000 calls per row
//! BENCH_CALLS=5000000 cargo bench --features full --bench destination
//! ```

use claimd::engine::destination::{Destination, Verdict};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// `admit` + `record` for `calls` calls over `tasks` tasks; nanoseconds per call.
async fn per_call(d: Arc<Destination>, calls: u64, tasks: u64) -> f64 {
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let d = d.clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..calls / tasks {
                let latest = Instant::now() + Duration::from_secs(10);
                let pass = d
                    .admit(latest)
                    .await
                    .expect("a closed destination lets it go");
                d.record(pass, Verdict::Answered);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    started.elapsed().as_nanos() as f64 / calls as f64
}

fn main() {
    let calls: u64 = std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("| destination | tasks | calls | ns per call (admit + record) |");
    println!("|---|---|---|---|");
    // A ceiling far above what the loop reaches: the pace's bookkeeping runs, never a wait.
    for (name, ceiling) in [
        ("adaptive (no rate_limit)", None),
        ("rate_limit = 1e9/s", Some(1e9)),
    ] {
        for tasks in [1u64, 64] {
            let d = Arc::new(Destination::new(ceiling));
            let ns = rt.block_on(per_call(d, calls, tasks));
            println!("| {name} | {tasks} | {calls} | {ns:.0} |");
        }
    }
}
