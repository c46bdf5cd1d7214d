//! Shared test support: real stores (SQLite files, fresh PostgreSQL databases), a worker
//! started in-process, the sandbox provider, and a scriptable provider for fault tests.
#![allow(dead_code)]

use claimd::config::Config;
use claimd::provider::sandbox::{Sandbox, SandboxOptions};
use claimd::service::app::App;
use claimd::service::run::{self, Running};
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

/// A consumer section for tests. Lines in `extra` (`key = value`) replace the defaults.
pub fn consumer_toml(name: &str, provider_url: &str, extra: &str) -> String {
    let mut settings = vec![
        ("concurrency", "32".to_string()),
        ("lease", "\"3s\"".to_string()),
        ("max_attempts", "5".to_string()),
        ("redrive_within", "\"1h\"".to_string()),
        ("on_unknown", "\"reconcile\"".to_string()),
    ];
    for line in extra.lines().filter(|l| l.contains('=')) {
        let (k, v) = line.split_once('=').unwrap();
        let (k, v) = (k.trim(), v.trim().to_string());
        match settings.iter_mut().find(|(name, _)| *name == k) {
            Some(slot) => slot.1 = v,
            None => settings.push((Box::leak(k.to_string().into_boxed_str()), v)),
        }
    }
    let settings: String = settings
        .iter()
        .map(|(k, v)| format!("{k} = {v}\n"))
        .collect();
    format!(
        r#"
[[consumers]]
name = "{name}"
source = "http"
{settings}
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

/// A claim of `{}` whose worker died at once (its lease already over), as `ClaimStore::claim`
/// takes it: what a crash leaves for the sweeper.
pub fn orphan_claim(
    consumer: &str,
    tenant: &str,
    id: &str,
    idem_key: &str,
) -> claimd::domain::claim::NewClaim {
    claimd::domain::claim::NewClaim {
        consumer: consumer.into(),
        tenant: tenant.into(),
        message_id: id.into(),
        idem_key: idem_key.into(),
        fingerprint: claimd::domain::claim::fingerprint(b"{}"),
        payload: bytes::Bytes::from_static(b"{}"),
        content_type: "application/json".into(),
        worker: "dead-worker".into(),
        lease: Duration::ZERO,
        claim_token: claimd::domain::claim::new_claim_token(),
        mark_not_called: false,
        order_key: None,
        not_before: None,
        trace_parent: None,
        priority: 0,
    }
}

/// `GET url`, answered with JSON (any status), as a value.
pub async fn get_json(url: &str) -> serde_json::Value {
    client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The body of a `GET` of `url`, as text (`/metrics`, a page without a sign-in).
pub async fn get_text(url: &str) -> String {
    client()
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
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
    claimd::provider::tls::http_client_builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}
/// A consumer's claims (in `state`, or all), up to 100,000.
pub async fn claims_in(
    store: &claimd::store::Store,
    consumer: &str,
    state: Option<claimd::domain::claim::ClaimState>,
) -> Vec<claimd::domain::claim::Claim> {
    store
        .list(&claimd::store::ClaimFilter {
            consumer: Some(consumer.to_string()),
            state,
            limit: 100_000,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// A consumer's counts over all time (zeros when it has none).
pub async fn counts_of(
    store: &claimd::store::Store,
    consumer: &str,
) -> claimd::store::ConsumerCounts {
    store
        .counts(None)
        .await
        .unwrap()
        .into_iter()
        .find(|c| c.consumer == consumer)
        .unwrap_or_default()
}

/// Renames a table of the store's database, as an administrator would (the store's statements
/// on it fail until it is renamed back).
pub async fn rename_table(store: &TestStore, from: &str, to: &str) {
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(&store.url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {from} RENAME TO {to}"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
}

/// A `[[consumers]]` section of `source`: the `defaults` (key, TOML value), replaced or added
/// to by the `key = value` lines of `extra`, then `effect` (the `[consumers.effect]` table).
pub fn consumer_section(
    name: &str,
    source: &str,
    defaults: Vec<(&str, String)>,
    extra: &str,
    effect: &str,
) -> String {
    let mut settings: Vec<(String, String)> = defaults
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    for line in extra.lines().filter(|l| l.contains('=')) {
        let (k, v) = line.split_once('=').unwrap();
        let (k, v) = (k.trim().to_string(), v.trim().to_string());
        match settings.iter_mut().find(|(n, _)| *n == k) {
            Some(slot) => slot.1 = v,
            None => settings.push((k, v)),
        }
    }
    let settings: String = settings
        .iter()
        .map(|(k, v)| format!("{k} = {v}\n"))
        .collect();
    format!("\n[[consumers]]\nname = \"{name}\"\nsource = \"{source}\"\n{settings}{effect}\n")
}

/// A `claimd run` process for `toml` (its `127.0.0.1:0` listen address given a free port),
/// its configuration and log as `<dir>/<name>.toml` and `<dir>/<name>.log`, once `/readyz`
/// answers `200`.
pub async fn ready_worker(toml: &str, dir: &Path, name: &str) -> Worker {
    let port = free_port();
    let toml = toml.replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, toml).unwrap();
    let w = Worker::spawn(&config, port, &dir.join(format!("{name}.log"))).await;
    let ready = w.ready_within(Duration::from_secs(15)).await;
    assert!(ready, "the worker did not become ready");
    w
}

pub mod amqp;
pub mod amqp_raw;
pub mod hangup;
pub mod localstripe;
pub mod nats;
pub mod pg_pair;
pub mod pg_roles;
pub mod pgbouncer;
pub mod previous_build;
pub mod provider;
pub mod smtp;
pub mod tls;

/// A free loopback port (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `claimd` process run from the built binary.
pub struct Worker {
    pub child: std::process::Child,
    pub base: String,
}

impl Worker {
    /// Starts `claimd run` with `config` (a file path) and waits until it answers /healthz.
    pub async fn spawn(config: &Path, port: u16, log: &Path) -> Worker {
        Worker::spawn_bin(&claimd_bin(), config, port, log).await
    }

    /// [`Worker::spawn`] with another `claimd` binary (an earlier build).
    pub async fn spawn_bin(bin: &Path, config: &Path, port: u16, log: &Path) -> Worker {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = std::process::Command::new(bin)
            .args(["run", "--config"])
            .arg(config)
            .env("CLAIMD_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn claimd");
        let base = format!("http://127.0.0.1:{port}");
        let c = client();
        let up = eventually(Duration::from_secs(20), || {
            let c = c.clone();
            let url = format!("{base}/healthz");
            async move { c.get(url).send().await.is_ok() }
        })
        .await;
        assert!(up, "claimd did not come up on port {port}");
        Worker { child, base }
    }

    /// Waits for an already spawned `claimd run` to answer /healthz on `port`.
    pub async fn attach(child: std::process::Child, port: u16) -> Worker {
        let base = format!("http://127.0.0.1:{port}");
        let c = client();
        let up = eventually(Duration::from_secs(20), || {
            let c = c.clone();
            let url = format!("{base}/healthz");
            async move { c.get(url).send().await.is_ok() }
        })
        .await;
        assert!(up, "claimd did not come up on port {port}");
        Worker { child, base }
    }

    /// Whether `/readyz` answers `200` within `within`.
    pub async fn ready_within(&self, within: Duration) -> bool {
        eventually(within, || {
            let url = format!("{}/readyz", self.base);
            async move {
                client()
                    .get(url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
            }
        })
        .await
    }

    /// SIGKILL: no cleanup, no settle.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        unsafe_sigterm(self.child.id());
        self.child.wait().unwrap()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unsafe_sigterm(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

/// Runs a `claimd` CLI command to completion: (exit code, stdout, stderr).
pub fn cli(args: &[&str]) -> (i32, String, String) {
    cli_with_env(args, &[])
}

/// [`cli`] with these environment variables set too.
pub fn cli_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = std::process::Command::new(claimd_bin())
        .args(args)
        .env("CLAIMD_LOG", "warn")
        // Operator commands are refused when nobody can be named (no $USER under CI): the
        // tests act as "test" unless they say otherwise.
        .env("CLAIMD_OPERATOR", "test")
        .envs(env.iter().copied())
        .output()
        .expect("run claimd");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Sends a hand-written HTTP/1.1 POST (for header bytes no client library will send, like
/// control characters) and returns the status and body.
pub async fn raw_post(
    addr: std::net::SocketAddr,
    path: &str,
    key: &[u8],
    body: &[u8],
) -> (u16, String) {
    try_raw_post(addr, path, key, body)
        .await
        .unwrap_or_else(|| panic!("no answer from {addr}"))
}

/// [`raw_post`] for a server that may be down: `None` when it cannot be reached or does not
/// answer within 10 seconds.
pub async fn try_raw_post(
    addr: std::net::SocketAddr,
    path: &str,
    key: &[u8],
    body: &[u8],
) -> Option<(u16, String)> {
    try_raw_request(addr, path, &[("Idempotency-Key", key)], body).await
}

/// Sends a hand-written HTTP/1.1 POST with the given header lines (any bytes, repeated names
/// allowed) and returns the status and body.
pub async fn raw_request(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> (u16, String) {
    try_raw_request(addr, path, headers, body)
        .await
        .unwrap_or_else(|| panic!("no answer from {addr}"))
}

/// [`raw_request`] for a server that may be down.
pub async fn try_raw_request(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for (name, value) in headers {
        req.extend_from_slice(name.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    s.write_all(&req).await.ok()?;
    let mut out = Vec::new();
    // A reset after the answer is fine: what was read is parsed.
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}
pub mod proxy;

/// The `claimd` binary: `$CLAIMD_BIN` when set (a copy taken right after a build: a target
/// directory shared between checkouts may be rebuilt by another one before the tests run, or
/// another version to compare with), else the one cargo built for this test, else
/// `target/release/claimd` (for the long-run example).
pub fn claimd_bin() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("CLAIMD_BIN") {
        return p.into();
    }
    if let Some(p) = option_env!("CARGO_BIN_EXE_claimd") {
        return p.into();
    }
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/claimd")
}

/// A worker on a fresh SQLite store with one `payments` consumer calling a fresh sandbox;
/// `http_extra` goes into `[http]`. Keep the store and the sandbox alive as long as the worker.
pub async fn payments_worker(http_extra: &str) -> (TestStore, Sandbox, Running) {
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(Default::default()).await;
    let running = start(&config_toml_with(
        &store.url(),
        http_extra,
        &consumer_toml("payments", &provider, ""),
    ))
    .await;
    (store, sandbox, running)
}

/// A `needs_attention` claim `id` of `consumer` (no tenant) parked for `reason`, as the
/// sweeper leaves one whose outcome it could not decide.
pub async fn parked_claim(store: &claimd::store::Store, consumer: &str, id: &str, reason: &str) {
    parked_claim_with_key(store, consumer, id, id, reason).await
}

/// [`parked_claim`] with idempotency key `key` (`payments::order-1001` is what the default
/// template gives a claim without a tenant).
pub async fn parked_claim_with_key(
    store: &claimd::store::Store,
    consumer: &str,
    id: &str,
    key: &str,
    reason: &str,
) {
    park_claim(store, &orphan_claim(consumer, "", id, key), reason, "test").await
}

/// Claims `n` and parks it as `needs_attention` for `reason`, the park recorded as `actor`'s.
pub async fn park_claim(
    store: &claimd::store::Store,
    n: &claimd::domain::claim::NewClaim,
    reason: &str,
    actor: &str,
) {
    use claimd::store::{ClaimOutcome, NewEvent, Settlement};
    let ClaimOutcome::Created(c) = store.claim(n).await.unwrap() else {
        panic!("new claim {}", n.message_id)
    };
    let ev = NewEvent {
        actor,
        action: "park",
        outcome: "unknown",
        provider_status: None,
        detail: None,
    };
    let parked = Settlement {
        state: Some(claimd::domain::claim::ClaimState::NeedsAttention),
        error: Some(reason.into()),
        ..Default::default()
    };
    assert!(store.settle(c.id, 1, &parked, &ev).await.unwrap());
}

/// A claim's history as `action outcome` lines, for assertion messages.
pub fn lines(events: &[claimd::store::ClaimEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| format!("{} {}", e.action, e.outcome))
        .collect()
}
