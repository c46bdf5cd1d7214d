//! The fault-injection harness: real `claimd run` processes on one PostgreSQL database, the
//! sandbox provider in this process, a client that sends a ledger of messages (new, duplicate,
//! concurrent duplicate, changed payload, bad input) at least once, and a chaos loop that
//! SIGKILLs and restarts workers and can stop PostgreSQL. At the end it checks the store and
//! the provider against the ledger and prints the table.
//!
//! Used by `tests/reliability.rs` (short, in CI) and `examples/chaos.rs` (long runs).
#![allow(dead_code)]

use crate::common::{claimd_bin, free_port, proxy};

use claimd::sandbox::{Sandbox, SandboxOptions};
use claimd::store::{ClaimFilter, Store};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one run does.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name in the table.
    pub name: String,
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
}

/// The end-of-run checks.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub name: String,
    pub sent: usize,
    pub acknowledged: usize,
    pub completed: usize,
    pub failed: usize,
    pub needs_attention: usize,
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
    pub kills: usize,
    pub seconds: f64,
}

impl Outcome {
    pub fn header() -> String {
        "| scenario | sent | acked | completed | failed | attention | max applied/key | lost | stuck | dups sent/counted | mismatches sent/counted | bad refused/sent | kills | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|".into()
    }
    pub fn row(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {}/{} | {}/{} | {} | {:.0} |",
            self.name,
            self.sent,
            self.acknowledged,
            self.completed,
            self.failed,
            self.needs_attention,
            self.max_applied_per_key,
            self.lost,
            self.stuck_after_sweep,
            self.duplicates_sent,
            self.duplicates_counted,
            self.mismatches_sent,
            self.mismatches_counted,
            self.bad_refused,
            self.bad_sent,
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

#[derive(Clone)]
enum Send_ {
    /// A message (or a duplicate of one): must end acknowledged.
    Message { id: String, body: String },
    /// The same key sent to two workers at the same instant.
    Concurrent { id: String, body: String },
    /// A used key with another body: must get 422.
    Changed { id: String },
    /// Bad input: must be refused with this status.
    Bad {
        key: Option<String>,
        consumer: &'static str,
        body: Vec<u8>,
        want: u16,
    },
}

struct Ledger {
    acked: Mutex<HashSet<String>>,
    dup_acks: AtomicUsize,
    mismatch_refusals: AtomicUsize,
    bad_refused: AtomicUsize,
    attempts: AtomicU64,
}

/// Sends until a definite answer: connection errors and 503s are retried on another worker
/// (an at-least-once client). Returns the final status.
async fn send(
    c: &reqwest::Client,
    ports: &[u16],
    start: usize,
    consumer: &str,
    key: Option<&str>,
    body: Vec<u8>,
    ledger: &Ledger,
) -> u16 {
    for i in start..start + 2000 {
        let port = ports[i % ports.len()];
        ledger.attempts.fetch_add(1, Ordering::Relaxed);
        let mut req = c
            .post(format!("http://127.0.0.1:{port}/v1/messages/{consumer}"))
            .body(body.clone());
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
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

fn rng(seed: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(seed)
}

/// Runs one scenario against a fresh database `db_url` and returns the checks.
pub async fn run(s: &Scenario, db_url: &str) -> Outcome {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    let sandbox = Sandbox::new(s.provider.clone());
    let served = sandbox.clone();
    tokio::spawn(async move { served.serve(listener, std::future::pending()).await });

    // Workers reach PostgreSQL through a proxy the chaos loop can cut.
    let proxy = Arc::new(proxy::Proxy::start("127.0.0.1:5432").await);
    let worker_db = db_url.replacen("127.0.0.1:5432", &proxy.addr.to_string(), 1);
    let config = dir.path().join("claimd.toml");
    std::fs::write(
        &config,
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
source = "http"
concurrency = 64
lease = "3s"
max_attempts = 20
redrive_within = "1h"
on_unknown = "{}"
key = "{{consumer}}:{{tenant}}:{{message_id}}"
[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "1s"
status_url = "{provider}/v1/effects/{{key}}"
"#,
            s.on_unknown
        ),
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
    for m in 0..s.messages {
        let id = format!("m{}-{m}", s.seed);
        let body = format!("{{\"amount\":{}}}", r.u32(1..100_000));
        sends.push(Send_::Message {
            id: id.clone(),
            body: body.clone(),
        });
        if r.f64() < 0.15 {
            duplicates_sent += 1;
            sends.push(Send_::Message {
                id: id.clone(),
                body: body.clone(),
            });
        }
        if r.f64() < 0.03 {
            duplicates_sent += 1; // the second of the pair is a duplicate
            sends.push(Send_::Concurrent {
                id: id.clone(),
                body,
            });
        }
    }
    let mut mismatches_sent = 0;
    let mut bad_sent = 0;
    if s.bad_input {
        for k in 0..(s.messages / 50).max(3) {
            mismatches_sent += 1;
            sends.push(Send_::Changed {
                id: format!("m{}-{k}", s.seed),
            });
        }
        for _ in 0..(s.messages / 100).max(2) {
            bad_sent += 5;
            sends.push(Send_::Bad {
                key: None,
                consumer: "payments",
                body: b"{}".to_vec(),
                want: 400,
            });
            sends.push(Send_::Bad {
                key: Some("k".repeat(300)),
                consumer: "payments",
                body: b"{}".to_vec(),
                want: 400,
            });
            sends.push(Send_::Bad {
                key: Some("sp ace".into()),
                consumer: "payments",
                body: b"{}".to_vec(),
                want: 400,
            });
            sends.push(Send_::Bad {
                key: Some("x1".into()),
                consumer: "nosuch",
                body: b"{}".to_vec(),
                want: 404,
            });
            sends.push(Send_::Bad {
                key: Some("x2".into()),
                consumer: "payments",
                body: vec![b'x'; 8192],
                want: 413,
            });
        }
    }
    // Changed payloads go after their originals: keep order stable by sending in waves.
    let (first, later): (Vec<_>, Vec<_>) = sends
        .into_iter()
        .partition(|x| !matches!(x, Send_::Changed { .. }));
    let ledger = Arc::new(Ledger {
        acked: Mutex::new(HashSet::new()),
        dup_acks: AtomicUsize::new(0),
        mismatch_refusals: AtomicUsize::new(0),
        bad_refused: AtomicUsize::new(0),
        attempts: AtomicU64::new(0),
    });
    let ports = fleet.ports();
    let total_sends = first.len() + later.len();
    // Pace the clients so the send phase lasts about as long as the kills take (~0.4 s each).
    let pace = Duration::from_millis(
        (s.kills as u64 * 400 * s.clients as u64) / total_sends.max(1) as u64,
    );

    // Chaos: kill and restart workers evenly over the send phase; maybe a database outage.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kills_done = Arc::new(AtomicUsize::new(0));
    let chaos = {
        let done = done.clone();
        let kills_done = kills_done.clone();
        let kills = s.kills;
        let workers = s.workers;
        let outage = s.db_outage;
        let real = s.real_db_restart;
        let proxy = proxy.clone();
        let seed = s.seed;
        tokio::spawn(async move {
            let mut r = rng(seed ^ 0x5eed);
            let mut did_outage = false;
            while !done.load(Ordering::SeqCst) && kills_done.load(Ordering::SeqCst) < kills {
                tokio::time::sleep(Duration::from_millis(r.u64(150..600))).await;
                let i = r.usize(0..workers);
                fleet.restart(i).await;
                let k = kills_done.fetch_add(1, Ordering::SeqCst) + 1;
                if let Some(d) = outage
                    && !did_outage
                    && k >= kills / 2
                {
                    did_outage = true;
                    outage_now(&proxy, real, d).await;
                }
            }
            if let Some(d) = outage
                && !did_outage
            {
                outage_now(&proxy, real, d).await;
            }
            fleet
        })
    };

    for wave in [first, later] {
        let queue = Arc::new(Mutex::new(wave));
        let mut tasks = Vec::new();
        for t in 0..s.clients {
            let queue = queue.clone();
            let ledger = ledger.clone();
            let ports = ports.clone();
            tasks.push(tokio::spawn(async move {
                let c = reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                let mut n = t;
                loop {
                    let Some(item) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    n += 1;
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                    match item {
                        Send_::Message { id, body } => {
                            let st = send(
                                &c,
                                &ports,
                                n,
                                "payments",
                                Some(&id),
                                body.into_bytes(),
                                &ledger,
                            )
                            .await;
                            assert!(st == 202 || st == 200, "message {id}: {st}");
                            ledger.acked.lock().unwrap().insert(id);
                        }
                        Send_::Concurrent { id, body } => {
                            let (a, b) = tokio::join!(
                                send(
                                    &c,
                                    &ports,
                                    n,
                                    "payments",
                                    Some(&id),
                                    body.clone().into_bytes(),
                                    &ledger
                                ),
                                send(
                                    &c,
                                    &ports,
                                    n + 1,
                                    "payments",
                                    Some(&id),
                                    body.clone().into_bytes(),
                                    &ledger
                                )
                            );
                            assert!(
                                [200, 202].contains(&a) && [200, 202].contains(&b),
                                "{id}: {a} {b}"
                            );
                            ledger.acked.lock().unwrap().insert(id);
                        }
                        Send_::Changed { id } => {
                            let st = send(
                                &c,
                                &ports,
                                n,
                                "payments",
                                Some(&id),
                                b"{\"amount\":-1}".to_vec(),
                                &ledger,
                            )
                            .await;
                            assert_eq!(st, 422, "changed payload under {id}");
                            ledger.mismatch_refusals.fetch_add(1, Ordering::Relaxed);
                        }
                        Send_::Bad {
                            key,
                            consumer,
                            body,
                            want,
                        } => {
                            let st =
                                send(&c, &ports, n, consumer, key.as_deref(), body, &ledger).await;
                            assert_eq!(st, want, "bad input {key:?} to {consumer}");
                            ledger.bad_refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
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
    let settled = wait_settled(&store, Duration::from_secs(120)).await;
    let outcome = check(
        s,
        &store,
        &sandbox,
        &ledger,
        settled,
        total_sends,
        duplicates_sent,
        mismatches_sent,
        bad_sent,
        kills_done.load(Ordering::SeqCst),
        started,
    )
    .await;
    drop(fleet);
    outcome
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

#[allow(clippy::too_many_arguments)]
async fn check(
    s: &Scenario,
    store: &Store,
    sandbox: &Sandbox,
    ledger: &Ledger,
    _settled: bool,
    sent: usize,
    duplicates_sent: usize,
    mismatches_sent: usize,
    bad_sent: usize,
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
    let by_id: HashMap<&str, &claimd::claim::Claim> =
        claims.iter().map(|c| (c.message_id.as_str(), c)).collect();
    let acked = ledger.acked.lock().unwrap().clone();
    let lost = acked
        .iter()
        .filter(|id| !by_id.contains_key(id.as_str()))
        .count();
    let count = |st: claimd::claim::ClaimState| claims.iter().filter(|c| c.state == st).count();
    let effects = sandbox.effects();
    let counts = store.counts(None).await.unwrap();
    let c = counts.first().cloned().unwrap_or_default();
    Outcome {
        name: s.name.clone(),
        sent,
        acknowledged: acked.len(),
        completed: count(claimd::claim::ClaimState::Completed),
        failed: count(claimd::claim::ClaimState::Failed),
        needs_attention: count(claimd::claim::ClaimState::NeedsAttention),
        max_applied_per_key: effects.iter().map(|e| e.applied).max().unwrap_or(0),
        keys_applied: effects.len(),
        lost,
        stuck_after_sweep: c.started as usize,
        duplicates_sent,
        duplicates_counted: c.duplicates,
        mismatches_sent,
        mismatches_counted: c.payload_mismatches,
        bad_refused: ledger.bad_refused.load(Ordering::Relaxed),
        bad_sent,
        kills,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// The invariants every scenario must hold (at a provider that honours keys).
pub fn assert_invariants(o: &Outcome, honours_keys: bool) {
    assert_eq!(o.lost, 0, "acknowledged messages without a claim: {o:?}");
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
        "every bad input refused with its status: {o:?}"
    );
}
