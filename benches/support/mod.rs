//! What every benchmark reads from its environment and the machine.
#![allow(dead_code)]

pub mod fill;
pub mod proc_cpu;

/// `name` parsed from the environment, else `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The 1-minute load average (recorded beside each figure: the machine may be shared).
pub fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// A database of its own on the PostgreSQL server of `BENCH_PG` (default
/// `postgres://postgres@127.0.0.1:5432/postgres`), named `claimd_bench_<name>_<pid>`; dropped
/// with [`BenchDb::drop_now`].
pub struct BenchDb {
    /// Its URL.
    pub url: String,
    name: String,
    admin: sqlx::PgConnection,
}

impl BenchDb {
    /// Creates it.
    pub async fn create(name: &str) -> BenchDb {
        use sqlx::Connection;
        let admin_url: String = env_or(
            "BENCH_PG",
            "postgres://postgres@127.0.0.1:5432/postgres".to_string(),
        );
        let db = format!("claimd_bench_{name}_{}", std::process::id());
        let mut admin = sqlx::PgConnection::connect(&admin_url)
            .await
            .expect("connect admin");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
            .execute(&mut admin)
            .await
            .unwrap();
        let url = format!("{}/{db}", admin_url.rsplit_once('/').unwrap().0);
        BenchDb {
            url,
            name: db,
            admin,
        }
    }

    /// Drops it (and whatever connections are still open to it).
    pub async fn drop_now(mut self) {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut self.admin)
        .await;
    }
}
