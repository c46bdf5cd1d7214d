//! Where each message's CPU goes (issue 16 §2): CPU seconds, read from `/proc`, of the server
//! under test (its own process), of this process (the client and the sandbox provider) and of
//! PostgreSQL (the postmaster of the server behind `BENCH_PG` and its children, plus what it
//! reaped from backends that ended), and of the whole machine. CPU time, unlike wall time, does not shrink when other
//! work shares the cores, so CPU per message is the figure that says what two cores can carry.
//!
//! With `BENCH_PG_STATEMENTS=1` and `pg_stat_statements` loaded by the server behind `BENCH_PG`
//! (a private cluster: `scripts/pg_private.sh`), each run also lists its statements: calls and
//! rows per message and time per call.

use super::*;
use crate::support::proc_cpu::{postgres_cpu, proc_times};

/// CPU seconds used so far, by role.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CpuSample {
    pub(crate) server: f64,
    pub(crate) bench: f64,
    pub(crate) postgres: f64,
    pub(crate) machine: f64,
}

/// CPU milliseconds per message, by role, over one run.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CpuPerMsg {
    pub(crate) server_ms: f64,
    pub(crate) bench_ms: f64,
    pub(crate) postgres_ms: f64,
    /// Everything else the machine ran meanwhile (other users of the shared cores).
    pub(crate) other_ms: f64,
}

impl CpuPerMsg {
    /// Server + client/provider + PostgreSQL.
    pub(crate) fn total_ms(&self) -> f64 {
        self.server_ms + self.bench_ms + self.postgres_ms
    }
}

/// Clock ticks per second of `/proc`'s CPU times (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
const TICKS: f64 = 100.0;

/// The postmaster of the server behind `pg` ([`crate::support::proc_cpu::postmaster`]).
pub(crate) async fn postmaster(pg: &Pg) -> Option<u32> {
    crate::support::proc_cpu::postmaster(&pg.admin).await
}

fn machine_cpu() -> f64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let line = s.lines().next()?.to_string();
            // cpu user nice system idle iowait irq softirq steal: busy = all but idle, iowait.
            let v: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            Some(v.iter().sum::<f64>() - v.get(3).unwrap_or(&0.0) - v.get(4).unwrap_or(&0.0))
        })
        .map(|t| t / TICKS)
        .unwrap_or(0.0)
}

/// CPU used so far by the server processes `pids`, this process, the PostgreSQL server whose
/// postmaster is `postmaster`, and the machine.
pub(crate) fn sample(pids: &[u32], postmaster: Option<u32>) -> CpuSample {
    CpuSample {
        server: pids
            .iter()
            .filter_map(|p| proc_times(&p.to_string()))
            .map(|t| t.1)
            .sum(),
        bench: proc_times("self").map(|t| t.1).unwrap_or(0.0),
        postgres: postgres_cpu(postmaster),
        machine: machine_cpu(),
    }
}

/// CPU per message between two samples.
pub(crate) fn per_msg(a: CpuSample, b: CpuSample, n: usize) -> CpuPerMsg {
    let ms = |x: f64| x * 1000.0 / n as f64;
    let (server, bench, postgres) = (
        b.server - a.server,
        b.bench - a.bench,
        b.postgres - a.postgres,
    );
    CpuPerMsg {
        server_ms: ms(server),
        bench_ms: ms(bench),
        postgres_ms: ms(postgres),
        other_ms: ms((b.machine - a.machine - server - bench - postgres).max(0.0)),
    }
}

/// Clears `pg_stat_statements` when the server has it (`BENCH_PG_STATEMENTS=1`).
pub(crate) async fn statements_reset(pg: &Pg) -> bool {
    if !matches!(
        env_or("BENCH_PG_STATEMENTS", String::new()).as_str(),
        "1" | "true"
    ) {
        return false;
    }
    let mut c = sqlx::PgConnection::connect(&pg.admin).await.unwrap();
    let ok = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut c)
        .await
        .is_ok()
        && sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(&mut c)
            .await
            .is_ok();
    if !ok {
        eprintln!(
            "BENCH_PG_STATEMENTS: pg_stat_statements is not loaded by {}",
            pg.admin
        );
    }
    ok
}

/// The run's statements from `pg_stat_statements`, as table lines: calls and rows per
/// message, mean ms per call, and the statement's start.
pub(crate) async fn statements(pg: &Pg, dbname: &str, n: usize) -> Vec<String> {
    let mut c = sqlx::PgConnection::connect(&pg.admin).await.unwrap();
    let rows: Vec<(i64, i64, f64, String)> = sqlx::query_as(
        "SELECT s.calls, s.rows, s.mean_exec_time, s.query FROM pg_stat_statements s \
         JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1 \
         ORDER BY s.calls DESC LIMIT 12",
    )
    .bind(dbname)
    .fetch_all(&mut c)
    .await
    .unwrap_or_default();
    rows.into_iter()
        .map(|(calls, rows, mean, q)| {
            let q: String = q.split_whitespace().collect::<Vec<_>>().join(" ");
            let q: String = q.chars().take(70).collect();
            format!(
                "| {:.3} | {:.3} | {mean:.3} | `{}` |",
                calls as f64 / n as f64,
                rows as f64 / n as f64,
                q.replace('|', "\\|")
            )
        })
        .collect()
}
