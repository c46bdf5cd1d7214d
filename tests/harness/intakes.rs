//! The other ways in, beside HTTP and RabbitMQ: consumer `notify` reads NATS JetStream (a
//! private `nats-server` the run SIGKILLs and starts again half way), consumer `events` takes
//! CloudEvents over HTTP (binary and structured content modes, any worker) and producers'
//! enqueues (`claimd.enqueue` inside the producer's own transaction beside the producer's own
//! row: some transactions rolled back, some clients gone before their commit). Both consumers
//! take their backlogs round-robin across four tenants (`fairness = "tenant"`) and pace the
//! provider per tenant (`rate_limit_key = "{tenant}"`).
//!
//! Checked at the end: every acknowledged message (the stream's publish acknowledgement, a
//! `202`/`200`, a committed transaction) has its claim `completed` and its key applied once;
//! a producer's row exists if and only if its claim does; no key applied that nobody
//! acknowledged (a rolled-back or abandoned enqueue).

use super::*;
use crate::common::nats::{PrivateServer, TestStream, headers};
use claimd::domain::claim::ClaimState;
use sqlx::Connection;

/// The tenants of both consumers, the first one busiest.
const TENANTS: [&str; 4] = ["big", "t1", "t2", "t3"];

/// The source of every CloudEvent (the message id is `<source>|<id>`).
const CE_SOURCE: &str = "https://shop.chaos/orders";

/// The producer's own table: one row per order it committed.
const PRODUCER_TABLE: &str =
    "CREATE TABLE chaos_producer_orders (id TEXT PRIMARY KEY, tenant TEXT NOT NULL)";

/// The NATS server, its streams, and the producers' database.
pub(super) struct Intakes {
    server: Arc<Mutex<PrivateServer>>,
    stream: TestStream,
    /// The run's seed: which tenant sends what, which enqueue commits.
    seed: u64,
    _dir: tempfile::TempDir,
}

/// What was sent and acknowledged on each way in.
#[derive(Debug, Default)]
pub(super) struct IntakeSends {
    /// (tenant, message id) acknowledged, per consumer.
    nats_acked: Mutex<HashSet<(String, String)>>,
    ce_acked: Mutex<HashSet<(String, String)>>,
    enqueue_committed: Mutex<HashSet<(String, String)>>,
    /// Enqueues rolled back, or whose client dropped its connection before the commit.
    enqueue_abandoned: Mutex<HashSet<(String, String)>>,
    /// Publishes or posts sent again after no answer (server restarting, worker killed).
    retried: AtomicUsize,
    /// Times the NATS server was killed and started again.
    nats_restarts: AtomicUsize,
}

/// The checks of the other ways in.
#[derive(Debug, Clone, Copy, Default)]
pub struct IntakeCheck {
    /// Acknowledged over NATS, CloudEvents; committed by producers; enqueues abandoned
    /// (rolled back or the client gone).
    pub nats: usize,
    pub cloudevents: usize,
    pub enqueued: usize,
    pub abandoned: usize,
    pub nats_restarts: usize,
    /// Acknowledged (or committed) without a `completed` claim.
    pub not_completed: usize,
    /// A key applied twice, or a completed claim whose key was never applied.
    pub doubled: usize,
    pub completed_unapplied: usize,
    /// A key applied (or a claim present) that nobody acknowledged: an abandoned enqueue.
    pub unacked_applied: usize,
    /// A producer's row without its claim, or an enqueued claim without its row.
    pub row_without_claim: usize,
    pub claim_without_row: usize,
}

impl Intakes {
    /// Starts the private NATS server and its streams; `None` outside CI when `nats-server`
    /// is missing (skipped with a reason by the server's start).
    pub(super) async fn start(db_url: &str, seed: u64) -> Option<Intakes> {
        let dir = tempfile::tempdir().unwrap();
        let server = PrivateServer::start(dir.path())?;
        let stream = TestStream::on(&server.url, "chaos").await?;
        let pool = sqlx::PgPool::connect(db_url).await.unwrap();
        sqlx::query(PRODUCER_TABLE).execute(&pool).await.unwrap();
        pool.close().await;
        Some(Intakes {
            server: Arc::new(Mutex::new(server)),
            stream,
            seed,
            _dir: dir,
        })
    }

