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
//! - `claimd-sqlite`, `claimd-pg`: the real worker (`claimd::service::run::start`); the client gets 202
//!   and the effect runs after; "settled" is `processed_utc - received_utc` from the store and
//!   throughput counts until the last claim is settled.
//!
//! Then a database-only section: claim + settle from `BENCH_POOL` tasks through `PgStore`,
//! against the same single-row INSERT + UPDATE sent with sqlx directly (the machine's ceiling),
//! and the batched calls (`claim_many` + `settle_many`).
//!
//! `cargo bench --features full --bench throughput`. Environment (defaults in brackets):
//! `BENCH_N` posts per run [100000], 10% of them duplicates of an earlier message;
//! `BENCH_LATENCIES` provider latency in ms, comma-separated [0,10,50];
//! `BENCH_CONCURRENCY` client connections [64]; `BENCH_POOL` database pool size [16];
//! `BENCH_CONSUMER_CONCURRENCY` claimd's consumer `concurrency` [= BENCH_CONCURRENCY];
//! `BENCH_DESIGNS` [direct,txn,claimd-sqlite,claimd-sqlite-sealed,claimd-pg,claimd-pg-sealed,
//! claimd-pg-park,claimd-pg-unbatched,claimd-pg-wide,underway,apalis]: `claimd-sqlite-sealed`
//! and `claimd-pg-sealed` have `[encryption]` on (payloads, answers and errors sealed, keyed
//! fingerprints; docs/operations.md, "Encryption at rest"), `claimd-pg-park` is `on_unknown = "park"`, which takes the call slot
//! before claiming (the intake order before claims-ahead), `claimd-pg-unbatched` (and
//! `claimd-sqlite-unbatched`, not run by default) has `[store] batch_writes = false`,
//! `claimd-pg-pooler` (not run by default) goes through a PgBouncer in transaction mode
//! already running at `BENCH_PGBOUNCER` [postgres://postgres@127.0.0.1:6432] with
//! `[store] pooler = "transaction"`, `claimd-pg-wide` consumer concurrency
//! `BENCH_WIDE_CONCURRENCY` [256]: more effects in flight than client connections; `BENCH_DB_CALLERS` concurrent callers of the batched store
//! [256]; `BENCH_DB_N` claims in the
//! database-only section [50000, 0 skips it]; `BENCH_BATCH` batch size there [64];
//! `underway`, `apalis`: the job-queue peers (see `peers`; their servers are the crate
//! `peers/`, built on demand), `BENCH_PEER_N` posts per peer run [20000];
//! `BENCH_INFLIGHT` extra claimd-pg runs (`claimd-pg-memory`) for memory with many effects in
//! flight, comma-separated `latency_ms:concurrency:n[:client_connections[:h2]]`
//! [2000:1000:10000, empty skips them]; a design (or memory run) ending in `-h2` (`:h2`) has
//! `effect.http_version = "2"`: every provider call on one HTTP/2 connection; `BENCH_PG` admin URL
//! [postgres://postgres@127.0.0.1:5432/postgres]; `BENCH_CSV` [target/bench/throughput.csv];
//! `BENCH_OUTCOMES_AMQP` (a RabbitMQ URL, or `1` for guest@127.0.0.1:5672): the claimd designs
//! run with outcome events on, published to the exchange and queue `claimd-bench.outcomes`.
//!
//! Scale of work (`scale`), not run by default: `BENCH_PREFILL` table sizes, comma-separated
//! (e.g. `0,1000000,10000000`): claimd-pg at each of `BENCH_LATENCIES` on one database filled
//! with that many settled claims first (grown between sizes, kept afterwards with
//! `BENCH_KEEP=1`); `BENCH_INSTANCES` instance counts (e.g. `1,2,3`): that many claimd-pg
//! processes on one database, the `BENCH_CONCURRENCY` client connections spread over them.

mod client;
mod cpu;
mod db_only;
mod peers;
mod run;
mod scale;
mod servers;
#[path = "../support/mod.rs"]
mod support;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use claimd::config::Config;
use claimd::domain::claim::{ClaimState, NewClaim, fingerprint};
use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use claimd::service::app::App;
use claimd::store::postgres::PgStore;
use claimd::store::{
    ClaimOutcome, ClaimStore, EngineStore, IntakeStore, NewEvent, SettleItem, Settlement,
};
use sqlx::Connection;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};
use support::{env_or, load1};
use tokio::io::{AsyncBufReadExt, BufReader};

