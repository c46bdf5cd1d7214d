//! One measured run of one design: start its server, drive the client, wait for the
//! settles, read its peak memory, and the row of the table it makes.

use super::*;

#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) design: String,
    pub(crate) latency_ms: u64,
    pub(crate) consumer_concurrency: u32,
    pub(crate) n: usize,
    /// Client connections (keep-alive), spread over the instances.
    pub(crate) clients: usize,
    /// Server processes sharing one database (claimd designs on PostgreSQL).
    pub(crate) instances: usize,
    /// Runs on the kept table-size database filled to this many claims (see `scale`), instead
    /// of a fresh database.
    pub(crate) prefill: Option<i64>,
}

impl Run {
    /// A run of `design` on a fresh database, one server, `clients` connections.
    pub(crate) fn new(
        design: &str,
        latency_ms: u64,
        consumer_concurrency: u32,
        n: usize,
        clients: usize,
    ) -> Self {
        Run {
            design: design.to_string(),
            latency_ms,
            consumer_concurrency,
            n,
            clients,
            instances: 1,
            prefill: None,
        }
    }

    /// The design as the table names it: with the claims already in the table, or the number
    /// of instances, when not the default.
    pub(crate) fn label(&self) -> String {
        let mut l = self.design.clone();
        if let Some(p) = self.prefill {
            l.push_str(&format!(" ({} claims in table)", thousands(p)));
        }
        if self.instances > 1 {
            l.push_str(&format!(" ×{} instances", self.instances));
        }
        l
    }
}

/// `1234567` as `1,234,567`.
pub(crate) fn thousands(n: i64) -> String {
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Row {
    pub(crate) msgs_per_s: f64,
    pub(crate) ack_p50: f64,
    pub(crate) ack_p99: f64,
    pub(crate) settled_p50: f64,
    pub(crate) settled_p99: f64,
    /// Largest peak RSS among the instances.
    pub(crate) rss_mib: f64,
    /// Peak RSS of each instance.
    pub(crate) rss_each: Vec<f64>,
    /// Sum of the instances' peaks.
    pub(crate) peak_in_flight: usize,
    /// Peak provider calls in flight in each instance.
    pub(crate) peak_each: Vec<usize>,
    /// Distinct messages, and how many of them the sandbox applied exactly once.
    pub(crate) applied_once: (usize, usize),
    pub(crate) xacts_per_msg: Option<f64>,
    pub(crate) retries: u64,
    pub(crate) non_2xx: u64,
    pub(crate) load_before: f64,
    pub(crate) load_after: f64,
    /// CPU per message by role (`cpu`).
    pub(crate) cpu: CpuPerMsg,
    /// `pg_stat_statements` lines, with `BENCH_PG_STATEMENTS=1`.
    pub(crate) statements: Vec<String>,
}

pub(crate) struct Pg {
    pub(crate) admin: String,
}

impl Pg {
    pub(crate) async fn create(&self, name: &str) -> String {
        let mut c = sqlx::PgConnection::connect(&self.admin).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut c)
        .await
        .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut c)
            .await
            .unwrap();
        self.url(name)
    }

    /// The URL of database `name` on the admin URL's server.
    pub(crate) fn url(&self, name: &str) -> String {
        format!("{}/{name}", self.admin.rsplit_once('/').unwrap().0)
    }

    /// Deletes the claims (and their history) of a run on a kept database that started at
    /// `start_wall` (seconds since the epoch), so the next run finds the table at its size.
    pub(crate) async fn forget_run(&self, url: &str, start_wall: f64) {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query("DELETE FROM claims WHERE received_utc >= to_timestamp($1)")
            .bind(start_wall)
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::query("VACUUM (ANALYZE) claims")
            .execute(&mut c)
            .await
            .unwrap();
    }

    pub(crate) async fn drop_db(&self, name: &str) {
        let mut c = sqlx::PgConnection::connect(&self.admin).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut c)
        .await
        .unwrap();
    }

    /// Committed + rolled-back transactions of database `name` so far (pg_stat_database).
    pub(crate) async fn xacts(&self, name: &str) -> i64 {
        let mut c = sqlx::PgConnection::connect(&self.admin).await.unwrap();
        sqlx::query_scalar(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
        )
        .bind(name)
        .fetch_one(&mut c)
        .await
        .unwrap()
    }
}

/// Applies claimd's migrations to the database at `url`.
pub(crate) async fn migrate(url: &str) {
    PgStore::connect(url, 1)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
}

