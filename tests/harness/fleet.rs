//! The workers under test: `claimd run` processes started, SIGKILLed and restarted, their
//! configuration, and the outages of PostgreSQL and RabbitMQ.

use super::*;

pub(super) struct WorkerProc {
    pub(super) child: Option<Child>,
    pub(super) port: u16,
    /// Processes started on this port so far: each one is an instance of its own,
    /// `w{port}.{n}`, so a takeover's "held by" names the very process that held a claim.
    pub(super) started: u32,
}

impl WorkerProc {
    /// The instance name of the process running now (or last run).
    pub(super) fn instance(&self) -> String {
        format!("w{}.{}", self.port, self.started)
    }
}

/// The set of `claimd run` processes.
pub(super) struct Fleet {
    pub(super) config: PathBuf,
    pub(super) log: PathBuf,
    pub(super) workers: Vec<WorkerProc>,
}

impl Fleet {
    pub(super) fn spawn_one(&self, port: u16, instance: &str) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        Command::new(claimd_bin())
            .args(["run", "--config"])
            .arg(&self.config)
            .env("CLAIMD__HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .env("CLAIMD__RUN__INSTANCE", instance)
            .env("CLAIMD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn claimd")
    }

    pub(super) async fn wait_up(port: u16, log: &std::path::Path) {
        let c = claimd::provider::tls::http_client_builder()
            .build()
            .expect("HTTP client");
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
        let log = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        panic!(
            "worker on {port} did not come up; the workers' log ends:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }

    /// SIGKILLs worker `i` (when running) and starts it again; returns the instance name of
    /// the process killed.
    pub(super) async fn restart(&mut self, i: usize) -> Option<String> {
        let port = self.workers[i].port;
        let killed = self.workers[i].child.take().map(|mut c| {
            let _ = c.kill();
            let _ = c.wait();
            self.workers[i].instance()
        });
        self.workers[i].started += 1;
        let instance = self.workers[i].instance();
        self.workers[i].child = Some(self.spawn_one(port, &instance));
        Self::wait_up(port, &self.log).await;
        killed
    }

    pub(super) fn ports(&self) -> Vec<u16> {
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

pub(super) fn pg_cluster() -> String {
    std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .unwrap_or_else(|| "15".into())
}

pub(super) async fn outage_now(proxy: &proxy::Proxy, real: bool, d: Duration) {
    if real {
        postgres_outage(d).await;
    } else {
        proxy.down();
        tokio::time::sleep(d).await;
        proxy.up();
    }
}

/// Restarts PostgreSQL in fast mode (every backend ends with `57P01`, as in a failover's
/// first moment) and waits until it accepts connections again.
/// `CHAOS_PG_DATA`: the data folder of a server of the run's own (run by the user
/// `postgres`, restarted with `pg_ctl`), so the restarts hit nothing else on the machine.
pub async fn postgres_fast_restart() {
    let st = match std::env::var("CHAOS_PG_DATA") {
        Ok(data) => Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(format!("/usr/lib/postgresql/{}/bin/pg_ctl", pg_cluster()))
            .args(["-D", &data, "-m", "fast", "-w", "-l"])
            .arg(format!("{data}/restarts.log"))
            .arg("restart")
            .status()
            .expect("pg_ctl"),
        Err(_) => Command::new("pg_ctlcluster")
            .args([
                "--skip-systemctl-redirect",
                &pg_cluster(),
                "main",
                "restart",
                "-m",
                "fast",
            ])
            .status()
            .expect("pg_ctlcluster"),
    };
    assert!(st.success(), "could not restart PostgreSQL");
    wait_for_postgres().await;
}

/// Waits until PostgreSQL accepts connections (10 s at most).
async fn wait_for_postgres() {
    // The port of the run's server (CLAIMD_TEST_PG), the machine's by default.
    let port = std::env::var("CLAIMD_TEST_PG")
        .ok()
        .and_then(|u| u.rsplit_once(':').map(|(_, p)| p.to_string()))
        .and_then(|p| p.split('/').next().map(str::to_string))
        .unwrap_or_else(|| "5432".into());
    for _ in 0..100 {
        if Command::new("pg_isready")
            .args(["-h", "127.0.0.1", "-p", &port, "-q"])
            .status()
            .is_ok_and(|s| s.success())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("PostgreSQL did not come back");
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
    wait_for_postgres().await;
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

/// The worker configuration of a run.
pub(super) fn worker_toml(
    s: &Scenario,
    worker_db: &str,
    provider: &str,
    smtp_port: u16,
    queues: Option<&Queues>,
    outcomes: Option<&str>,
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
{retention_schedule}[run]
shutdown_grace = "2s"
[[consumers]]
name = "payments"
{payments_source}{tenant_header}concurrency = 64
lease = "{lease_ms}ms"
max_attempts = 20
redrive_within = "1h"
on_unknown = "{on_unknown}"
key = "{{consumer}}:{{tenant}}:{{message_id}}"
{send_deadline}{payload_retention}[consumers.effect]
kind = "http"
url = "{provider}/v1/payments"
timeout = "1s"
status_url = "{provider}/v1/effects/{{key}}"
{by_value}{outcomes}{provider_events}[[consumers]]
name = "email"
{email_source}concurrency = 16
lease = "{lease_ms}ms"
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
        lease_ms = WORKER_LEASE_MS,
        outcomes = outcomes.unwrap_or(""),
        // The combined run also keeps failed claims longer and archives finished ones
        // (archive.rs ages them past `archive_after` before the checks).
        retention_schedule = if s.payload_retention.is_some() {
            "schedule = \"* * * * * *\"\nkeep_failed_for = \"3h\"\narchive_after = \"1h\"\n"
        } else {
            ""
        },
        payload_retention = s
            .payload_retention
            .map(|d| format!("payload_retention = \"{}ms\"\n", d.as_millis()))
            .unwrap_or_default(),
        send_deadline = s
            .hostile
            .as_ref()
            .map(|h| format!("send_deadline = \"{}ms\"\n", h.send_deadline.as_millis()))
            .unwrap_or_default(),
        by_value = if s.hostile.is_some() {
            HOSTILE_BY_VALUE
        } else {
            ""
        },
        provider_events = if s.hostile.is_some() {
            format!(
                "[consumers.provider_events]\nscheme = \"stripe\"\nsecrets = [\"{}\"]\nmessage_id_pointer = \"/metadata/message_id\"\ntenant_pointer = \"/metadata/tenant\"\nkey_pointer = \"/metadata/claimd_key\"\n",
                super::lookalike::SECRET
            )
        } else {
            String::new()
        },
    )
}

/// The payments effect read by value in the hostile mode: the object's `status` decides
/// (`processing` is pending), its `id` is kept on the claim; a lookup's object is the
/// sandbox record's stored `response`; a pending claim is polled after 3 s.
const HOSTILE_BY_VALUE: &str = r#"[consumers.effect.status]
found_pointer = "/response"
id_pointer = "/response/id"
[consumers.effect.outcome]
pointer = "/status"
completed = ["succeeded"]
pending = ["processing"]
failed = ["failed"]
id_pointer = "/id"
pending_poll = "3s"
"#;

/// The `lease` of both consumers of the workers under test.
pub(super) const WORKER_LEASE_MS: i64 = 3000;
