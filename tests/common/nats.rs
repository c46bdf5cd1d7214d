//! NATS JetStream for tests: the server on 127.0.0.1:4222 (override with `CLAIMD_TEST_NATS`),
//! or a private `nats-server -js` on a free port for a test that restarts it; a stream and a
//! dead-letter stream with a random suffix per test, deleted at the end.

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;
use std::path::Path;
use std::time::Duration;

/// The server tests use.
pub fn nats_url() -> String {
    std::env::var("CLAIMD_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A test's streams: `stream` taking `subject`, and `<stream>-dead` taking `dead_subject`.
pub struct TestStream {
    pub url: String,
    pub stream: String,
    pub subject: String,
    pub dead_subject: String,
    pub js: jetstream::Context,
}

impl TestStream {
    /// Connects to the shared server and creates fresh streams. `None` (with `SKIPPED:`
    /// printed) only outside CI when no server answers; under `CI=true` it fails the test.
    pub async fn new(prefix: &str) -> Option<TestStream> {
        TestStream::on(&nats_url(), prefix).await
    }

    /// The same on the server at `url`.
    pub async fn on(url: &str, prefix: &str) -> Option<TestStream> {
        let client =
            match tokio::time::timeout(Duration::from_secs(10), async_nats::connect(url)).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return skip(url, &e.to_string()),
                Err(_) => return skip(url, "timed out"),
            };
        let js = jetstream::new(client);
        let suffix = format!("{}-{:08x}", std::process::id(), fastrand::u32(..));
        let t = TestStream {
            url: url.to_string(),
            stream: format!("claimd-test-{prefix}-{suffix}"),
            subject: format!("claimd-test.{prefix}.{suffix}.in"),
            dead_subject: format!("claimd-test.{prefix}.{suffix}.dead"),
            js,
        };
        t.create_streams().await;
        Some(t)
    }

    /// Creates both streams (file storage); idempotent.
    pub async fn create_streams(&self) {
        self.create_stream(&self.stream, &self.subject).await;
        self.create_dead_stream().await;
    }

    /// Creates the dead-letter stream.
    pub async fn create_dead_stream(&self) {
        self.create_stream(&self.dead(), &self.dead_subject).await;
    }

    async fn create_stream(&self, name: &str, subject: &str) {
        self.js
            .get_or_create_stream(stream::Config {
                name: name.to_string(),
                subjects: vec![subject.to_string()],
                ..Default::default()
            })
            .await
            .unwrap();
    }

    /// The dead-letter stream's name.
    pub fn dead(&self) -> String {
        format!("{}-dead", self.stream)
    }

    /// A consumer section reading this stream. Lines in `extra` (`key = value`) replace the
    /// defaults or add keys; `effect` is the `[consumers.effect]` table.
    pub fn consumer_toml(&self, name: &str, extra: &str, effect: &str) -> String {
        let defaults = vec![
            ("nats_url", format!("{:?}", self.url)),
            ("stream", format!("{:?}", self.stream)),
            ("subject", format!("{:?}", self.subject)),
            ("dead_letter_subject", format!("{:?}", self.dead_subject)),
            ("prefetch", "32".into()),
            ("ack_wait", "\"5s\"".into()),
            ("concurrency", "32".into()),
            ("lease", "\"3s\"".into()),
            ("max_attempts", "5".into()),
            ("redrive_within", "\"1h\"".into()),
            ("tenant_header", "\"Tenant-Id\"".into()),
        ];
        super::consumer_section(name, "nats", defaults, extra, effect)
    }

    /// Publishes to the work subject, waiting for the stream's acknowledgement.
    pub async fn publish(&self, headers: HeaderMap, body: &[u8]) {
        self.js
            .publish_with_headers(self.subject.clone(), headers, body.to_vec().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// Publishes with a message id (`Nats-Msg-Id`) and a JSON body.
    pub async fn publish_json(&self, id: &str, body: &str) {
        self.publish(
            headers(&[("Nats-Msg-Id", id), ("Content-Type", "application/json")]),
            body.as_bytes(),
        )
        .await;
    }

    /// Messages in the work stream no consumer has acknowledged yet, per the durable
    /// consumer `durable`: waiting to be delivered plus delivered and unacknowledged.
    /// Asked again for up to 15 s while the server does not answer (this client reconnects
    /// on its own after a restart).
    pub async fn unacknowledged(&self, durable: &str) -> u64 {
        let end = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            match self.consumer_info(durable).await {
                Ok(info) => return info.num_pending + info.num_ack_pending as u64,
                Err(e) if tokio::time::Instant::now() >= end => {
                    panic!("no consumer info for {durable}: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    async fn consumer_info(&self, durable: &str) -> Result<consumer::Info, String> {
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| e.to_string())?;
        let mut c: consumer::PullConsumer = stream
            .get_consumer(durable)
            .await
            .map_err(|e| e.to_string())?;
        c.info().await.cloned().map_err(|e| e.to_string())
    }

    /// Every message in the dead-letter stream (read with an ephemeral consumer; they stay).
    pub async fn dead_letters(&self) -> Vec<async_nats::Message> {
        self.read_all(&self.dead()).await
    }

    /// Every message in the work stream (what a publisher to `subject` left there).
    pub async fn stored(&self) -> Vec<async_nats::Message> {
        self.read_all(&self.stream).await
    }

    async fn read_all(&self, name: &str) -> Vec<async_nats::Message> {
        let stream = self.js.get_stream(name).await.unwrap();
        let c: consumer::PullConsumer = stream
            .create_consumer(consumer::pull::Config {
                ack_policy: consumer::AckPolicy::None,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut out = Vec::new();
        let mut batch = c
            .fetch()
            .max_messages(10_000)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .unwrap();
        while let Some(Ok(m)) = batch.next().await {
            out.push(m.split().0);
        }
        out
    }

    /// Deletes both streams.
    pub async fn delete(&self) {
        let _ = self.js.delete_stream(&self.stream).await;
        let _ = self.js.delete_stream(self.dead()).await;
    }
}

/// A header map of `pairs`.
pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, *v);
    }
    h
}

/// A header's value as text.
pub fn header(m: &async_nats::Message, name: &str) -> Option<String> {
    m.headers
        .as_ref()?
        .get(name)
        .map(|v| v.as_str().to_string())
}

fn skip<T>(url: &str, why: &str) -> Option<T> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("NATS at {url} is required under CI=true: {why}");
    }
    eprintln!("SKIPPED: no NATS server at {url} ({why})");
    None
}

/// A private `nats-server -js` on a free port, its store in `dir`: a test may stop and
/// start it. Killed on drop.
pub struct PrivateServer {
    pub port: u16,
    pub url: String,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl PrivateServer {
    /// Starts one; `None` (skipped) outside CI when `nats-server` is not installed.
    pub fn start(dir: &Path) -> Option<PrivateServer> {
        let port = super::free_port();
        let mut s = PrivateServer {
            port,
            url: format!("nats://127.0.0.1:{port}"),
            dir: dir.to_path_buf(),
            child: None,
        };
        if let Err(e) = s.run() {
            return skip("nats-server", &e);
        }
        Some(s)
    }

    fn binary() -> &'static str {
        if Path::new("/usr/sbin/nats-server").exists() {
            "/usr/sbin/nats-server"
        } else {
            "nats-server"
        }
    }

    fn run(&mut self) -> Result<(), String> {
        let child = std::process::Command::new(Self::binary())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start nats-server: {e}"))?;
        self.child = Some(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err("nats-server did not listen within 5 s".into())
    }

    /// Kills the server (SIGKILL: what a crash leaves).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        self.run().unwrap();
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.kill();
    }
}