/// One server process of a run: its pid, its address, and its stdout (for `PEAK`).
struct Server {
    child: tokio::process::Child,
    pid: u32,
    base: String,
    out: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

async fn spawn_server(run: &Run, mode: &str, provider: &str, store: &str, pool: u32) -> Server {
    // `BENCH_CHILD_WRAP` (e.g. `heaptrack -o /tmp/ht`) runs the server under a profiler; its
    // peak RSS is then the wrapper's child's, not measured.
    let wrap: Vec<String> = env_or("BENCH_CHILD_WRAP", String::new())
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let exe = server_exe(mode);
    let mut command = match wrap.split_first() {
        Some((program, args)) => {
            let mut c = tokio::process::Command::new(program);
            c.args(args).arg(&exe);
            c
        }
        None => tokio::process::Command::new(&exe),
    };
    if run.design.ends_with("-sealed") {
        // `[encryption]` on, with keys from the environment (two keys: one seals, one keys
        // the fingerprints).
        command.envs([
            ("CLAIMD__ENCRYPTION__ENABLED", "true"),
            ("CLAIMD__ENCRYPTION__KEYS_ENV", "BENCH_KEYS"),
            ("CLAIMD__ENCRYPTION__ACTIVE", "k1"),
            ("CLAIMD__ENCRYPTION__FINGERPRINT_KEY", "fp"),
            (
                "BENCH_KEYS",
                "k1=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=,\
                 fp=QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=",
            ),
        ]);
    }
    let mut child = command
        .args(["--mode", mode])
        .env("BENCH_PROVIDER", provider)
        .env("BENCH_STORE", store)
        .env("BENCH_POOL", pool.to_string())
        .env("BENCH_LATENCY_MS", run.latency_ms.to_string())
        .env(
            "CLAIMD__STORE__POOLER",
            if run.design == "claimd-pg-pooler" {
                "transaction"
            } else {
                "none"
            },
        )
        .env(
            "CLAIMD__STORE__BATCH_WRITES",
            (!run.design.ends_with("-unbatched")).to_string(),
        )
        .env(
            "BENCH_HTTP_VERSION",
            if run.design.ends_with("-h2") {
                "2"
            } else {
                "1.1"
            },
        )
        .env(
            "BENCH_CONSUMER_CONCURRENCY",
            run.consumer_concurrency.to_string(),
        )
        .env(
            "BENCH_ON_UNKNOWN",
            if run.design == "claimd-pg-park" {
                "park"
            } else {
                "reconcile"
            },
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn server process");
    let pid = child.id().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let line = out.next_line().await.unwrap().expect("child exited early");
        if let Some(a) = line.strip_prefix("READY ") {
            break format!("http://{a}");
        }
    };
    Server {
        child,
        pid,
        base,
        out,
    }
}

/// Stops `server` (closes its stdin) and returns its peak provider calls in flight.
async fn stop_server(mut server: Server) -> usize {
    drop(server.child.stdin.take());
    let mut peak = 0usize;
    while let Ok(Some(line)) = server.out.next_line().await {
        if let Some(p) = line.strip_prefix("PEAK ") {
            peak = p.trim().parse().unwrap_or(0);
        }
    }
    let _ = server.child.wait().await;
    peak
}

/// Runs `run`. `kept`: the name of an existing database to run on (the table-size runs), which
/// is left in place with this run's claims deleted again; otherwise a fresh one is made.
pub(crate) async fn run_one(pg: &Pg, run: &Run, pool: u32, idx: usize, kept: Option<&str>) -> Row {
    // The provider, fresh for every run, in this (the client's) process.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider = format!("http://{}", listener.local_addr().unwrap());
    let sandbox = Sandbox::new(SandboxOptions {
        latency: Duration::from_millis(run.latency_ms),
        ..Default::default()
    });
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let served = sandbox.clone();
    let sb = tokio::spawn(async move {
        let _ = served
            .serve(listener, async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            })
            .await;
    });

