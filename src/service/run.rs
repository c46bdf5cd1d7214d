//! `claimd run`: the HTTP API and intake, the claimer, the scheduled sweeper (with a watchdog,
//! because interval jobs of the scheduler can stop firing under load), retention, and the
//! sandbox provider when enabled. [`start`] returns a handle so tests can run it in-process.

use crate::edge::api::{self, AppState};
use crate::edge::intake::amqp::AmqpIntake;
use crate::edge::intake::nats::NatsIntake;
use crate::engine::claimer::Claimer;
use crate::engine::retention;
use crate::engine::sweeper::Sweeper;
use crate::ops::report::SweeperActivity;
use crate::provider::sandbox::SandboxOptions;
use crate::service::app::App;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_cron_scheduler::{Job, JobScheduler};
use tracing::{debug, error, info, warn};

/// Large buffers (request bodies, payloads up to `max_body_bytes`) come and go with the load.
/// glibc's malloc raises its mmap threshold after the first large free, so later bodies are
/// carved from per-thread heaps that are seldom given back: under a flood of 1 MiB bodies the
/// process kept its peak for good. A fixed 128 KiB threshold maps every large buffer on its own
/// and returns it to the system when freed (see docs/performance.md, "Memory"). The `claimd`
/// binary calls this first thing, before its runtime starts; so do the benchmarks that run the
/// worker in-process, to measure the memory `claimd run` has.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn return_large_buffers_to_the_system() {
    const M_MMAP_THRESHOLD: std::os::raw::c_int = -3;
    unsafe extern "C" {
        fn mallopt(param: std::os::raw::c_int, value: std::os::raw::c_int) -> std::os::raw::c_int;
    }
    // SAFETY: mallopt only changes allocator tuning and takes glibc's arena lock; called first
    // thing, it applies to every later allocation.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Elsewhere the allocator is left as it is.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn return_large_buffers_to_the_system() {}

/// Why the worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The admin API would be open to the network.
    #[error(
        "[http] listen = {0:?} is not a loopback address and [http] admin_token and session_secret are empty: set a token (or a session secret and operator accounts), or allow_insecure_admin = true"
    )]
    InsecureAdmin(String),
    /// Intake (which triggers payments) would be open to the network.
    #[error(
        "[http] listen = {0:?} is not a loopback address and [http] intake_token and tenant_tokens are empty: anyone who reaches the port could ask for payments; set intake_token (or tenant_tokens), or allow_open_intake = true when something in front authenticates"
    )]
    OpenIntake(String),
    /// A status endpoint did not answer a key that cannot exist with the configured "not
    /// found" shape (`effect.status.probe = "refuse"`).
    #[error("consumer {consumer}: effect.status_url: {why}")]
    StatusProbe {
        /// The consumer.
        consumer: String,
        /// What the probe saw.
        why: String,
    },
    /// A consumer could not be written to the registry producers' transactions read.
    #[error("consumer {consumer}: cannot register it for transactional enqueue: {source}")]
    Register {
        /// The consumer.
        consumer: String,
        /// The store's error.
        source: crate::store::StoreError,
    },
    /// Another instance runs a newer configuration of a consumer (its `generation`, or its
    /// effect kind at the same generation): this one takes none of its claims.
    #[error("{0}")]
    Superseded(String),
    /// A `[[schedules]]` entry whose messages its consumer would refuse.
    #[error("{0}")]
    Schedule(String),
    /// The scheduler refused a job.
    #[error("scheduler: {0}")]
    Scheduler(String),
    /// The sandbox's state file cannot be used.
    #[error("{0}")]
    Sandbox(String),
    /// `[store] require_synchronous_standby` is set and the store's replication is not
    /// synchronous, or cannot be read.
    #[error(transparent)]
    Replication(#[from] crate::service::replication::Refusal),
}

/// A running worker.
pub struct Running {
    /// Where the HTTP API listens.
    pub http_addr: SocketAddr,
    /// Where the sandbox provider listens, when enabled.
    pub sandbox_addr: Option<SocketAddr>,
    /// The sweeper (tests call passes directly).
    pub sweeper: Sweeper,
    /// RabbitMQ intake (`source = "amqp"` consumers): connection state and dead-letter counts.
    pub amqp: Arc<AmqpIntake>,
    /// NATS JetStream intake (`source = "nats"` consumers): connection state and dead-letter counts.
    pub nats: Arc<NatsIntake>,
    app: App,
    stop: watch::Sender<bool>,
    /// Set when another instance registered a newer configuration of a consumer.
    superseded: watch::Receiver<Option<String>>,
    http: JoinHandle<()>,
    scheduler: JobScheduler,
    background: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("http_addr", &self.http_addr)
            .finish_non_exhaustive()
    }
}

