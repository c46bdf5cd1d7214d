//! CPU seconds from `/proc`: a process's own, and a PostgreSQL server's (its postmaster, its
//! live children, and what it reaped from backends that ended). CPU time, unlike wall time,
//! does not shrink when other work shares the cores.

use sqlx::Connection;

/// Clock ticks per second of `/proc`'s CPU times (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
const TICKS: f64 = 100.0;

/// (command, utime + stime, cutime + cstime) of a process, in seconds.
pub fn proc_times(pid: &str) -> Option<(String, f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: split after the last ')'.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_string();
    let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14-17 of stat(5) are at 11-14 after the state field (field 3 → index 0).
    Some((comm, (n(11) + n(12)) / TICKS, (n(13) + n(14)) / TICKS))
}

fn parent_of(pid: &str) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The postmaster of the server at `url` (the parent of a backend of ours): only its
/// processes are counted, not those of another cluster on the machine.
pub async fn postmaster(url: &str) -> Option<u32> {
    let mut c = sqlx::PgConnection::connect(url).await.ok()?;
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut c)
        .await
        .ok()?;
    parent_of(&backend.to_string())
}

/// CPU seconds of the postmaster `root` and its children; the postmaster's reaped time holds
/// the backends that already ended.
pub fn postgres_cpu(root: Option<u32>) -> f64 {
    let (Some(root), Ok(dir)) = (root, std::fs::read_dir("/proc")) else {
        return 0.0;
    };
    let mut total = proc_times(&root.to_string())
        .map(|(_, own, reaped)| own + reaped)
        .unwrap_or(0.0);
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.bytes().all(|b| b.is_ascii_digit()) || parent_of(&name) != Some(root) {
            continue;
        }
        if let Some((_, own, _)) = proc_times(&name) {
            total += own;
        }
    }
    total
}