    /// The `notify` (NATS) and `events` (HTTP: CloudEvents and enqueue) consumers.
    pub(super) fn consumer_toml(&self, provider: &str) -> String {
        let effect = |path: &str| {
            format!(
                "[consumers.effect]\nkind = \"http\"\nurl = \"{provider}/v1/{path}\"\ntimeout = \"1s\"\nstatus_url = \"{provider}/v1/effects/{{key}}\"\nrate_limit = \"100/s\"\nrate_limit_key = \"{{tenant}}\"\n"
            )
        };
        let extra = format!(
            "key = \"{{consumer}}:{{tenant}}:{{message_id}}\"\nmax_attempts = 20\nlease = \"{WORKER_LEASE_MS}ms\"\nfairness = \"tenant\"\nconcurrency = 16\nack_wait = \"3s\"\n"
        );
        let nats = self
            .stream
            .consumer_toml("notify", &extra, &effect("notify"));
        let http = format!(
            "\n[[consumers]]\nname = \"events\"\nsource = \"http\"\n{}redrive_within = \"1h\"\n{}",
            extra.replace("ack_wait = \"3s\"\n", ""),
            effect("events")
        );
        nats + &http
    }

    /// Sends `n` messages on each way in, spread over `span` and in step with the ledger; the
    /// NATS server is killed and started again when half the ledger is delivered. Returns what was acknowledged.
    pub(super) fn drive(
        self: &Arc<Self>,
        n: usize,
        ports: Vec<u16>,
        db_url: String,
        span: Duration,
        share: LedgerShare,
        timeline: Arc<Mutex<Vec<Moment>>>,
    ) -> tokio::task::JoinHandle<Arc<IntakeSends>> {
        let (me, seed) = (self.clone(), self.seed);
        tokio::spawn(async move {
            let sent = Arc::new(IntakeSends::default());
            let pace = span.div_f64(n.max(1) as f64);
            let restart = {
                let (server, sent, share) = (me.server.clone(), sent.clone(), share.clone());
                tokio::spawn(async move {
                    keep_pace(&share, 0.5).await;
                    timeline
                        .lock()
                        .unwrap()
                        .push((chrono::Utc::now(), "NATS server SIGKILLed".into()));
                    tokio::task::spawn_blocking(move || server.lock().unwrap().restart())
                        .await
                        .unwrap();
                    sent.nats_restarts.fetch_add(1, Ordering::Relaxed);
                    timeline
                        .lock()
                        .unwrap()
                        .push((chrono::Utc::now(), "NATS server up".into()));
                })
            };
            tokio::join!(
                me.publish_all(n, seed, pace, &share, &sent),
                post_cloudevents(n, seed, pace, &share, &ports, &sent),
                produce(n, seed, pace, &share, &db_url, &sent),
            );
            restart.await.unwrap();
            sent
        })
    }

    /// Publishes `n` messages to the stream, each until the server acknowledges it.
    async fn publish_all(
        &self,
        n: usize,
        seed: u64,
        pace: Duration,
        share: &LedgerShare,
        sent: &IntakeSends,
    ) {
        let mut r = rng(seed ^ 0x0a75);
        for k in 0..n {
            tokio::time::sleep(pace).await;
            keep_pace(share, k as f64 / n as f64).await;
            let (tenant, id) = (pick_tenant(&mut r), format!("n{seed}-{k}"));
            let body = format!("{{\"n\":{k},\"amount\":{}}}", r.u32(1..100_000));
            let hs = headers(&[
                ("Nats-Msg-Id", &id),
                ("Tenant-Id", tenant),
                ("Content-Type", "application/json"),
            ]);
            loop {
                let publish = self.stream.js.publish_with_headers(
                    self.stream.subject.clone(),
                    hs.clone(),
                    body.clone().into_bytes().into(),
                );
                let acked = tokio::time::timeout(Duration::from_secs(5), async {
                    publish.await.ok()?.await.ok()
                })
                .await;
                if matches!(acked, Ok(Some(_))) {
                    break;
                }
                sent.retried.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            sent.nats_acked.lock().unwrap().insert((tenant.into(), id));
        }
    }

    /// The notify consumer's durable still holding messages (none once all are claimed).
    pub(super) async fn unacknowledged(&self) -> u64 {
        self.stream.unacknowledged("claimd-notify").await
    }
}

impl IntakeSends {
    /// Every (tenant, message id) acknowledged or committed, on every way in.
    pub(super) fn acknowledged(&self) -> Vec<(String, String)> {
        [&self.nats_acked, &self.ce_acked, &self.enqueue_committed]
            .iter()
            .flat_map(|s| s.lock().unwrap().clone())
            .collect()
    }
}

/// A tenant, the first one half the time.
fn pick_tenant(r: &mut fastrand::Rng) -> &'static str {
    match r.bool() {
        true => TENANTS[0],
        false => TENANTS[r.usize(1..TENANTS.len())],
    }
}