fn is_loopback(listen: &str) -> bool {
    listen
        .parse::<SocketAddr>()
        .map(|a| a.ip().is_loopback())
        .unwrap_or_else(|_| listen.starts_with("localhost:"))
}

async fn bind(addr: &str) -> Result<TcpListener, RunError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Listen {
            addr: addr.to_string(),
            source,
        })
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Starts everything `claimd run` runs.
pub async fn start(app: App) -> Result<Running, RunError> {
    let config = app.config.clone();
    if !is_loopback(&config.http.listen)
        && config.http.session_key().is_empty()
        && !config.http.allow_insecure_admin
    {
        return Err(RunError::InsecureAdmin(config.http.listen.clone()));
    }
    if !is_loopback(&config.http.listen)
        && config.http.intake_is_open()
        && !config.http.allow_open_intake
    {
        return Err(RunError::OpenIntake(config.http.listen.clone()));
    }
    // Before anything listens: a worker that must not acknowledge without a synchronous
    // standby takes no message otherwise.
    crate::service::replication::check_at_start(&app.claimer).await?;
    crate::service::read_replica::say_at_start(&app.reads, config.store.read_fallback).await;
    let (stop, stopped) = watch::channel(false);
    let mut background = Vec::new();
    background.extend(crate::service::replication::watch(
        app.claimer.clone(),
        stopped.clone(),
    ));

    let sandbox_addr = if config.sandbox.enabled {
        let listener = bind(&config.sandbox.listen).await?;
        let addr = listener.local_addr().ok();
        let options = SandboxOptions {
            latency: Duration::from_millis(config.sandbox.latency_ms),
            fail_rate: config.sandbox.fail_rate,
            ambiguous_rate: config.sandbox.ambiguous_rate,
            ignore_keys: config.sandbox.ignore_keys,
            rate_limit: Some(config.sandbox.rate_limit).filter(|r| *r > 0),
        };
        let state_file = crate::provider::sandbox::state_file_under_run(
            config.sandbox.state_file.as_deref(),
            &config.store.url,
        );
        let sandbox = crate::provider::sandbox::open(options, config.sandbox.modes(), &state_file)
            .map_err(|e| RunError::Sandbox(e.to_string()))?;
        let mut rx = stopped.clone();
        background.push(tokio::spawn(async move {
            // The sandbox outlives intake so in-flight effects can finish during shutdown.
            let wait = async move {
                let _ = rx.wait_for(|s| *s).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            if let Err(e) = sandbox.serve(listener, wait).await {
                error!(error = %e, "sandbox provider stopped");
            }
        }));
        if let Some(addr) = addr {
            info!(%addr, "sandbox provider listening");
        }
        addr
    } else {
        None
    };

    // Status endpoints first (the sandbox may be the provider): a 404 from an endpoint that does
    // not exist must not pass for "not applied" later.
    for consumer in app.claimer.consumers() {
        match consumer.effect.probe_status().await {
            Ok(None) => {}
            Ok(Some(warning)) => warn!(consumer = consumer.name(), "{warning}"),
            Err(why) => {
                let _ = stop.send(true);
                return Err(RunError::StatusProbe {
                    consumer: consumer.name().to_string(),
                    why,
                });
            }
        }
    }

    // The registry producers' transactions check enqueued messages against, before the
    // pickup takes any (docs/producers.md).
    for consumer in app.claimer.consumers() {
        let entry = crate::store::enqueue::Registration {
            name: consumer.name().to_string(),
            key_template: consumer.config.key.clone(),
            max_key_length: consumer.config.effect.max_key_length(),
            keys_tenant: consumer.template.mentions_tenant(),
            max_payload_bytes: config.http.max_body_bytes,
            ordered: consumer.order_key.is_some(),
            url_segments: consumer.effect.url_segments().to_string(),
            generation: i64::from(consumer.config.generation),
            effect_kind: consumer.config.effect.kind().to_string(),
        };
        if let Err(source) = app.store.register_consumer(&entry).await {
            let _ = stop.send(true);
            return Err(RunError::Register {
                consumer: entry.name,
                source,
            });
        }
    }
    if let Err(why) = crate::engine::periodic::check_messages(&app.claimer, &config.schedules) {
        let _ = stop.send(true);
        return Err(RunError::Schedule(why));
    }
    // An instance whose configuration of a consumer is behind the fleet's takes none of its
    // claims: it does not start.
    if let Some(why) = crate::service::generation_watch::behind(&app.claimer).await {
        let _ = stop.send(true);
        return Err(RunError::Superseded(why));
    }
    let (superseded_tx, superseded) = watch::channel(None);
    background.push(crate::service::generation_watch::watch(
        app.claimer.clone(),
        stopped.clone(),
        superseded_tx,
    ));
    // Through a pooler in transaction mode a LISTEN stays on one server connection while the
    // client's next transaction runs on another: notifications would be lost. Poll instead.
    let listen_url = (app.store.dialect() == "postgres" && !config.store.pooler.per_transaction())
        .then(|| config.store.url.clone());
    background.extend(crate::engine::enqueued::start(
        app.claimer.clone(),
        listen_url,
        stopped.clone(),
    ));

    // RabbitMQ intake: one task per `source = "amqp"` consumer; connects in the background.
    let amqp = Arc::new(AmqpIntake::start(app.claimer.clone(), &config));
    // NATS JetStream intake: one task per `source = "nats"` consumer, the same way.
    let nats = Arc::new(NatsIntake::start(app.claimer.clone(), &config));
    let sweep_period = app.sweep_period();
    let activity = Arc::new(SweeperActivity::default());
    let state = AppState {
        claimer: app.claimer.clone(),
        config: config.clone(),
        reads: app.reads.clone(),
        sweep_period,
        amqp: Some(amqp.clone()),
        nats: Some(nats.clone()),
        sweeper: activity.clone(),
        body_budget: Arc::new(crate::edge::http::server::BodyBudget::new(
            config.http.body_budget_bytes,
            config.http.max_connections,
        )),
        provider_event_budget: Arc::new(crate::edge::http::server::BodyBudget::new(
            config.http.provider_event_budget_bytes,
            config.http.max_connections,
        )),
        waiters: Arc::new(crate::engine::waiters::Waiters::new(
            crate::engine::waiters::Waiters::limit_for(&config.http),
            &app.claimer.metrics().waiters,
        )),
        guard: Arc::default(),
    };
    let listener = bind(&config.http.listen).await?;
    let http_addr = listener.local_addr().map_err(|source| RunError::Listen {
        addr: config.http.listen.clone(),
        source,
    })?;
    let router = api::router(state);
    let limits = crate::edge::http::server::Limits::from_config(&config.http);
    let mut rx = stopped.clone();
    let http = tokio::spawn(async move {
        let shutdown = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        crate::edge::http::server::serve(listener, router, limits, shutdown).await;
    });
    info!(%http_addr, instance = app.claimer.instance(), store = app.store.dialect(), "claimd listening");

    let sweeper = Sweeper::new(app.claimer.clone(), config.sweeper.batch_size);
    let last_pass = Arc::new(AtomicI64::new(unix_now()));
    let scheduler = JobScheduler::new()
        .await
        .map_err(|e| RunError::Scheduler(e.to_string()))?;
    {
        let sweeper = sweeper.clone();
        let last_pass = last_pass.clone();
        let activity = activity.clone();
        let job = Job::new_async(config.sweeper.schedule.as_str(), move |_id, _l| {
            let sweeper = sweeper.clone();
            let last_pass = last_pass.clone();
            let activity = activity.clone();
            Box::pin(async move {
                run_pass(&sweeper, &last_pass, &activity).await;
            })
        })
        .map_err(|e| RunError::Scheduler(format!("sweeper.schedule: {e}")))?;
        scheduler
            .add(job)
            .await
            .map_err(|e| RunError::Scheduler(e.to_string()))?;
    }
    {
        let store = app.store.clone();
        let metrics = app.claimer.metrics().clone();
        let retention_cfg = config.retention.clone();
        let consumers = std::sync::Arc::new(config.consumers.clone());
        let job = Job::new_async(config.retention.schedule.as_str(), move |_id, _l| {
            let store = store.clone();
            let cfg = retention_cfg.clone();
            let metrics = metrics.clone();
            let consumers = consumers.clone();
            Box::pin(async move {
                match retention::prune(&store, &cfg, &consumers, false).await {
                    Ok(r) => metrics.pruned(r.deleted),
                    Err(e) => warn!(error = %e, "retention pass failed"),
                }
            })
        })
        .map_err(|e| RunError::Scheduler(format!("retention.schedule: {e}")))?;
        scheduler
            .add(job)
            .await
            .map_err(|e| RunError::Scheduler(e.to_string()))?;
    }
    scheduler
        .start()
        .await
        .map_err(|e| RunError::Scheduler(e.to_string()))?;

    // Watchdog: if the scheduler has not fired for three periods, sweep anyway.
    {
        let sweeper = sweeper.clone();
        let last_pass = last_pass.clone();
        let activity = activity.clone();
        let mut rx = stopped.clone();
        background.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(sweep_period.max(Duration::from_secs(1)));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = rx.wait_for(|s| *s) => return,
                }
                let silent = unix_now() - last_pass.load(Ordering::SeqCst);
                if silent as u64 > (sweep_period * 3).as_secs().max(3) {
                    warn!(
                        silent_s = silent,
                        "sweeper schedule has not fired; running a pass from the watchdog"
                    );
                    run_pass(&sweeper, &last_pass, &activity).await;
                }
            }
        }));
    }

    // Each provider's breaker and pace, written for `report` and the page when they change
    // and every PROVIDER_VIEW_EVERY (a statement per change, none per message).
    {
        let claimer = app.claimer.clone();
        let mut rx = stopped.clone();
        background.push(tokio::spawn(async move {
            write_provider_views(&claimer, &mut rx).await;
        }));
    }

    // The slots of `[[schedules]]`, claimed through intake like any message.
    background.extend(crate::service::periodic::start(
        app.claimer.clone(),
        &config.schedules,
        stopped.clone(),
    ));

    // Outcome events to each consumer's destination (`[consumers.outcomes]`).
    background.extend(crate::edge::outcome_relay::start(
        app.store.clone(),
        &config,
        app.claimer.instance(),
        app.claimer.metrics().clone(),
        app.claimer.traces().clone(),
        stopped.clone(),
    ));

    Ok(Running {
        http_addr,
        sandbox_addr,
        sweeper,
        amqp,
        nats,
        app,
        stop,
        http,
        scheduler,
        background,
        superseded,
    })
}