use client::*;
use cpu::{CpuPerMsg, statements, statements_reset};
use db_only::*;
use peers::*;
use run::*;
use scale::*;
use servers::*;

/// claimd's throughput as a multiple of each peer's, per provider latency (from this run).
fn print_peer_ratios(rates: &[(String, u64, f64)]) {
    let rate = |d: &str, l: u64| {
        rates
            .iter()
            .find(|(x, y, _)| x == d && *y == l)
            .map(|r| r.2)
    };
    let mut lines = Vec::new();
    for (peer, latency, peer_rate) in rates.iter().filter(|r| PEERS.contains(&r.0.as_str())) {
        for claimd in ["claimd-pg", "claimd-sqlite", "claimd-pg-wide"] {
            if let Some(c) = rate(claimd, *latency) {
                lines.push(format!(
                    "| {claimd} / {peer} | {latency} | {c:.0} | {peer_rate:.0} | {:.1}× |",
                    c / peer_rate
                ));
            }
        }
    }
    if !lines.is_empty() {
        println!("\n| claimd / peer | provider latency ms | claimd msgs/s | peer msgs/s | ratio |");
        println!("|---|---|---|---|---|");
        println!("{}", lines.join("\n"));
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--mode") {
        child(&args[i + 1]).await;
        return;
    }
    let n: usize = env_or("BENCH_N", 100_000);
    let peer_n: usize = env_or("BENCH_PEER_N", 20_000);
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
        "direct,txn,claimd-sqlite,claimd-sqlite-sealed,claimd-pg,claimd-pg-sealed,claimd-pg-park,\
         claimd-pg-unbatched,claimd-pg-wide,underway,apalis"
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
    let list = |name: &str| -> Vec<i64> {
        env_or(name, String::new())
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect()
    };
    let mut prefill = list("BENCH_PREFILL");
    prefill.sort_unstable();
    let instances = list("BENCH_INSTANCES");
    let keep = std::env::var("BENCH_KEEP").is_ok_and(|v| v == "1");
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
            let cc = if d == "claimd-pg-wide" {
                wide
            } else {
                consumer_concurrency
            };
            let posts = if PEERS.contains(&d.as_str()) {
                peer_n
            } else {
                n
            };
            runs.push(Run::new(d, latency_ms, cc, posts, concurrency));
        }
    }
    for spec in inflight.split(',').filter(|s| !s.trim().is_empty()) {
        let parts: Vec<&str> = spec.trim().split(':').collect();
        let (l, c, m, clients, design) = match parts[..] {
            [l, c, m] => (l, c, m, concurrency, "claimd-pg-memory"),
            [l, c, m, k] => (l, c, m, k.parse().unwrap(), "claimd-pg-memory"),
            [l, c, m, k, "h2"] => (l, c, m, k.parse().unwrap(), "claimd-pg-memory-h2"),
            _ => panic!(
                "BENCH_INFLIGHT: latency_ms:concurrency:n[:client_connections[:h2]], not {spec}"
            ),
        };
        let (l, c, m) = (l.parse().unwrap(), c.parse().unwrap(), m.parse().unwrap());
        runs.push(Run::new(design, l, c, m, clients));
    }
    // Table-size runs, then instance runs: claimd-pg at each latency.
    let scale_runs = prefill
        .iter()
        .map(|&size| (Some(size), 1))
        .chain(instances.iter().map(|&k| (None, k as usize)));
    for (size, k) in scale_runs {
        for &latency_ms in &latencies {
            let mut run = Run::new(
                "claimd-pg",
                latency_ms,
                consumer_concurrency,
                n,
                concurrency,
            );
            run.prefill = size;
            run.instances = k;
            runs.push(run);
        }
    }

    let mut csv = String::from(
        "design,latency_ms,n,client_concurrency,pool,consumer_concurrency,msgs_per_s,ack_p50_ms,ack_p99_ms,settled_p50_ms,settled_p99_ms,peak_rss_mib,peak_in_flight,pg_xacts_per_msg,retries_503,non_2xx,load1_before,load1_after,prefill_claims,fill_s,instances,rss_each_mib,peak_each,server_cpu_ms_per_msg,bench_cpu_ms_per_msg,pg_cpu_ms_per_msg\n",
    );
    let mut rates: Vec<(String, u64, f64)> = Vec::new();
    let mut cpu_table = vec![
        "| design | provider latency ms | msgs/s | server CPU ms/msg | client + provider CPU ms/msg | PostgreSQL CPU ms/msg | total ms/msg | msgs/s two cores could carry | other work on the machine ms/msg |".to_string(),
        "|---|---|---|---|---|---|---|---|---|".into(),
    ];
    let mut statement_tables = Vec::new();
    let mut table = vec![
        format!(
            "client connections: {concurrency}; database pool: {pool} (txn, claimd-pg, claimd-sqlite); 10% of posts are duplicates"
        ),
        String::new(),
        "| design | provider latency ms | posts | consumer concurrency | msgs/s | ack p50/p99 ms | settled p50/p99 ms | peak RSS MiB | peak in flight | PG xacts/msg | 503 retries | non-2xx | load1 before→after |".into(),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|".into(),
    ];
    let mut sized: Option<Prefill> = None;
    let largest = prefill.last().copied().unwrap_or(0);
    let mut done = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let mut fill_s = 0.0;
        if let Some(size) = run.prefill {
            if sized.is_none() {
                sized = Some(Prefill::open(&pg, largest).await);
            }
            let load = load1();
            fill_s = sized.as_mut().unwrap().grow(size).await;
            if fill_s > 0.0 {
                eprintln!(
                    "filled the table to {} claims in {fill_s:.0} s (load1 {load:.2}→{:.2})",
                    thousands(size),
                    load1()
                );
            }
        }
        eprintln!("running {run:?} (load {:.2})", load1());
        let kept = run.prefill.map(|_| PREFILL_DB);
        let r = run_one(&pg, run, pool, i, kept).await;
        rates.push((run.design.clone(), run.latency_ms, r.msgs_per_s));
        let cc = if run.design.starts_with("claimd") || PEERS.contains(&run.design.as_str()) {
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
            run.label(),
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
        let c = r.cpu;
        cpu_table.push(format!(
            "| {} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {:.3} |",
            run.design,
            run.latency_ms,
            r.msgs_per_s,
            c.server_ms,
            c.bench_ms,
            c.postgres_ms,
            c.total_ms(),
            2000.0 / c.total_ms(),
            c.other_ms
        ));
        if !r.statements.is_empty() {
            statement_tables.push(format!(
                "\n{} at {} ms: PostgreSQL statements (pg_stat_statements)\n\n| calls/msg | rows/msg | ms/call | statement |\n|---|---|---|---|\n{}",
                run.design,
                run.latency_ms,
                r.statements.join("\n")
            ));
        }
        csv.push_str(&format!(
            "{},{},{},{},{pool},{},{:.1},{:.2},{:.2},{:.2},{:.2},{:.1},{},{},{},{},{:.2},{:.2},{},{:.0},{},{},{},{:.4},{:.4},{:.4}\n",
            run.design,
            run.latency_ms,
            run.n,
            run.clients,
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
            r.load_after,
            run.prefill.map(|p| p.to_string()).unwrap_or_default(),
            fill_s,
            run.instances,
            r.rss_each
                .iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(";"),
            r.peak_each
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(";"),
            r.cpu.server_ms,
            r.cpu.bench_ms,
            r.cpu.postgres_ms,
        ));
        done.push(Done {
            run: run.clone(),
            row: r,
            fill_s,
        });
    }
    if sized.is_some() && !keep {
        pg.drop_db(PREFILL_DB).await;
    }
    if let Some(dir) = Path::new(&csv_path).parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&csv_path, &csv).unwrap();
    println!("{}", table.join("\n"));
    println!("\n(csv: {csv_path})");
    println!("\nCPU per message (from /proc; \"two cores could carry\" = 2,000 ms ÷ total):\n");
    println!("{}", cpu_table.join("\n"));
    for t in &statement_tables {
        println!("{t}");
    }
    print_peer_ratios(&rates);
    print_scale_tables(&done);

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
