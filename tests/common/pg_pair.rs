//! A private PostgreSQL primary (`wal_level = replica`) and a streaming standby made from it
//! with `pg_basebackup`, on free loopback ports, run as user `postgres` (through `runuser`
//! when the tests run as root); stopped and deleted on drop. For the replication, failover
//! and read-replica tests: the standby can be synchronous or asynchronous, the primary can be
//! SIGKILLed and the standby promoted. Both load `pg_stat_statements` (create the extension
//! to read it), so a test can tell which statements reached which server.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether the standby confirms each commit before the primary answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standby {
    /// Named in `synchronous_standby_names`: a commit waits for it.
    Synchronous,
    /// Streaming only: a commit does not wait for it.
    Asynchronous,
}

/// The pair of servers.
pub struct PgPair {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The primary's port.
    pub primary_port: u16,
    /// The standby's port.
    pub standby_port: u16,
}

impl PgPair {
    /// Starts both servers and waits until the standby streams. `None` (with the reason
    /// printed) when no PostgreSQL server binaries are installed; under `CI=true` that is a
    /// failure.
    pub fn start(standby: Standby) -> Option<PgPair> {
        let root = Path::new("/usr/lib/postgresql");
        let version = std::fs::read_dir(root).ok().and_then(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter_map(|v| v.parse::<u32>().ok())
                .max()
        });
        let Some(bin) = version.map(|v| root.join(v.to_string()).join("bin")) else {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("PostgreSQL server binaries are required under CI=true");
            }
            eprintln!(
                "SKIPPED: no PostgreSQL server binaries under {}",
                root.display()
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown the private cluster's directory");
        }
        let pair = PgPair {
            primary_port: super::free_port(),
            standby_port: super::free_port(),
            bin,
            dir,
        };
        let primary = pair.data("primary");
        let standby_dir = pair.data("standby");
        pair.run(
            "initdb",
            &[
                "-D",
                &primary.display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
            ],
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(primary.join("pg_hba.conf"))
            .and_then(|mut f| {
                use std::io::Write;
                writeln!(f, "host replication all 127.0.0.1/32 trust")
            })
            .unwrap();
        // In the file ALTER SYSTEM writes, not on the command line, which would override it.
        let names = match standby {
            Standby::Synchronous => "standby1",
            Standby::Asynchronous => "",
        };
        std::fs::write(
            primary.join("postgresql.auto.conf"),
            format!("synchronous_standby_names = '{names}'\n"),
        )
        .unwrap();
        pair.start_server("primary", pair.primary_port);
        let port = pair.primary_port.to_string();
        pair.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                &standby_dir.display().to_string(),
                "-R",
                "-X",
                "stream",
            ],
        );
        let conninfo = format!(
            "primary_conninfo = 'host=127.0.0.1 port={port} user=postgres application_name=standby1'\n"
        );
        std::fs::write(standby_dir.join("postgresql.auto.conf"), conninfo).unwrap();
        pair.start_server("standby", pair.standby_port);
        Some(pair)
    }

    fn data(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts (or starts again) one of the two servers on its port.
    fn start_server(&self, name: &str, port: u16) {
        let socket = self.dir.path().display().to_string();
        let options = format!(
            "-p {port} -k {socket} -c listen_addresses=127.0.0.1 -c wal_level=replica \
             -c max_wal_senders=4 -c max_connections=200 -c hot_standby=on \
             -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
        );
        let log = self
            .dir
            .path()
            .join(format!("{name}.log"))
            .display()
            .to_string();
        let data = self.data(name).display().to_string();
        self.run(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-w", "-o", &options, "start"],
        );
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .output()
            .expect("run a PostgreSQL program");
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        }
    }

    /// The primary's URL.
    pub fn url(&self) -> String {
        port_url(self.primary_port)
    }

    /// The standby's URL.
    pub fn standby_url(&self) -> String {
        port_url(self.standby_port)
    }

    /// A multi-host URL naming both servers, primary first, for `target_session_attrs`.
    pub fn multi_host_url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.primary_port, self.standby_port
        )
    }

    /// Sets `synchronous_standby_names` on the primary and reloads it.
    pub async fn set_names(&self, names: &str) {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&self.url()).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut conn)
            .await
            .unwrap();
    }

    /// Waits (up to 30 s) until the standby has replayed everything the primary has written.
    pub async fn wait_caught_up(&self) {
        use sqlx::Connection;
        let mut p = sqlx::PgConnection::connect(&self.url()).await.unwrap();
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut p)
            .await
            .unwrap();
        let mut s = sqlx::PgConnection::connect(&self.standby_url())
            .await
            .unwrap();
        for _ in 0..300 {
            let behind: bool = sqlx::query_scalar(
                "SELECT pg_last_wal_replay_lsn() IS NULL OR pg_last_wal_replay_lsn() < $1::pg_lsn",
            )
            .bind(&lsn)
            .fetch_one(&mut s)
            .await
            .unwrap();
            if !behind {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("the standby did not catch up with {lsn}");
    }

    /// SIGKILLs the primary's postmaster and every backend at once, and returns when none is
    /// left. Killing the postmaster alone is not a crash: its backends go on answering until
    /// they notice, so a transaction could still commit on the old primary after the "kill".
    pub fn kill_primary(&self) {
        let pid = std::fs::read_to_string(self.data("primary").join("postmaster.pid"))
            .expect("the primary's postmaster.pid");
        let pid = pid.lines().next().unwrap().trim().to_string();
        // Stopped, the postmaster forks no backend between the listing and the kill.
        let _ = Command::new("kill").args(["-STOP", &pid]).status();
        let children = Command::new("pgrep")
            .args(["-P", &pid])
            .output()
            .expect("pgrep");
        let mut pids: Vec<String> = String::from_utf8_lossy(&children.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        pids.push(pid.clone());
        let ok = Command::new("kill")
            .arg("-KILL")
            .args(&pids)
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill the primary ({pids:?})");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while pids.iter().any(|p| alive(p)) {
            assert!(
                std::time::Instant::now() < deadline,
                "the primary's processes outlived SIGKILL: {pids:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Promotes the standby to primary and waits until it accepts writes.
    pub fn promote_standby(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data("standby").display().to_string(),
                "-w",
                "promote",
            ],
        );
    }
}

impl Drop for PgPair {
    fn drop(&mut self) {
        for name in ["standby", "primary"] {
            let data = self.data(name).display().to_string();
            let _ = self
                .command("pg_ctl")
                .args(["-D", &data, "-m", "immediate", "stop"])
                .output();
        }
    }
}

fn port_url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

/// Whether the tests run as root (then the servers run as `postgres`, which initdb requires).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// Whether a process runs: a zombie counts as gone, since it can no longer answer.
fn alive(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}
