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

/// A worker's configuration with consumer `payments` fed by HTTP intake and calling
/// `{provider}/v1/payments` (concurrency 64); with `sql`, consumer `ledger` too, whose effect
/// writes a row of `bench_ledger`.
pub fn payments_toml(url: &str, provider: &str, pool: u32, sql: bool) -> String {
    let mut toml = format!(
        r#"
[store]
url = "{url}"
max_connections = {pool}
[http]
listen = "127.0.0.1:0"
intake_wait = "5s"
[sweeper]
schedule = "*/10 * * * * *"
[[consumers]]
name = "payments"
source = "http"
concurrency = 64
lease = "60s"
key = "{{message_id}}"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "10s"
status_url = "{provider}/v1/effects/{{key}}"
"#
    );
    if sql {
        toml.push_str(
            r#"
[[consumers]]
name = "ledger"
source = "http"
concurrency = 64
lease = "60s"
key = "{message_id}"
[consumers.effect]
kind = "sql"
statement = "INSERT INTO bench_ledger (order_id, amount_cents) VALUES (:order_id, :amount_cents)"
"#,
        );
    }
    toml
}
