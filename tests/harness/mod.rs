//! The fault-injection harness: real `claimd run` processes on one PostgreSQL database, the
//! sandbox provider and an SMTP sink in this process, a client that sends a ledger of messages
//! (new, duplicate, concurrent duplicate, changed payload, bad input, emails) at least once —
//! over HTTP intake or through RabbitMQ — and a chaos loop that SIGKILLs and restarts workers
//! and can stop PostgreSQL and RabbitMQ. At the end it checks the store, the provider, the SMTP
//! sink and the dead-letter queues against the ledger and prints the table.
//!
//! Used by `tests/reliability.rs` (short, in CI) and `examples/chaos.rs` (long runs).
#![allow(dead_code)]

mod gate;

use crate::common::hangup::{self, HangUp, Post, Seen};
use crate::common::smtp::SmtpSink;
use crate::common::{amqp::amqp_url, claimd_bin, free_port, proxy, try_raw_post};
use gate::Gate;

use claimd::sandbox::{Sandbox, SandboxOptions};
use claimd::store::{ClaimFilter, Store};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use reqwest::header::HeaderValue;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How the ledger reaches the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intake {
    /// `POST /v1/messages/{consumer}` to any worker; 503 and connection errors are retried on
    /// another worker. "Acknowledged" is a 202 or 200.
    Http,
    /// Published to the consumer's RabbitMQ queue (persistent, publisher confirms; an
    /// unconfirmed publish is published again). "Acknowledged" is the broker's confirm: from
    /// then on the message must not be lost.
    Amqp,
}

/// What one run does.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name in the table.
    pub name: String,
    /// HTTP intake or RabbitMQ.
    pub intake: Intake,
    /// Distinct messages.
    pub messages: usize,
    /// Worker processes.
    pub workers: usize,
    /// SIGKILL + restart this many times during the run (spread evenly).
    pub kills: usize,
    /// Provider behaviour.
    pub provider: SandboxOptions,
    /// `on_unknown` of the consumer.
    pub on_unknown: &'static str,
    /// Take PostgreSQL away from the workers for this long in the middle.
    pub db_outage: Option<Duration>,
    /// Stop the real server (`pg_ctlcluster stop`/`start`) instead of cutting the workers'
    /// connections at a proxy. The real stop also hits anything else using the server.
    pub real_db_restart: bool,
    /// Client concurrency.
    pub clients: usize,
    /// Seed for the ledger and the chaos.
    pub seed: u64,
    /// Also send the bad-input matrix and changed payloads.
    pub bad_input: bool,
    /// Emails (SMTP effect to a sink on loopback, `on_unknown = "park"`) sent besides the
    /// payments.
    pub emails: usize,
    /// Stop RabbitMQ (`rabbitmqctl stop_app`) for this long in the middle, then start it.
    pub broker_outage: Option<Duration>,
    /// Take the provider down for this long two thirds of the way in: its port refuses
    /// connections and calls in progress are cut.
    pub provider_outage: Option<Duration>,
    /// Share of HTTP sends whose client hangs up mid-request (mid-headers, mid-body, right
    /// after the body, 0.5-30 ms later, with a reset, after part of the answer): not an
    /// acknowledgement, so the client sends again, as a real client retries after its timeout.
    pub hang_ups: f64,
    /// Share of payment ids sent by two tenants (`acme` and `globex`, same body): each
    /// (tenant, id) must be applied once under its own key.
    pub two_tenants: f64,
}

/// The end-of-run checks.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub name: String,
    /// The ledger went through RabbitMQ (bad input is dead-lettered, not answered).
    pub via_broker: bool,
    pub sent: usize,
    pub acknowledged: usize,
    pub completed: usize,
    pub failed: usize,
    pub needs_attention: usize,
    /// Of those, emails (SMTP has no status endpoint: an interrupted send is parked).
    pub needs_attention_emails: usize,
    pub max_applied_per_key: u64,
    pub keys_applied: usize,
    pub lost: usize,
    pub stuck_after_sweep: usize,
    pub duplicates_sent: usize,
    pub duplicates_counted: i64,
    pub mismatches_sent: usize,
    pub mismatches_counted: i64,
    pub bad_refused: usize,
    pub bad_sent: usize,
    /// Changed payloads refused (HTTP 422, or dead-lettered as a mismatch).
    pub mismatches_refused: usize,
    /// Messages the workers dead-lettered, by the store's count (RabbitMQ only).
    pub dead_lettered: i64,
    /// Emails acknowledged; received by the SMTP sink (distinct Message-IDs); most copies of
    /// one Message-ID the sink received.
    pub emails_acked: usize,
    pub emails_received: usize,
    /// Emails settled `completed` that the sink never received (must be 0).
    pub emails_completed_unreceived: usize,
    pub max_emails_per_id: usize,
    /// HTTP sends whose client hung up (each sent again until acknowledged).
    pub hung_up: usize,
    /// Payment ids sent by two tenants; of those (tenant, id) pairs, how many were not
    /// applied under a key of their own (a claim missing, two tenants' claims sharing one
    /// key, or its key never applied).
    pub two_tenant_ids: usize,
    pub two_tenant_misapplied: usize,
    /// Payment claims settled `completed` whose key the provider never applied.
    pub completed_unapplied: usize,
    /// Claims parked for a person whose key (HTTP) or recipient (SMTP) never reached the
    /// provider's door: parked although never sent.
    pub parked_never_sent: usize,
    /// Of those, claims received within -50..+250 ms of a SIGKILL of a worker they were sent to:
    /// the worker died between the commit and the call, and nobody can know the call was never
    /// made (parking them is right). The others were orphaned while their worker lived.
    pub parked_never_sent_at_kill: usize,
    pub kills: usize,
    pub seconds: f64,
}

impl Outcome {
    pub fn header() -> String {
        "| scenario | sent | acked | completed | failed | attention (never sent/at a kill) | max applied/key | lost | stuck | completed unapplied | dups sent/counted | mismatches sent/counted/refused | bad refused/sent | dead-lettered | emails acked/received/max per id | hung up | two-tenant ids/misapplied | kills | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|".into()
    }
    pub fn row(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {} ({} emails; {}/{}) | {} | {} | {} | {} | {}/{} | {}/{}/{} | {}/{} | {} | {}/{}/{} | {} | {}/{} | {} | {:.0} |",
            self.name,
            self.sent,
            self.acknowledged,
            self.completed,
            self.failed,
            self.needs_attention,
            self.needs_attention_emails,
            self.parked_never_sent,
            self.parked_never_sent_at_kill,
            self.max_applied_per_key,
            self.lost,
            self.stuck_after_sweep,
            self.completed_unapplied,
            self.duplicates_sent,
            self.duplicates_counted,
            self.mismatches_sent,
            self.mismatches_counted,
            self.mismatches_refused,
            self.bad_refused,
            self.bad_sent,
            self.dead_lettered,
            self.emails_acked,
            self.emails_received,
            self.max_emails_per_id,
            self.hung_up,
            self.two_tenant_ids,
            self.two_tenant_misapplied,
            self.kills,
            self.seconds
        )
    }
}

