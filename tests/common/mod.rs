//! Shared test support: real stores (SQLite files, fresh PostgreSQL databases), a worker
//! started in-process, the sandbox provider, and a scriptable provider for fault tests.
#![allow(dead_code)]

use claimd::app::App;
use claimd::config::Config;
use claimd::run::{self, Running};
use claimd::sandbox::{Sandbox, SandboxOptions};
use std::path::Path;
use std::time::Duration;

/// PostgreSQL server used by tests (a maintenance database; each test makes its own).
pub fn pg_admin_url() -> String {
    std::env::var("CLAIMD_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Under CI a missing PostgreSQL is a failure; on a developer machine, a printed skip.
pub fn require_pg() -> bool {
    true
}

/// A fresh PostgreSQL database for one test, dropped on drop. `None` (skip, with the reason
/// printed) only outside CI when no server answers.
pub struct PgDb {
    pub url: String,
    name: String,
}

impl PgDb {
    pub async fn create() -> Option<PgDb> {
        use sqlx::Connection;
        let admin = pg_admin_url();
        let mut conn = match sqlx::PgConnection::connect(&admin).await {
            Ok(c) => c,
            Err(e) => {
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!("PostgreSQL at {admin} is required under CI=true: {e}");
                }
                eprintln!(
                    "SKIPPED: no PostgreSQL at {admin} ({e}); set CLAIMD_TEST_PG or start it"
                );
                return None;
            }
        };
        let name = format!("claimd_t_{}_{}", std::process::id(), fastrand::u64(..));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let base = admin
            .rsplit_once('/')
            .map(|(b, _)| b)
            .unwrap_or(&admin)
            .to_string();
        Some(PgDb {
            url: format!("{base}/{name}"),
            name,
        })
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let admin = pg_admin_url();
        let name = self.name.clone();
        // Dropped from a plain thread: the test's runtime may be shutting down.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                use sqlx::Connection;
                if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&mut c)
                    .await;
                }
            });
        })
        .join();
    }
}

/// Which store a test runs on.
pub enum TestStore {
    Sqlite(tempfile::TempDir),
    Pg(PgDb),
}

impl TestStore {
    pub fn sqlite() -> TestStore {
        TestStore::Sqlite(tempfile::tempdir().unwrap())
    }
    pub async fn pg() -> Option<TestStore> {
        PgDb::create().await.map(TestStore::Pg)
    }
    pub fn url(&self) -> String {
        match self {
            TestStore::Sqlite(dir) => {
                format!("sqlite://{}", dir.path().join("claims.db").display())
            }
            TestStore::Pg(db) => db.url.clone(),
        }
    }
}

/// A consumer section for tests.
pub fn consumer_toml(name: &str, provider_url: &str, extra: &str) -> String {
    format!(
        r#"
[[consumers]]
name = "{name}"
source = "http"
concurrency = 32
lease = "3s"
max_attempts = 5
redrive_within = "1h"
on_unknown = "reconcile"
{extra}
[consumers.effect]
kind = "http"
url = "{provider_url}/v1/{name}"
timeout = "1s"
status_url = "{provider_url}/v1/effects/{{key}}"
headers = {{ Authorization = "Bearer provider-secret-token" }}
"#
    )
}

/// A whole configuration: the store, an ephemeral HTTP port, a 1-second sweeper.
pub fn config_toml(store_url: &str, consumers: &str) -> String {
    config_toml_with(store_url, "", consumers)
}

/// Like [`config_toml`], with extra `[http]` keys.
pub fn config_toml_with(store_url: &str, http_extra: &str, consumers: &str) -> String {
    format!(
        r#"
[store]
url = "{store_url}"
max_connections = 8
[http]
listen = "127.0.0.1:0"
{http_extra}
[sweeper]
schedule = "* * * * * *"
batch_size = 500
[retention]
keep_terminal_for = "2h"
{consumers}
"#
    )
}

pub fn load(toml: &str) -> Config {
    Config::from_toml(toml, Path::new("test.toml"), std::env::vars())
        .unwrap_or_else(|e| panic!("test config: {e}"))
        .config
}

/// Opens the app (migrating) and starts the worker in-process.
pub async fn start(toml: &str) -> Running {
    let app = App::open(load(toml), true).await.expect("open app");
    run::start(app).await.expect("start worker")
}

/// Starts the sandbox provider on an ephemeral port.
pub async fn sandbox(options: SandboxOptions) -> (Sandbox, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sb = Sandbox::new(options);
    let served = sb.clone();
    tokio::spawn(async move {
        let _ = served.serve(listener, std::future::pending()).await;
    });
    (sb, url)
}

/// Polls `check` until it returns true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() > end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}
pub mod provider;