async fn run_pass(sweeper: &Sweeper, last_pass: &AtomicI64, activity: &SweeperActivity) {
    last_pass.store(unix_now(), Ordering::SeqCst);
    // Readiness and /metrics see the pass from its start, however long it waits for effects.
    let _running = activity.begin();
    match sweeper.try_pass().await {
        Ok(Some(_)) | Ok(None) => {}
        Err(e) => warn!(error = %e, "sweeper pass failed"),
    }
}

impl Running {
    /// Resolves when another instance registered a newer configuration of one of this
    /// instance's consumers (docs/operations.md, "Upgrading"), with the sentence saying
    /// which: the caller then stops this instance ([`Running::shutdown`]).
    pub async fn superseded(&mut self) -> String {
        match self.superseded.wait_for(|s| s.is_some()).await {
            Ok(s) => s.clone().unwrap_or_default(),
            // The watcher ended without a finding (the worker is stopping): never resolves.
            Err(_) => std::future::pending().await,
        }
    }

    /// The application (store, claimer) behind this worker.
    pub fn app(&self) -> &App {
        &self.app
    }

    /// Graceful stop: refuse new work (`503`), let in-flight effects finish within `grace`,
    /// leave the rest `started` for the sweeper, stop the listeners. Returns how many effects
    /// were still in flight when the grace period ended.
    pub async fn shutdown(mut self, grace: Duration) -> usize {
        // Broker consumers first: no new deliveries; those in hand are acked or requeued.
        tokio::join!(self.amqp.stop(), self.nats.stop());
        self.app.claimer.stop_accepting();
        let _ = self.scheduler.shutdown().await;
        let left = self.app.claimer.drain(grace).await;
        if left > 0 {
            warn!(
                left,
                "grace period over; in-flight claims stay started for the sweeper"
            );
        }
        let _ = self.stop.send(true);
        let _ = self.http.await;
        for b in self.background {
            let _ = b.await;
        }
        // The spans still queued go now (blocking: the exporter's own thread sends them).
        let traces = self.app.claimer.traces().clone();
        if traces.is_on() {
            let _ =
                tokio::task::spawn_blocking(move || traces.shutdown(Duration::from_secs(5))).await;
        }
        left
    }
}