/// Posts `n` CloudEvents to `/v1/events/events`, binary and structured in turn, each until a
/// worker answers `202` or `200`.
async fn post_cloudevents(
    n: usize,
    seed: u64,
    pace: Duration,
    share: &LedgerShare,
    ports: &[u16],
    sent: &IntakeSends,
) {
    let c = claimd::provider::tls::http_client_builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut r = rng(seed ^ 0x0ce0);
    for k in 0..n {
        tokio::time::sleep(pace).await;
        keep_pace(share, k as f64 / n as f64).await;
        let (tenant, id) = (pick_tenant(&mut r), format!("ce{seed}-{k}"));
        let data = format!("{{\"n\":{k},\"amount\":{}}}", r.u32(1..100_000));
        let mut i = k;
        loop {
            i += 1;
            let url = format!(
                "http://127.0.0.1:{}/v1/events/events",
                ports[i % ports.len()]
            );
            let req = match k % 2 {
                0 => c
                    .post(url)
                    .header("ce-specversion", "1.0")
                    .header("ce-id", &id)
                    .header("ce-source", CE_SOURCE)
                    .header("ce-type", "order.paid")
                    .header("content-type", "application/json")
                    .body(data.clone()),
                _ => c
                    .post(url)
                    .header("content-type", "application/cloudevents+json")
                    .body(format!(
                        "{{\"specversion\":\"1.0\",\"id\":\"{id}\",\"source\":\"{CE_SOURCE}\",\"type\":\"order.paid\",\"data\":{data}}}"
                    )),
            };
            // Priorities meet fairness and the pickup: a third each low, plain and high.
            let priority = [-10, 0, 50][k % 3].to_string();
            match req
                .header("Tenant-Id", tenant)
                .header("Message-Priority", priority)
                .send()
                .await
            {
                Ok(a) if matches!(a.status().as_u16(), 200 | 202) => break,
                Ok(a) if a.status().as_u16() == 503 => {}
                Ok(a) => panic!("CloudEvent {id}: {} {:?}", a.status(), a.text().await),
                Err(_) => {}
            }
            sent.retried.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let message_id = format!("{CE_SOURCE}|{id}");
        sent.ce_acked
            .lock()
            .unwrap()
            .insert((tenant.into(), message_id));
    }
}

/// What a producer does with one order's transaction.
enum Ending {
    Commit,
    Rollback,
    /// The client's connection is closed before the commit (no `ROLLBACK` sent).
    Vanish,
}

/// `n` producer transactions straight to the server (not through the workers' proxy): a row
/// of the producer's own and `claimd.enqueue` for it, then commit (three in four), roll back
/// or vanish. A commit that got no answer is tried again from the start (the row's insert
/// skips a row that committed; the enqueue answers the claim that committed).
async fn produce(
    n: usize,
    seed: u64,
    pace: Duration,
    share: &LedgerShare,
    db_url: &str,
    sent: &IntakeSends,
) {
    let mut r = rng(seed ^ 0x9d0c);
    for k in 0..n {
        tokio::time::sleep(pace).await;
        keep_pace(share, k as f64 / n as f64).await;
        let (tenant, id) = (pick_tenant(&mut r), format!("p{seed}-{k}"));
        let payload = format!("{{\"order\":\"{id}\",\"amount\":{}}}", r.u32(1..100_000));
        let ending = match r.f64() {
            x if x < 0.15 => Ending::Rollback,
            x if x < 0.25 => Ending::Vanish,
            _ => Ending::Commit,
        };
        loop {
            match enqueue_once(db_url, tenant, &id, &payload, &ending).await {
                Ok(()) => break,
                Err(_) if !matches!(ending, Ending::Commit) => break,
                Err(_) => {
                    sent.retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let set = match ending {
            Ending::Commit => &sent.enqueue_committed,
            _ => &sent.enqueue_abandoned,
        };
        set.lock().unwrap().insert((tenant.into(), id));
    }
}

/// One transaction of the producer.
async fn enqueue_once(
    db_url: &str,
    tenant: &str,
    id: &str,
    payload: &str,
    ending: &Ending,
) -> Result<(), sqlx::Error> {
    let mut conn = sqlx::PgConnection::connect(db_url).await?;
    sqlx::query("BEGIN").execute(&mut conn).await?;
    sqlx::query(
        "INSERT INTO chaos_producer_orders (id, tenant) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(tenant)
    .execute(&mut conn)
    .await?;
    // Priorities from the producer's side too: by the id's last digit, low, plain or high.
    let priority = [-10, 0, 50][id.bytes().last().map_or(0, |b| b as usize % 3)];
    sqlx::query("SELECT 1 FROM claimd.enqueue('events', $1, $2::jsonb, $3, priority => $4)")
        .bind(id)
        .bind(payload)
        .bind(tenant)
        .bind(priority)
        .execute(&mut conn)
        .await?;
    match ending {
        Ending::Commit => {
            sqlx::query("COMMIT").execute(&mut conn).await?;
            let _ = conn.close().await;
        }
        Ending::Rollback => {
            sqlx::query("ROLLBACK").execute(&mut conn).await?;
            let _ = conn.close().await;
        }
        Ending::Vanish => conn.close_hard().await?,
    }
    Ok(())
}

/// Compares the claims of `notify` and `events`, the producer's rows and the provider's
/// record with what was acknowledged.
pub(super) async fn check(
    db_url: &str,
    store: &Store,
    sandbox: &Sandbox,
    sent: &IntakeSends,
) -> IntakeCheck {
    let mut claims = Vec::new();
    for consumer in ["notify", "events"] {
        claims.extend(
            store
                .list(&ClaimFilter {
                    consumer: Some(consumer.into()),
                    limit: 10_000_000,
                    ..Default::default()
                })
                .await
                .unwrap(),
        );
    }
    let pool = sqlx::PgPool::connect(db_url).await.unwrap();
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT tenant, id FROM chaos_producer_orders")
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    let rows: HashSet<(String, String)> = rows.into_iter().collect();
    let effects: HashMap<String, u64> = sandbox
        .effects()
        .into_iter()
        .filter(|e| e.path == "/v1/notify" || e.path == "/v1/events")
        .map(|e| (e.key, e.applied))
        .collect();
    let (nats, ce) = (
        sent.nats_acked.lock().unwrap().clone(),
        sent.ce_acked.lock().unwrap().clone(),
    );
    let committed = sent.enqueue_committed.lock().unwrap().clone();
    let abandoned = sent.enqueue_abandoned.lock().unwrap().clone();
    let by_id: HashMap<(&str, &str, &str), &claimd::domain::claim::Claim> = claims
        .iter()
        .map(|c| {
            (
                (
                    c.consumer.as_str(),
                    c.tenant.as_str(),
                    c.message_id.as_str(),
                ),
                c,
            )
        })
        .collect();
    let mut out = IntakeCheck {
        nats: nats.len(),
        cloudevents: ce.len(),
        enqueued: committed.len(),
        abandoned: abandoned.len(),
        nats_restarts: sent.nats_restarts.load(Ordering::Relaxed),
        ..Default::default()
    };
    let acked = nats
        .iter()
        .map(|(t, id)| ("notify", t, id))
        .chain(ce.iter().chain(&committed).map(|(t, id)| ("events", t, id)));
    let mut acked_keys = HashSet::new();
    for (consumer, tenant, id) in acked {
        acked_keys.insert(format!("{consumer}:{tenant}:{id}"));
        match by_id.get(&(consumer, tenant.as_str(), id.as_str())) {
            Some(c) if c.state == ClaimState::Completed => {}
            other => {
                out.not_completed += 1;
                if out.not_completed <= 10 {
                    eprintln!(
                        "{consumer}: {tenant}/{id} acknowledged, ended {:?}",
                        other.map(|c| (c.state, c.attempt, c.last_error.clone()))
                    );
                }
            }
        }
    }
    for c in &claims {
        let applied = effects.get(&c.idem_key).copied().unwrap_or(0);
        out.doubled += (applied > 1) as usize;
        out.completed_unapplied += (c.state == ClaimState::Completed && applied == 0) as usize;
    }
    out.unacked_applied = effects
        .keys()
        .filter(|k| !acked_keys.contains(k.as_str()))
        .count()
        + abandoned
            .iter()
            .filter(|(t, id)| by_id.contains_key(&("events", t.as_str(), id.as_str())))
            .count();
    let enqueued: HashSet<(String, String)> = claims
        .iter()
        .filter(|c| c.consumer == "events" && !c.message_id.starts_with(CE_SOURCE))
        .map(|c| (c.tenant.clone(), c.message_id.clone()))
        .collect();
    out.row_without_claim = rows.difference(&enqueued).count();
    out.claim_without_row = enqueued.difference(&rows).count();
    out
}
