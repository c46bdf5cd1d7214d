//! One measured run of one design: start its server, drive the client, wait for the
//! settles, read its peak memory, and the row of the table it makes.

use super::*;

#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) design: String,
    pub(crate) latency_ms: u64,
    pub(crate) consumer_concurrency: u32,
    pub(crate) n: usize,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Row {
    pub(crate) msgs_per_s: f64,
    pub(crate) ack_p50: f64,
    pub(crate) ack_p99: f64,
    pub(crate) settled_p50: f64,
    pub(crate) settled_p99: f64,
    pub(crate) rss_mib: f64,
    pub(crate) peak_in_flight: usize,
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
        format!("{}/{name}", self.admin.rsplit_once('/').unwrap().0)
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

pub(crate) async fn run_one(pg: &Pg, run: &Run, concurrency: usize, pool: u32, idx: usize) -> Row {
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

    let dbname = format!("claimd_bench_tp_{}_{idx}", std::process::id());
    let tmp = tempfile::tempdir().unwrap();
    let (mode, store) = match run.design.as_str() {
        "direct" => ("direct", String::new()),
        "txn" => {
            let url = pg.create(&dbname).await;
            PgStore::connect(&url, 1)
                .await
                .unwrap()
                .migrate()
                .await
                .unwrap();
            ("txn", url)
        }
        "claimd-pg"
        | "claimd-pg-unbatched"
        | "claimd-pg-wide"
        | "claimd-pg-memory"
        | "claimd-pg-park" => ("claimd", pg.create(&dbname).await),
        "underway" => ("underway", pg.create(&dbname).await),
        "apalis" => ("apalis", pg.create(&dbname).await),
        "claimd-sqlite" | "claimd-sqlite-unbatched" => (
            "claimd",
            format!("sqlite://{}", tmp.path().join("claims.db").display()),
        ),
        other => panic!("unknown design {other}"),
    };
    let on_pg = store.starts_with("postgres");

    let mut child = tokio::process::Command::new(server_exe(mode))
        .args(["--mode", mode])
        .env("BENCH_PROVIDER", &provider)
        .env("BENCH_STORE", &store)
        .env("BENCH_POOL", pool.to_string())
        .env(
            "CLAIMD__STORE__BATCH_WRITES",
            (!run.design.ends_with("-unbatched")).to_string(),
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
    let x0 = if on_pg { pg.xacts(&dbname).await } else { 0 };
    let track_statements = on_pg && statements_reset(pg).await;
    let postmaster = cpu::postmaster(pg).await;
    let cpu0 = cpu::sample(pid, postmaster);

    let load_before = load1();
    let start_wall = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let t0 = Instant::now();
    let client = drive_client(&base, run.n, concurrency).await;
    let client_s = t0.elapsed().as_secs_f64();
    let mut polls = 0i64;
    let (settled, elapsed) = if mode == "claimd" {
        let (lat, last) = wait_settled(&store, &mut polls).await;
        (lat, (last - start_wall).max(client_s))
    } else if PEERS.contains(&mode) {
        let (lat, last) = wait_jobs(mode, &store, &mut polls).await;
        (lat, (last - start_wall).max(client_s))
    } else {
        (client.ack_ms.clone(), client_s)
    };
    let load_after = load1();
    let cpu = cpu::per_msg(cpu0, cpu::sample(pid, postmaster), run.n);
    let rss_kib = vm_hwm_kib(pid);
    drop(child.stdin.take());
    let mut peak = 0usize;
    while let Ok(Some(line)) = out.next_line().await {
        if let Some(p) = line.strip_prefix("PEAK ") {
            peak = p.trim().parse().unwrap_or(0);
        }
    }
    let _ = child.wait().await;
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
    assert_eq!(
        effects.len(),
        unique,
        "{}: every message must reach the provider",
        run.design
    );
    assert!(
        effects.iter().all(|e| e.applied == 1),
        "{}: an effect applied twice",
        run.design
    );
    let statements = if track_statements {
        statements(pg, &dbname, run.n).await
    } else {
        Vec::new()
    };
    if on_pg {
        pg.drop_db(&dbname).await;
    }
    Row {
        msgs_per_s: run.n as f64 / elapsed,
        ack_p50: quantile(&client.ack_ms, 0.5),
        ack_p99: quantile(&client.ack_ms, 0.99),
        settled_p50: quantile(&settled, 0.5),
        settled_p99: quantile(&settled, 0.99),
        rss_mib: rss_kib as f64 / 1024.0,
        peak_in_flight: peak,
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