/// Writes this instance's view of each consumer's provider ([`crate::ops::report::ProviderView`])
/// when its breaker state, pace or failure count changes, and every
/// [`crate::ops::report::PROVIDER_VIEW_EVERY`] otherwise, until `stop`.
async fn write_provider_views(claimer: &Claimer, stop: &mut watch::Receiver<bool>) {
    use crate::ops::report::{PROVIDER_VIEW_EVERY, provider_detail};
    let mut written: std::collections::HashMap<String, (String, std::time::Instant)> =
        std::collections::HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        for consumer in claimer.consumers() {
            let status = consumer.destination.status();
            // What a reader compares: state, pace (rounded) and failures, not the countdown.
            let shape = format!(
                "{}/{:?}/{}",
                status.state.as_str(),
                status.rate.map(|r| r.round() as i64),
                status.failures.min(100)
            );
            let due = written
                .get(consumer.name())
                .is_none_or(|(last, at)| *last != shape || at.elapsed() >= PROVIDER_VIEW_EVERY);
            if !due {
                continue;
            }
            match claimer
                .store()
                .mark_destination(
                    consumer.name(),
                    claimer.instance(),
                    &provider_detail(&status),
                )
                .await
            {
                Ok(()) => {
                    written.insert(
                        consumer.name().to_string(),
                        (shape, std::time::Instant::now()),
                    );
                }
                Err(e) => debug!(error = %e, "could not write the provider's state"),
            }
        }
    }
}