    let dbname = kept.map_or_else(
        || format!("claimd_bench_tp_{}_{idx}", std::process::id()),
        str::to_string,
    );
    let tmp = tempfile::tempdir().unwrap();
    // `-h2`: the same design with `effect.http_version = "2"` (set in `spawn_server`).
    let design = run.design.strip_suffix("-h2").unwrap_or(&run.design);
    let (mode, store) = match design {
        "direct" => ("direct", String::new()),
        "txn" => {
            let url = pg.create(&dbname).await;
            migrate(&url).await;
            ("txn", url)
        }
        // Through a PgBouncer in transaction mode started beforehand (`BENCH_PGBOUNCER`, its
        // URL without a database), `[store] pooler = "transaction"`; migrated directly, as
        // migrations never go through the pooler.
        "claimd-pg-pooler" => {
            let url = pg.create(&dbname).await;
            migrate(&url).await;
            let bouncer: String = env_or(
                "BENCH_PGBOUNCER",
                "postgres://postgres@127.0.0.1:6432".to_string(),
            );
            ("claimd", format!("{bouncer}/{dbname}"))
        }
        "claimd-pg" if kept.is_some() => ("claimd", pg.url(&dbname)),
        "claimd-pg"
        | "claimd-pg-unbatched"
        | "claimd-pg-wide"
        | "claimd-pg-memory"
        | "claimd-pg-sealed"
        | "claimd-pg-park" => ("claimd", pg.create(&dbname).await),
        "underway" => ("underway", pg.create(&dbname).await),
        "apalis" => ("apalis", pg.create(&dbname).await),
        "claimd-sqlite" | "claimd-sqlite-unbatched" | "claimd-sqlite-sealed" => (
            "claimd",
            format!("sqlite://{}", tmp.path().join("claims.db").display()),
        ),
        other => panic!("unknown design {other}"),
    };
    let on_pg = store.starts_with("postgres");
    assert!(
        run.instances == 1 || (on_pg && mode == "claimd"),
        "several instances share one PostgreSQL database: claimd-pg designs only"
    );

    // One after the other: each instance migrates the database when it opens it.
    let mut servers = Vec::new();
    for _ in 0..run.instances {
        servers.push(spawn_server(run, mode, &provider, &store, pool).await);
    }
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let x0 = if on_pg { pg.xacts(&dbname).await } else { 0 };
    let track_statements = on_pg && statements_reset(pg).await;
    let postmaster = cpu::postmaster(pg).await;
    let pids: Vec<u32> = servers.iter().map(|s| s.pid).collect();
    let cpu0 = cpu::sample(&pids, postmaster);

    let load_before = load1();
    let start_wall = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let t0 = Instant::now();
    let client = drive_client(&bases, run.n, run.clients).await;
    let client_s = t0.elapsed().as_secs_f64();
    let mut polls = 0i64;
    let (settled, elapsed) = if mode == "claimd" {
        // The bench's own reads go to the database itself, never through the pooler.
        let direct = if run.design == "claimd-pg-pooler" {
            pg.url(&dbname)
        } else {
            store.clone()
        };
        let (lat, last) = wait_settled(&direct, &mut polls, start_wall).await;
        (lat, (last - start_wall).max(client_s))
    } else if PEERS.contains(&mode) {
        let (lat, last) = wait_jobs(mode, &store, &mut polls).await;
        (lat, (last - start_wall).max(client_s))
    } else {
        (client.ack_ms.clone(), client_s)
    };
    let load_after = load1();
    let cpu = cpu::per_msg(cpu0, cpu::sample(&pids, postmaster), run.n);
    let rss_each: Vec<f64> = servers
        .iter()
        .map(|s| vm_hwm_kib(s.pid) as f64 / 1024.0)
        .collect();
    let mut peak_each = Vec::new();
    for server in servers {
        peak_each.push(stop_server(server).await);
    }
    let xacts_per_msg = if on_pg {
        // Backends report their statistics when they exit; give the collector a moment.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let x1 = pg.xacts(&dbname).await;
        Some((x1 - x0 - polls) as f64 / run.n as f64)
    } else {
        None
    };
    let _ = stop_tx.send(true);
    let _ = sb.await;
    let unique = unique_messages(run.n);
    let effects = sandbox.effects();
    let once = effects.iter().filter(|e| e.applied == 1).count();
    assert_eq!(
        effects.len(),
        unique,
        "{}: every message must reach the provider",
        run.label()
    );
    assert_eq!(once, unique, "{}: an effect applied twice", run.label());
    let statements = if track_statements {
        statements(pg, &dbname, run.n).await
    } else {
        Vec::new()
    };
    if kept.is_some() {
        pg.forget_run(&store, start_wall).await;
    } else if on_pg {
        pg.drop_db(&dbname).await;
    }
    Row {
        msgs_per_s: run.n as f64 / elapsed,
        ack_p50: quantile(&client.ack_ms, 0.5),
        ack_p99: quantile(&client.ack_ms, 0.99),
        settled_p50: quantile(&settled, 0.5),
        settled_p99: quantile(&settled, 0.99),
        rss_mib: rss_each.iter().copied().fold(0.0, f64::max),
        rss_each,
        peak_in_flight: peak_each.iter().sum(),
        peak_each,
        applied_once: (unique, once),
        xacts_per_msg,
        retries: client.retries,
        non_2xx: client.non_2xx,
        load_before,
        load_after,
        cpu,
        statements,
    }
}

// ---------------------------------------------------------------------------------------------
// Database only.
// ---------------------------------------------------------------------------------------------