struct WorkerProc {
    child: Option<Child>,
    port: u16,
}

/// The set of `claimd run` processes.
struct Fleet {
    config: PathBuf,
    log: PathBuf,
    workers: Vec<WorkerProc>,
}

impl Fleet {
    fn spawn_one(&self, port: u16) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        Command::new(claimd_bin())
            .args(["run", "--config"])
            .arg(&self.config)
            .env("CLAIMD__HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .env("CLAIMD__RUN__INSTANCE", format!("w{port}"))
            .env("CLAIMD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn claimd")
    }

    async fn wait_up(port: u16) {
        let c = reqwest::Client::new();
        for _ in 0..400 {
            if c.get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("worker on {port} did not come up");
    }

    async fn restart(&mut self, i: usize) {
        let port = self.workers[i].port;
        if let Some(mut c) = self.workers[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.workers[i].child = Some(self.spawn_one(port));
        Self::wait_up(port).await;
    }

    fn ports(&self) -> Vec<u16> {
        self.workers.iter().map(|w| w.port).collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for w in &mut self.workers {
            if let Some(c) = w.child.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn pg_cluster() -> String {
    std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .unwrap_or_else(|| "15".into())
}

async fn outage_now(proxy: &proxy::Proxy, real: bool, d: Duration) {
    if real {
        postgres_outage(d).await;
    } else {
        proxy.down();
        tokio::time::sleep(d).await;
        proxy.up();
    }
}

/// Stops PostgreSQL for `d`, then starts it and waits until it accepts connections.
pub async fn postgres_outage(d: Duration) {
    let v = pg_cluster();
    let st = Command::new("pg_ctlcluster")
        .args([
            "--skip-systemctl-redirect",
            &v,
            "main",
            "stop",
            "-m",
            "fast",
        ])
        .status()
        .expect("pg_ctlcluster");
    assert!(st.success(), "could not stop PostgreSQL");
    tokio::time::sleep(d).await;
    let st = Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &v, "main", "start"])
        .status()
        .expect("pg_ctlcluster");
    assert!(st.success(), "could not start PostgreSQL");
    for _ in 0..100 {
        if Command::new("pg_isready")
            .args(["-h", "127.0.0.1", "-q"])
            .status()
            .is_ok_and(|s| s.success())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("PostgreSQL did not come back");
}

/// Stops RabbitMQ's application (`rabbitmqctl stop_app`; connections drop, durable queues and
/// persistent messages stay) for `d`, then starts it and waits until it accepts connections.
pub async fn broker_outage(d: Duration) {
    let ctl = |arg: &'static str| async move {
        tokio::process::Command::new("rabbitmqctl")
            .args(["-q", arg])
            .stdout(Stdio::null())
            .status()
            .await
            .expect("rabbitmqctl (needed to restart RabbitMQ)")
    };
    assert!(ctl("stop_app").await.success(), "could not stop RabbitMQ");
    tokio::time::sleep(d).await;
    assert!(ctl("start_app").await.success(), "could not start RabbitMQ");
    for _ in 0..200 {
        if Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("RabbitMQ did not come back");
}

/// One case of the bad-input matrix. Each is sent over the scenario's intake and must be
/// refused with a specific answer: an HTTP status, or a dead letter (RabbitMQ).
#[derive(Clone, Copy, Debug)]
enum BadCase {
    /// No message id at all.
    NoKey,
    /// A 300-character message id.
    LongKey,
    /// A control character (HTTP: a space, which no client library lets through raw) in the id.
    ControlChar,
    /// A message id (HTTP) or tenant header (RabbitMQ) that is not UTF-8.
    InvalidUtf8,
    /// A consumer nobody configured (HTTP only: a queue has one consumer).
    UnknownConsumer,
    /// A body over `max_body_bytes` (4096 here).
    Oversized,
    /// An email whose JSON is cut short.
    TruncatedEmail,
}

impl BadCase {
    fn all(intake: Intake) -> Vec<BadCase> {
        let mut v = vec![
            BadCase::NoKey,
            BadCase::LongKey,
            BadCase::ControlChar,
            BadCase::InvalidUtf8,
            BadCase::Oversized,
            BadCase::TruncatedEmail,
        ];
        if intake == Intake::Http {
            v.push(BadCase::UnknownConsumer);
        }
        v
    }

    fn consumer(self) -> &'static str {
        match self {
            BadCase::TruncatedEmail => "email",
            BadCase::UnknownConsumer => "nosuch",
            _ => "payments",
        }
    }

    fn body(self) -> Vec<u8> {
        match self {
            BadCase::Oversized => vec![b'x'; 8192],
            BadCase::TruncatedEmail => br#"{"to":"a@example.com","subj"#.to_vec(),
            _ => b"{}".to_vec(),
        }
    }

    /// The message id bytes (HTTP `Idempotency-Key`, AMQP `message_id`).
    fn key(self, seq: usize) -> Option<Vec<u8>> {
        match self {
            BadCase::NoKey => None,
            BadCase::LongKey => Some("k".repeat(300).into_bytes()),
            BadCase::ControlChar => Some(format!("ctl\u{1}{seq}").into_bytes()),
            BadCase::InvalidUtf8 => Some(format!("bad{seq}\u{ff}").into_bytes()),
            _ => Some(format!("bad-{seq}").into_bytes()),
        }
    }

    fn http_status(self) -> u16 {
        match self {
            BadCase::UnknownConsumer => 404,
            BadCase::Oversized => 413,
            BadCase::TruncatedEmail => 422,
            _ => 400,
        }
    }
}

#[derive(Clone)]
enum Send_ {
    /// A message (or a duplicate of one): must end acknowledged. `tenant` is `""` for none.
    Message {
        consumer: &'static str,
        tenant: &'static str,
        id: String,
        body: String,
    },
    /// The same key sent twice at the same instant (to two workers; or two publishes).
    Concurrent {
        consumer: &'static str,
        tenant: &'static str,
        id: String,
        body: String,
    },
    /// A used key with another body: must get 422 (HTTP) or be dead-lettered (RabbitMQ).
    Changed { seq: usize, id: String },
    /// Bad input: must be refused.
    Bad { seq: usize, case: BadCase },
}

/// Something the chaos loop did, and when.
type Moment = (chrono::DateTime<chrono::Utc>, String);

/// A message's identity: (tenant, message id).
type Identity = (String, String);

struct Ledger {
    /// Acknowledged identities.
    acked: Mutex<HashSet<Identity>>,
    dup_acks: AtomicUsize,
    mismatch_refusals: AtomicUsize,
    bad_refused: AtomicUsize,
    attempts: AtomicU64,
    /// Sends whose client hung up.
    hung_up: AtomicUsize,
    /// The workers (by index) each identity was sent to over HTTP.
    sent_to: Mutex<HashMap<Identity, u64>>,
    /// Share of HTTP sends that hang up ([`Scenario::hang_ups`]).
    hang_ups: f64,
    seed: u64,
}

/// A seeded generator for one send (so a run replays with its seed, whatever the order the
/// clients take the ledger in).
fn send_rng(seed: u64, key: &[u8], start: usize) -> fastrand::Rng {
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    });
    rng(seed ^ h ^ (start as u64).rotate_left(32))
}

/// Sends until a definite answer: connection errors and 503s are retried on another worker
/// (an at-least-once client). With `may_hang_up`, a share of the attempts (the scenario's
/// `hang_ups`) hang up mid-request instead: no answer, so the client sends again. Returns the
/// final status.
#[allow(clippy::too_many_arguments)]
async fn send(
    c: &reqwest::Client,
    ports: &[u16],
    start: usize,
    consumer: &str,
    key: Option<&[u8]>,
    tenant: &str,
    body: Vec<u8>,
    ledger: &Ledger,
    may_hang_up: bool,
) -> u16 {
    let mut r = send_rng(ledger.seed, key.unwrap_or_default(), start);
    for i in start..start + 2000 {
        let port = ports[i % ports.len()];
        ledger.attempts.fetch_add(1, Ordering::Relaxed);
        if let Some(k) = key {
            let id = (tenant.to_string(), String::from_utf8_lossy(k).into_owned());
            *ledger.sent_to.lock().unwrap().entry(id).or_default() |= 1 << (i % ports.len());
        }
        if may_hang_up
            && ledger.hang_ups > 0.0
            && r.f64() < ledger.hang_ups
            && let Some(k) = key.and_then(|k| std::str::from_utf8(k).ok())
        {
            let mut post = Post::new(consumer, k, body.clone());
            if !tenant.is_empty() {
                post = post.tenant("Tenant-Id", tenant);
            }
            let how = HangUp::random(&mut r);
            if hangup::post_and_hang_up(([127, 0, 0, 1], port).into(), &post, how).await
                != Seen::NotSent
            {
                ledger.hung_up.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(r.u64(10..100))).await;
            continue;
        }
        let mut req = c
            .post(format!("http://127.0.0.1:{port}/v1/messages/{consumer}"))
            .body(body.clone());
        if !tenant.is_empty() {
            req = req.header("Tenant-Id", tenant);
        }
        if let Some(k) = key {
            // Raw bytes: obs-text (0x80-0xff) goes out as is; control characters, which no
            // client library sends, go out by hand.
            match HeaderValue::from_bytes(k) {
                Ok(v) => req = req.header("Idempotency-Key", v),
                Err(_) => match try_raw_post(
                    ([127, 0, 0, 1], port).into(),
                    &format!("/v1/messages/{consumer}"),
                    k,
                    &body,
                )
                .await
                .map(|(status, _)| status)
                {
                    Some(0 | 503) | None => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    Some(status) => return status,
                },
            }
        }
        match req.send().await {
            Ok(r) if r.status().as_u16() == 503 => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(r) => {
                let status = r.status().as_u16();
                if status == 200 {
                    ledger.dup_acks.fetch_add(1, Ordering::Relaxed);
                }
                return status;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("no definite answer for {key:?}");
}

/// The RabbitMQ side of a run: a work queue per consumer (claimd declares them, with a fanout
/// dead-letter exchange `<queue>.dlx` and `<queue>.dead`), deleted at the end.
struct Queues {
    prefix: String,
}

impl Queues {
    fn new() -> Queues {
        Queues {
            prefix: format!("chaos.{}-{:08x}", std::process::id(), fastrand::u32(..)),
        }
    }

    fn queue(&self, consumer: &str) -> String {
        format!("{}.{consumer}", self.prefix)
    }

    /// The `[[consumers]]` keys that make `consumer` read its queue.
    fn consumer_toml(&self, consumer: &str) -> String {
        let q = self.queue(consumer);
        format!(
            "source = \"amqp\"\namqp_url = \"{}\"\nqueue = \"{q}\"\ndead_letter_exchange = \"{q}.dlx\"\nprefetch = 64\ndeclare = true\nmessage_id_header = \"x-message-id\"\n",
            amqp_url()
        )
    }

    /// Ready messages in `consumer`'s queue (and its dead-letter queue).
    async fn ready(&self, conn: &Connection, consumer: &str) -> Option<(u32, u32)> {
        let ch = conn.create_channel().await.ok()?;
        let mut out = [0u32; 2];
        for (i, q) in [
            self.queue(consumer),
            format!("{}.dead", self.queue(consumer)),
        ]
        .iter()
        .enumerate()
        {
            let d = ch
                .queue_declare(
                    q.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .ok()?;
            out[i] = d.message_count();
        }
        let _ = ch.close(200, "ok".into()).await;
        Some((out[0], out[1]))
    }

    /// Takes every dead letter of `consumer` and returns the `chaos-bad` sequence numbers.
    async fn dead_seqs(&self, conn: &Connection, consumer: &str) -> Vec<usize> {
        let ch = conn.create_channel().await.unwrap();
        let dead = format!("{}.dead", self.queue(consumer));
        let mut seqs = Vec::new();
        while let Some(m) = ch
            .basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let seq = m
                .delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("chaos-bad").cloned());
            match seq {
                Some(AMQPValue::LongLongInt(n)) => seqs.push(n as usize),
                other => panic!("a dead letter the harness did not send as bad: {other:?}"),
            }
        }
        let _ = ch.close(200, "ok".into()).await;
        seqs
    }

    async fn delete(&self) {
        let Ok(conn) = Connection::connect(&amqp_url(), ConnectionProperties::default()).await
        else {
            return;
        };
        if let Ok(ch) = conn.create_channel().await {
            for c in ["payments", "email"] {
                let q = self.queue(c);
                for name in [q.clone(), format!("{q}.dead")] {
                    let _ = ch
                        .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                let _ = ch
                    .exchange_delete(
                        format!("{q}.dlx").as_str().into(),
                        ExchangeDeleteOptions::default(),
                    )
                    .await;
            }
        }
        let _ = conn.close(200, "ok".into()).await;
    }
}

impl Drop for Queues {
    /// Deletes the run's queues even when the run panicked (from a plain thread: the run's
    /// runtime may be shutting down). Deleting twice is harmless.
    fn drop(&mut self) {
        let q = Queues {
            prefix: std::mem::take(&mut self.prefix),
        };
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(q.delete());
            std::mem::forget(q);
        })
        .join();
    }
}

/// An at-least-once publisher: persistent messages, publisher confirms, and a publish that
/// was not confirmed (broker down, connection cut, queue not declared yet) is published again.
struct Publisher {
    link: tokio::sync::Mutex<Option<(Connection, Channel)>>,
}

impl Publisher {
    fn new() -> Publisher {
        Publisher {
            link: tokio::sync::Mutex::new(None),
        }
    }

    async fn channel(&self) -> Option<Channel> {
        let mut link = self.link.lock().await;
        if let Some((conn, ch)) = link.as_ref()
            && conn.status().connected()
            && ch.status().connected()
        {
            return Some(ch.clone());
        }
        *link = None;
        let conn = tokio::time::timeout(
            Duration::from_secs(5),
            Connection::connect(&amqp_url(), ConnectionProperties::default()),
        )
        .await
        .ok()?
        .ok()?;
        let ch = conn.create_channel().await.ok()?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .ok()?;
        *link = Some((conn, ch.clone()));
        Some(ch)
    }

    /// Publishes to `queue` until the broker confirms it was queued.
    async fn publish(&self, queue: &str, props: BasicProperties, body: &[u8], ledger: &Ledger) {
        for _ in 0..3000 {
            ledger.attempts.fetch_add(1, Ordering::Relaxed);
            if let Some(ch) = self.channel().await {
                let sent = tokio::time::timeout(Duration::from_secs(10), async {
                    ch.basic_publish(
                        ShortString::from(""),
                        ShortString::from(queue),
                        BasicPublishOptions {
                            mandatory: true,
                            immediate: false,
                        },
                        body,
                        props.clone(),
                    )
                    .await?
                    .await
                })
                .await;
                match sent {
                    // Returned (no such queue yet) or nacked: publish again.
                    Ok(Ok(c)) => {
                        if c.is_ack() && c.take_message().is_none() {
                            return;
                        }
                    }
                    _ => *self.link.lock().await = None,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the broker never confirmed a publish to {queue}");
    }
}

fn rng(seed: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(seed)
}

/// Where the client sends.
#[derive(Clone)]
enum Via {
    Http(Vec<u16>),
    Amqp(Arc<Queues>),
}

fn amqp_props(id: Option<&[u8]>, seq: Option<usize>, tenant: Option<&[u8]>) -> BasicProperties {
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    let mut h = FieldTable::default();
    if let Some(id) = id {
        // In a header, not the `message_id` property: a property is at most 255 bytes, and the
        // matrix needs a longer id.
        h.insert(
            "x-message-id".into(),
            AMQPValue::LongString(LongString::from(id)),
        );
    }
    if let Some(seq) = seq {
        h.insert("chaos-bad".into(), AMQPValue::LongLongInt(seq as i64));
    }
    if let Some(t) = tenant {
        h.insert("tenant".into(), AMQPValue::LongString(LongString::from(t)));
    }
    props.with_headers(h)
}

/// Sends one ledger item and records what the intake answered.
async fn deliver(
    item: Send_,
    via: &Via,
    c: &reqwest::Client,
    publisher: &Publisher,
    n: usize,
    ledger: &Ledger,
    expected_dead: &Mutex<HashSet<usize>>,
) {
    let tenant_bytes = |t: &'static str| (!t.is_empty()).then_some(t.as_bytes());
    match (item, via) {
        (
            Send_::Message {
                consumer,
                tenant,
                id,
                body,
            },
            Via::Http(ports),
        ) => {
            let st = send(
                c,
                ports,
                n,
                consumer,
                Some(id.as_bytes()),
                tenant,
                body.into_bytes(),
                ledger,
                true,
            )
            .await;
            assert!(st == 202 || st == 200, "message {tenant}/{id}: {st}");
            ledger.acked.lock().unwrap().insert((tenant.into(), id));
        }
        (
            Send_::Message {
                consumer,
                tenant,
                id,
                body,
            },
            Via::Amqp(q),
        ) => {
            let props = amqp_props(Some(id.as_bytes()), None, tenant_bytes(tenant));
            publisher
                .publish(&q.queue(consumer), props, body.as_bytes(), ledger)
                .await;
            ledger.acked.lock().unwrap().insert((tenant.into(), id));
        }
        (
            Send_::Concurrent {
                consumer,
                tenant,
                id,
                body,
            },
            Via::Http(ports),
        ) => {
            let key = Some(id.as_bytes());
            let (a, b) = tokio::join!(
                send(
                    c,
                    ports,
                    n,
                    consumer,
                    key,
                    tenant,
                    body.clone().into_bytes(),
                    ledger,
                    true,
                ),
                send(
                    c,
                    ports,
                    n + 1,
                    consumer,
                    key,
                    tenant,
                    body.into_bytes(),
                    ledger,
                    true,
                )
            );
            assert!(
                [200, 202].contains(&a) && [200, 202].contains(&b),
                "{tenant}/{id}: {a} {b}"
            );
            ledger.acked.lock().unwrap().insert((tenant.into(), id));
        }
        (
            Send_::Concurrent {
                consumer,
                tenant,
                id,
                body,
            },
            Via::Amqp(q),
        ) => {
            // Two publishes at once: with three workers consuming, the copies are usually
            // delivered to two of them at the same instant.
            let props = amqp_props(Some(id.as_bytes()), None, tenant_bytes(tenant));
            let queue = q.queue(consumer);
            tokio::join!(
                publisher.publish(&queue, props.clone(), body.as_bytes(), ledger),
                publisher.publish(&queue, props, body.as_bytes(), ledger)
            );
            ledger.acked.lock().unwrap().insert((tenant.into(), id));
        }
        (Send_::Changed { id, .. }, Via::Http(ports)) => {
            let body = b"{\"amount\":-1}".to_vec();
            let key = Some(id.as_bytes());
            let st = send(c, ports, n, "payments", key, "", body, ledger, true).await;
            assert_eq!(st, 422, "changed payload under {id}");
            ledger.mismatch_refusals.fetch_add(1, Ordering::Relaxed);
        }
        (Send_::Changed { seq, id }, Via::Amqp(q)) => {
            expected_dead.lock().unwrap().insert(seq);
            let props = amqp_props(Some(id.as_bytes()), Some(seq), None);
            publisher
                .publish(&q.queue("payments"), props, b"{\"amount\":-1}", ledger)
                .await;
        }
        (Send_::Bad { seq, case }, Via::Http(ports)) => {
            let key = case.key(seq);
            let st = send(
                c,
                ports,
                n,
                case.consumer(),
                key.as_deref(),
                "",
                case.body(),
                ledger,
                false,
            )
            .await;
            assert_eq!(st, case.http_status(), "bad input {case:?}");
            ledger.bad_refused.fetch_add(1, Ordering::Relaxed);
        }
        (Send_::Bad { seq, case }, Via::Amqp(q)) => {
            expected_dead.lock().unwrap().insert(seq);
            let props = match case {
                // The id is fine; the tenant header is not UTF-8.
                BadCase::InvalidUtf8 => amqp_props(
                    Some(format!("badt-{seq}").as_bytes()),
                    Some(seq),
                    Some(&[b't', 0xff, 0xfe]),
                ),
                _ => amqp_props(case.key(seq).as_deref(), Some(seq), None),
            };
            publisher
                .publish(&q.queue(case.consumer()), props, &case.body(), ledger)
                .await;
        }
    }
}

/// The worker configuration of a run.
fn worker_toml(
    s: &Scenario,
    worker_db: &str,
    provider: &str,
    smtp_port: u16,
    queues: Option<&Queues>,
) -> String {
    let source = |consumer: &str| match queues {
        Some(q) => q.consumer_toml(consumer),
        None => "source = \"http\"\n".to_string(),
    };
    let tenant_header = if queues.is_some() {
        "tenant_header = \"tenant\"\n"
    } else {
        ""
    };
    format!(
        r#"
[store]
url = "{worker_db}"
max_connections = 8
[http]
listen = "127.0.0.1:0"
max_body_bytes = 4096
intake_wait = "1s"
[sweeper]
schedule = "* * * * * *"
batch_size = 500
[retention]
keep_terminal_for = "2h"
[run]
shutdown_grace = "2s"
[[consumers]]
name = "payments"
{payments_source}{tenant_header}concurrency = 64
lease = "3s"
max_attempts = 20
redrive_within = "1h"
on_unknown = "{on_unknown}"
key = "{{consumer}}:{{tenant}}:{{message_id}}"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "1s"
status_url = "{provider}/v1/effects/{{key}}"
[[consumers]]
name = "email"
{email_source}concurrency = 16
lease = "3s"
max_attempts = 20
redrive_within = "1h"
on_unknown = "park"
key = "{{message_id}}"
[consumers.effect]
kind = "smtp"
host = "127.0.0.1"
port = {smtp_port}
tls = "none"
message_id_domain = "chaos.claimd"
from = "claimd <noreply@chaos.claimd>"
timeout = "1s"
"#,
        payments_source = source("payments"),
        email_source = source("email"),
        on_unknown = s.on_unknown,
    )
}

/// `None` (skip, reason printed) when the scenario needs RabbitMQ and none answers outside CI.
async fn broker_available(s: &Scenario) -> bool {
    if s.intake != Intake::Amqp {
        return true;
    }
    match Connection::connect(&amqp_url(), ConnectionProperties::default()).await {
        Ok(c) => {
            let _ = c.close(200, "ok".into()).await;
            true
        }
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("RabbitMQ is required under CI=true: {e}");
            }
            eprintln!("SKIPPED: {}: no RabbitMQ ({e})", s.name);
            false
        }
    }
}

/// Runs one scenario against a fresh database `db_url` and returns the checks (`None`: the
/// scenario needs RabbitMQ and there is none, outside CI).
pub async fn run(s: &Scenario, db_url: &str) -> Option<Outcome> {
    if !broker_available(s).await {
        return None;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gate = Gate::start(listener.local_addr().unwrap()).await;
    let provider = format!("http://127.0.0.1:{}", gate.port);
    let sandbox = Sandbox::new(s.provider.clone());
    let served = sandbox.clone();
    tokio::spawn(async move { served.serve(listener, std::future::pending()).await });
    let smtp = SmtpSink::start().await;
    // The SMTP server's door: notes each recipient a worker got as far as naming.
    let smtp_gate = Gate::start(smtp.addr).await;
    let queues = (s.intake == Intake::Amqp).then(|| Arc::new(Queues::new()));

    // Workers reach PostgreSQL through a proxy the chaos loop can cut.
    let proxy = Arc::new(proxy::Proxy::start("127.0.0.1:5432").await);
    let worker_db = db_url.replacen("127.0.0.1:5432", &proxy.addr.to_string(), 1);
    let config = dir.path().join("claimd.toml");
    std::fs::write(
        &config,
        worker_toml(s, &worker_db, &provider, smtp_gate.port, queues.as_deref()),
    )
    .unwrap();
    let store = claimd::store::open(db_url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let mut fleet = Fleet {
        config,
        log: dir.path().join("workers.log"),
        workers: (0..s.workers)
            .map(|_| WorkerProc {
                child: None,
                port: free_port(),
            })
            .collect(),
    };
    for i in 0..s.workers {
        fleet.restart(i).await;
    }

    // The ledger of sends.
    let mut r = rng(s.seed);
    let mut sends = Vec::new();
    let mut duplicates_sent = 0;
    let mut emails = Vec::new();
    let mut two_tenant_ids = Vec::new();
    // Changed payloads go to the first ids (no tenant): two-tenant ids come after them.
    let changed = if s.bad_input {
        (s.messages / 50).max(3)
    } else {
        0
    };
    for m in 0..s.messages + s.emails {
        let (consumer, id, body) = if m < s.messages {
            let body = format!("{{\"amount\":{}}}", r.u32(1..100_000));
            ("payments", format!("m{}-{m}", s.seed), body)
        } else {
            let id = format!("e{}-{m}", s.seed);
            emails.push(id.clone());
            let body = format!(
                "{{\"to\":\"user{m}@example.com\",\"subject\":\"receipt {m}\",\"text\":\"thanks\"}}"
            );
            ("email", id, body)
        };
        // Some payment ids are sent by two tenants with the same body: two messages, two keys.
        let tenants: &[&'static str] = if consumer == "payments"
            && m >= changed
            && s.two_tenants > 0.0
            && r.f64() < s.two_tenants
        {
            two_tenant_ids.push(id.clone());
            &["acme", "globex"]
        } else {
            &[""]
        };
        for tenant in tenants {
            sends.push(Send_::Message {
                consumer,
                tenant,
                id: id.clone(),
                body: body.clone(),
            });
        }
        let tenant = tenants[0];
        if r.f64() < 0.15 {
            duplicates_sent += 1;
            sends.push(Send_::Message {
                consumer,
                tenant,
                id: id.clone(),
                body: body.clone(),
            });
        }
        if r.f64() < 0.03 {
            duplicates_sent += 1; // the second of the pair is a duplicate
            sends.push(Send_::Concurrent {
                consumer,
                tenant,
                id,
                body,
            });
        }
    }
    let mut mismatches_sent = 0;
    let mut bad_sent = 0;
    let mut seq = 0;
    if s.bad_input {
        for k in 0..changed {
            mismatches_sent += 1;
            seq += 1;
            sends.push(Send_::Changed {
                seq,
                id: format!("m{}-{k}", s.seed),
            });
        }
        for _ in 0..(s.messages / 100).max(2) {
            for case in BadCase::all(s.intake) {
                bad_sent += 1;
                seq += 1;
                sends.push(Send_::Bad { seq, case });
            }
        }
    }
    // Changed payloads go after their originals were claimed: a second wave.
    let (mut first, later): (Vec<_>, Vec<_>) = sends
        .into_iter()
        .partition(|x| !matches!(x, Send_::Changed { .. }));
    // Payments, emails, duplicates and bad input interleaved, as traffic arrives (seeded).
    r.shuffle(&mut first);
    let ledger = Arc::new(Ledger {
        acked: Mutex::new(HashSet::new()),
        dup_acks: AtomicUsize::new(0),
        mismatch_refusals: AtomicUsize::new(0),
        bad_refused: AtomicUsize::new(0),
        attempts: AtomicU64::new(0),
        hung_up: AtomicUsize::new(0),
        sent_to: Mutex::new(HashMap::new()),
        hang_ups: s.hang_ups,
        seed: s.seed,
    });
    let expected_dead = Arc::new(Mutex::new(HashSet::new()));
    let via = match &queues {
        Some(q) => Via::Amqp(q.clone()),
        None => Via::Http(fleet.ports()),
    };
    let total_sends = first.len() + later.len();
    // Pace the clients so the send phase lasts about as long as the kills take (~0.4 s each).
    let pace = Duration::from_millis(
        (s.kills as u64 * 400 * s.clients as u64) / total_sends.max(1) as u64,
    );

    // Chaos: kill and restart workers evenly over the send phase; a broker outage a third of
    // the way in, a database outage half way, a provider outage two thirds of the way.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kills_done = Arc::new(AtomicUsize::new(0));
    // What the chaos loop did when, for explaining a claim that ends badly.
    let timeline: Arc<Mutex<Vec<Moment>>> = Arc::default();
    let chaos = {
        let done = done.clone();
        let kills_done = kills_done.clone();
        let kills = s.kills;
        let workers = s.workers;
        let outage = s.db_outage;
        let broker = s.broker_outage;
        let provider_outage = s.provider_outage;
        let gate = gate.clone();
        let real = s.real_db_restart;
        let proxy = proxy.clone();
        let seed = s.seed;
        let timeline = timeline.clone();
        tokio::spawn(async move {
            let note = |what: String| timeline.lock().unwrap().push((chrono::Utc::now(), what));
            let mut r = rng(seed ^ 0x5eed);
            let (mut did_outage, mut did_broker, mut did_provider) = (false, false, false);
            while !done.load(Ordering::SeqCst) && kills_done.load(Ordering::SeqCst) < kills {
                tokio::time::sleep(Duration::from_millis(r.u64(150..600))).await;
                let i = r.usize(0..workers);
                note(format!("SIGKILL worker {i}"));
                fleet.restart(i).await;
                note(format!("worker {i} up again"));
                let k = kills_done.fetch_add(1, Ordering::SeqCst) + 1;
                if let Some(d) = broker
                    && !did_broker
                    && k >= kills / 3
                {
                    did_broker = true;
                    note("broker down".into());
                    broker_outage(d).await;
                    note("broker up".into());
                }
                if let Some(d) = outage
                    && !did_outage
                    && k >= kills / 2
                {
                    did_outage = true;
                    note("database down".into());
                    outage_now(&proxy, real, d).await;
                    note("database up".into());
                }
                if let Some(d) = provider_outage
                    && !did_provider
                    && k >= kills * 2 / 3
                {
                    did_provider = true;
                    note("provider down".into());
                    gate.outage(d).await;
                    note("provider up".into());
                }
            }
            if let Some(d) = broker
                && !did_broker
            {
                broker_outage(d).await;
            }
            if let Some(d) = outage
                && !did_outage
            {
                outage_now(&proxy, real, d).await;
            }
            if let Some(d) = provider_outage
                && !did_provider
            {
                gate.outage(d).await;
            }
            fleet
        })
    };

    let first_ids: HashSet<(&str, String)> = first
        .iter()
        .filter_map(|x| match x {
            Send_::Message { tenant, id, .. } | Send_::Concurrent { tenant, id, .. } => {
                Some((*tenant, id.clone()))
            }
            _ => None,
        })
        .collect();
    for (w, wave) in [first, later].into_iter().enumerate() {
        if w == 1 && queues.is_some() {
            // A broker confirm is not a claim: wait until the first wave is claimed, so a
            // changed payload meets its original's claim, not the other way round.
            wait_claimed(&store, first_ids.len(), Duration::from_secs(300)).await;
        }
        let queue = Arc::new(Mutex::new(wave));
        let mut tasks = Vec::new();
        for t in 0..s.clients {
            let (queue, ledger, via) = (queue.clone(), ledger.clone(), via.clone());
            let expected_dead = expected_dead.clone();
            tasks.push(tokio::spawn(async move {
                let c = reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                let publisher = Publisher::new();
                let mut n = t;
                loop {
                    let Some(item) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    n += 1;
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                    deliver(item, &via, &c, &publisher, n, &ledger, &expected_dead).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    done.store(true, Ordering::SeqCst);
    let mut fleet = chaos.await.unwrap();
    // Every worker up for the final sweeps.
    for i in 0..s.workers {
        if fleet.workers[i]
            .child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
        {
            fleet.restart(i).await;
        }
    }
    let mut dead_seqs = HashSet::new();
    if let Some(q) = &queues {
        wait_drained(q).await;
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .unwrap();
        for c in ["payments", "email"] {
            dead_seqs.extend(q.dead_seqs(&conn, c).await);
        }
        let _ = conn.close(200, "ok".into()).await;
    }
    let settled = wait_settled(&store, Duration::from_secs(120)).await;
    if let Some(q) = &queues {
        // Dead letters the harness expected: all there (any copy), nothing else.
        let expected = expected_dead.lock().unwrap().clone();
        let missing = expected.difference(&dead_seqs).count();
        let unexpected = dead_seqs.difference(&expected).count();
        assert_eq!(unexpected, 0, "dead letters the harness did not expect");
        let refused = expected.len() - missing;
        ledger
            .mismatch_refusals
            .store(refused.min(mismatches_sent), Ordering::Relaxed);
        ledger
            .bad_refused
            .store(refused.saturating_sub(mismatches_sent), Ordering::Relaxed);
        if missing > 0 {
            // Leave the count short: the invariant check names it.
            eprintln!("{missing} bad messages were not dead-lettered");
        }
        q.delete().await;
    }
    let moments = timeline.lock().unwrap().clone();
    let outcome = check(
        s,
        &store,
        &sandbox,
        &smtp,
        [&gate, &smtp_gate],
        &moments,
        &ledger,
        &emails,
        &two_tenant_ids,
        settled,
        Sent {
            total: total_sends,
            duplicates: duplicates_sent,
            mismatches: mismatches_sent,
            bad: bad_sent,
        },
        kills_done.load(Ordering::SeqCst),
        started,
    )
    .await;
    drop(fleet);
    Some(outcome)
}

/// Waits until every queue of the run is empty (nothing ready) twice in a row, a second apart.
async fn wait_drained(q: &Queues) {
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let end = Instant::now() + Duration::from_secs(300);
    let mut empty_twice = 0;
    while Instant::now() < end && empty_twice < 2 {
        let mut empty = true;
        for c in ["payments", "email"] {
            match q.ready(&conn, c).await {
                Some((0, _)) => {}
                _ => empty = false,
            }
        }
        empty_twice = if empty { empty_twice + 1 } else { 0 };
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let _ = conn.close(200, "ok".into()).await;
}

/// Waits until the store holds at least `n` claims.
async fn wait_claimed(store: &Store, n: usize, within: Duration) {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Ok(counts) = store.counts(None).await {
            let claims: i64 = counts
                .iter()
                .map(|c| c.completed + c.failed + c.needs_attention + c.started)
                .sum();
            if claims as usize >= n {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn wait_settled(store: &Store, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if store
            .open_counts()
            .await
            .map(|c| c.iter().all(|c| c.started == 0))
            .unwrap_or(false)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// What the ledger sent, by kind.
struct Sent {
    total: usize,
    duplicates: usize,
    mismatches: usize,
    bad: usize,
}

#[allow(clippy::too_many_arguments)]
async fn check(
    s: &Scenario,
    store: &Store,
    sandbox: &Sandbox,
    smtp: &SmtpSink,
    [provider_gate, smtp_gate]: [&Gate; 2],
    timeline: &[Moment],
    ledger: &Ledger,
    emails: &[String],
    two_tenant_ids: &[String],
    _settled: bool,
    sent: Sent,
    kills: usize,
    started: Instant,
) -> Outcome {
    let claims = store
        .list(&ClaimFilter {
            limit: 10_000_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let by_id: HashMap<(&str, &str), &claimd::claim::Claim> = claims
        .iter()
        .map(|c| ((c.tenant.as_str(), c.message_id.as_str()), c))
        .collect();
    let acked = ledger.acked.lock().unwrap().clone();
    let lost = acked
        .iter()
        .filter(|(t, id)| !by_id.contains_key(&(t.as_str(), id.as_str())))
        .count();
    let count = |st: claimd::claim::ClaimState| claims.iter().filter(|c| c.state == st).count();
    // Why claims wait for a person, by consumer and reason (printed: a long run's table alone
    // does not say).
    let mut parked: HashMap<(String, String), usize> = HashMap::new();
    for c in claims
        .iter()
        .filter(|c| c.state == claimd::claim::ClaimState::NeedsAttention)
    {
        let why: String = c
            .last_error
            .as_deref()
            .unwrap_or("")
            .chars()
            .take(90)
            .collect();
        *parked.entry((c.consumer.clone(), why)).or_default() += 1;
    }
    for ((consumer, why), n) in &parked {
        eprintln!("needs_attention: {n} {consumer}: {why}");
    }
    let effects = sandbox.effects();
    let applied: HashMap<&str, u64> = effects
        .iter()
        .map(|e| (e.key.as_str(), e.applied))
        .collect();
    // Two tenants, one id: each (tenant, id) applied under a key of its own.
    let two_tenant_misapplied = two_tenant_ids
        .iter()
        .map(|id| {
            let mine = ["acme", "globex"].map(|t| by_id.get(&(t, id.as_str())));
            match mine {
                [Some(a), Some(b)] if a.idem_key != b.idem_key => [a, b]
                    .iter()
                    .filter(|c| !applied.contains_key(c.idem_key.as_str()))
                    .count(),
                [Some(_), Some(_)] => 2, // one key for two payments
                [a, b] => a.is_none() as usize + b.is_none() as usize,
            }
        })
        .sum();
    let completed_unapplied = claims
        .iter()
        .filter(|c| c.consumer == "payments" && c.state == claimd::claim::ClaimState::Completed)
        .filter(|c| !applied.contains_key(c.idem_key.as_str()))
        .count();
    // Parked, and its key (payments) or recipient (emails) never reached the provider's door.
    let (keys_seen, rcpts_seen) = (provider_gate.seen(), smtp_gate.seen());
    let never_sent: Vec<&claimd::claim::Claim> = claims
        .iter()
        .filter(|c| c.state == claimd::claim::ClaimState::NeedsAttention)
        .filter(|c| {
            if c.consumer == "email" {
                // Email `e{seed}-{m}` goes to `user{m}@example.com` (list() carries no payloads).
                let m = c.message_id.rsplit('-').next().unwrap_or_default();
                !rcpts_seen.contains(&format!("user{m}@example.com"))
            } else {
                !keys_seen.contains(&c.idem_key)
            }
        })
        .collect();
    // A worker SIGKILLed between a claim's commit and its first byte to the provider leaves a
    // claim that nobody can know was never sent: parked under `park`, rightly. Such a claim was
    // received just before a kill of a worker it was sent to (HTTP: the ledger knows which;
    // RabbitMQ: any worker may have taken it). Anything else parked unsent is a claim orphaned
    // while its worker lived.
    let sent_to = ledger.sent_to.lock().unwrap().clone();
    let at_kill = |c: &claimd::claim::Claim| {
        let workers = match s.intake {
            Intake::Http => sent_to
                .get(&(c.tenant.clone(), c.message_id.clone()))
                .copied()
                .unwrap_or(0),
            Intake::Amqp => u64::MAX,
        };
        timeline.iter().any(|(t, what)| {
            let ms = (*t - c.received_utc).num_milliseconds();
            what.strip_prefix("SIGKILL worker ")
                .and_then(|i| i.parse::<u32>().ok())
                .is_some_and(|i| workers & (1 << i) != 0 && (-50..=250).contains(&ms))
        })
    };
    let parked_never_sent_at_kill = never_sent.iter().filter(|c| at_kill(c)).count();
    // Every unexplained one, then a few at a kill.
    let (at, orphaned): (Vec<&&claimd::claim::Claim>, Vec<_>) =
        never_sent.iter().partition(|c| at_kill(c));
    for c in orphaned.into_iter().chain(at.into_iter().take(10)) {
        // The chaos around the moment it was received (database clock, same host).
        let near: Vec<String> = timeline
            .iter()
            .filter(|(t, what)| {
                let ms = (*t - c.received_utc).num_milliseconds();
                ms.abs() < 1000 || (what.ends_with(" down") && (-30_000..0).contains(&ms))
            })
            .map(|(t, what)| format!("{:+}ms {what}", (*t - c.received_utc).num_milliseconds()))
            .collect();
        eprintln!(
            "parked, never sent{}: {} {} attempt {}: {}; chaos near its receipt: {}",
            if at_kill(c) { " (at a kill)" } else { "" },
            c.consumer,
            c.message_id,
            c.attempt,
            c.last_error.as_deref().unwrap_or(""),
            near.join(", ")
        );
    }
    let counts = store.counts(None).await.unwrap();
    let total = |f: fn(&claimd::store::ConsumerCounts) -> i64| counts.iter().map(f).sum::<i64>();
    // Emails: copies the sink received per Message-ID.
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in smtp.received() {
        if let Some(id) = r.message_id {
            *per_id.entry(id).or_default() += 1;
        }
    }
    Outcome {
        name: s.name.clone(),
        via_broker: s.intake == Intake::Amqp,
        sent: sent.total,
        acknowledged: acked.len(),
        completed: count(claimd::claim::ClaimState::Completed),
        failed: count(claimd::claim::ClaimState::Failed),
        needs_attention: count(claimd::claim::ClaimState::NeedsAttention),
        needs_attention_emails: parked
            .iter()
            .filter(|((c, _), _)| c == "email")
            .map(|(_, n)| n)
            .sum(),
        max_applied_per_key: effects.iter().map(|e| e.applied).max().unwrap_or(0),
        keys_applied: effects.len(),
        lost,
        stuck_after_sweep: total(|c| c.started) as usize,
        duplicates_sent: sent.duplicates,
        duplicates_counted: total(|c| c.duplicates),
        mismatches_sent: sent.mismatches,
        mismatches_counted: total(|c| c.payload_mismatches),
        mismatches_refused: ledger.mismatch_refusals.load(Ordering::Relaxed),
        bad_refused: ledger.bad_refused.load(Ordering::Relaxed),
        bad_sent: sent.bad,
        dead_lettered: total(|c| c.dead_lettered),
        emails_acked: emails
            .iter()
            .filter(|id| acked.contains(&(String::new(), id.to_string())))
            .count(),
        emails_received: per_id.len(),
        emails_completed_unreceived: claims
            .iter()
            .filter(|c| c.consumer == "email" && c.state == claimd::claim::ClaimState::Completed)
            .filter(|c| !per_id.contains_key(&format!("<{}@chaos.claimd>", c.idem_key)))
            .count(),
        max_emails_per_id: per_id.values().copied().max().unwrap_or(0),
        hung_up: ledger.hung_up.load(Ordering::Relaxed),
        two_tenant_ids: two_tenant_ids.len(),
        two_tenant_misapplied,
        completed_unapplied,
        parked_never_sent: never_sent.len(),
        parked_never_sent_at_kill,
        kills,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// The invariants every scenario must hold (at a provider that honours keys).
pub fn assert_invariants(o: &Outcome, honours_keys: bool) {
    assert_eq!(o.lost, 0, "acknowledged messages without a claim: {o:?}");
    assert_eq!(
        o.two_tenant_misapplied, 0,
        "a (tenant, id) sent by two tenants was not applied under a key of its own: {o:?}"
    );
    assert_eq!(
        o.completed_unapplied, 0,
        "a payment settled completed that the provider never applied: {o:?}"
    );
    assert_eq!(
        o.parked_never_sent - o.parked_never_sent_at_kill,
        0,
        "claims parked for a person that never reached the provider, their worker alive: {o:?}"
    );
    assert_eq!(
        o.stuck_after_sweep, 0,
        "claims still started after the final sweeps: {o:?}"
    );
    if honours_keys {
        assert!(o.max_applied_per_key <= 1, "a key was applied twice: {o:?}");
    }
    assert_eq!(
        o.completed + o.failed + o.needs_attention,
        o.acknowledged,
        "every acknowledged message ends in a state: {o:?}"
    );
    assert!(
        o.duplicates_counted as usize >= o.duplicates_sent,
        "every duplicate sent was recognised: {o:?}"
    );
    assert!(
        o.mismatches_counted as usize >= o.mismatches_sent,
        "every changed payload was counted: {o:?}"
    );
    assert_eq!(
        o.bad_refused, o.bad_sent,
        "every bad input refused with its status (HTTP) or dead-lettered (RabbitMQ): {o:?}"
    );
    assert_eq!(
        o.mismatches_refused, o.mismatches_sent,
        "every changed payload refused: {o:?}"
    );
    assert!(
        !o.via_broker || o.dead_lettered as usize >= o.bad_sent + o.mismatches_sent,
        "the store counted every dead letter: {o:?}"
    );
    assert_eq!(
        o.emails_completed_unreceived, 0,
        "an email settled completed that the SMTP server never received: {o:?}"
    );
    assert!(
        o.max_emails_per_id <= 1,
        "an email was delivered twice under one Message-ID: {o:?}"
    );
    assert!(
        o.emails_received <= o.emails_acked,
        "the sink received an email nobody sent: {o:?}"
    );
}
