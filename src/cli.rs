//! The command line: argument definitions and what each command does. `main.rs` only parses,
//! calls [`execute`] and prints what it returns; nothing here prints.
//!
//! Exit codes: `0` ok, `1` runtime failure, `2` bad usage or configuration, `3` a check found
//! problems.

use crate::app::App;
use crate::claim::ClaimState;
use crate::config::Config;
use crate::duration::Dur;
use crate::reconcile;
use crate::report::{self, Window, csv_field, table};
use crate::retention;
use crate::run;
use crate::sandbox::{Sandbox, SandboxOptions};
use crate::store::ClaimFilter;
use crate::sweeper::Sweeper;
use clap::{Parser, Subcommand, ValueEnum};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// `claimd`: exactly-once-in-effect side effects on top of at-least-once delivery.
#[derive(Debug, Parser)]
#[command(name = "claimd", version, about)]
pub struct Cli {
    /// Configuration file.
    #[arg(long, global = true, default_value = "config/default.toml")]
    pub config: PathBuf,
    /// Log format (default: json when stderr is not a terminal).
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable.
    Pretty,
}

/// Output format of reports and listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Format {
    /// Aligned columns.
    #[default]
    Table,
    /// JSON.
    Json,
    /// CSV.
    Csv,
}

/// The commands (README.md, "Commands").
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the worker: intake, claimer, sweeper, retention, HTTP API (and sandbox if enabled).
    Run,
    /// Apply migrations to the configured store.
    Migrate,
    /// One sweeper pass now.
    Sweep {
        /// Only print what would be done.
        #[arg(long)]
        dry_run: bool,
    },
    /// Reconciliation report.
    Report {
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// Window for throughput figures, like 24h, or `all` (open work is always counted in
        /// full; `all` reads every claim in the table).
        #[arg(long, default_value_t)]
        since: Window,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
        /// Exit 3 when anything is stuck or needs attention, or the sweeper is not running.
        #[arg(long)]
        check: bool,
    },
    /// Audit claims against the provider's status endpoint; exit 3 on any mismatch.
    Reconcile {
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// Only claims received within this window, like 24h.
        #[arg(long)]
        since: Option<Dur>,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Inspect and repair claims.
    Claims {
        /// What to do with claims.
        #[command(subcommand)]
        command: ClaimsCommand,
    },
    /// Delete terminal claims older than the retention window, in batches.
    Prune {
        /// Only count what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
    /// Run the provider simulator alone.
    Sandbox {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8090")]
        listen: String,
        /// Latency added to each effect, in milliseconds.
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        /// Probability of answering 503 without applying.
        #[arg(long, default_value_t = 0.0, value_parser = probability)]
        fail_rate: f64,
        /// Probability of applying, then answering 500 or dropping the connection.
        #[arg(long, default_value_t = 0.0, value_parser = probability)]
        ambiguous_rate: f64,
        /// Behave like a provider without idempotency keys.
        #[arg(long)]
        ignore_keys: bool,
    },
}

/// `claimd claims ...`
#[derive(Debug, Subcommand)]
pub enum ClaimsCommand {
    /// List claims, newest first.
    List {
        /// Only this state.
        #[arg(long)]
        state: Option<ClaimState>,
        /// Only started claims whose lease expired.
        #[arg(long)]
        stuck: bool,
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// One claim in full, with its history.
    Show {
        /// Consumer.
        consumer: String,
        /// Message id.
        message_id: String,
        /// Tenant.
        #[arg(long, default_value = "")]
        tenant: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Operator decision on a needs_attention (or failed) claim.
    Resolve {
        /// Consumer.
        consumer: String,
        /// Message id.
        message_id: String,
        /// The decision.
        #[arg(long = "as", value_parser = resolution)]
        to: ClaimState,
        /// Why (kept in the claim's history).
        #[arg(long)]
        note: String,
        /// Tenant.
        #[arg(long, default_value = "")]
        tenant: String,
    },
    /// Put a needs_attention/failed claim back to started so the next sweep performs it again.
    Redrive {
        /// Consumer.
        consumer: String,
        /// Message id.
        message_id: String,
        /// Tenant.
        #[arg(long, default_value = "")]
        tenant: String,
    },
}

impl clap::builder::ValueParserFactory for ClaimState {
    type Parser = clap::builder::ValueParser;
    fn value_parser() -> Self::Parser {
        clap::builder::ValueParser::new(|s: &str| {
            s.parse::<ClaimState>().map_err(|e| e.to_string())
        })
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        <Format as ValueEnum>::from_str(s, true)
    }
}

fn probability(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is not a probability between 0 and 1"))
    }
}

fn resolution(s: &str) -> Result<ClaimState, String> {
    match s {
        "completed" => Ok(ClaimState::Completed),
        "failed" => Ok(ClaimState::Failed),
        other => Err(format!(
            "{other:?}: a claim can be resolved only as completed or failed"
        )),
    }
}

/// What a command produced: text for stdout and stderr, and the exit code.
#[derive(Debug, Default)]
pub struct Output {
    /// For stdout.
    pub stdout: String,
    /// For stderr (one line per problem).
    pub stderr: String,
    /// Process exit code.
    pub code: i32,
}

impl Output {
    fn ok(stdout: String) -> Self {
        Output {
            stdout,
            ..Default::default()
        }
    }
    fn fail(code: i32, message: impl std::fmt::Display) -> Self {
        Output {
            stderr: format!("claimd: {message}\n"),
            code,
            ..Default::default()
        }
    }
}

/// Sets up `tracing` on stderr.
pub fn init_logging(format: Option<LogFormat>) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("CLAIMD_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,sqlx=warn,tokio_cron_scheduler=warn")
    });
    let format = format.unwrap_or(if std::io::stderr().is_terminal() {
        LogFormat::Pretty
    } else {
        LogFormat::Json
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
        LogFormat::Pretty => builder.compact().try_init(),
    };
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    let mut s =
        serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}

/// Runs one command.
pub async fn execute(cli: Cli) -> Output {
    if let Command::Sandbox {
        listen,
        latency_ms,
        fail_rate,
        ambiguous_rate,
        ignore_keys,
    } = &cli.command
    {
        return sandbox(
            listen,
            *latency_ms,
            *fail_rate,
            *ambiguous_rate,
            *ignore_keys,
        )
        .await;
    }
    let loaded = match Config::load(&cli.config) {
        Ok(l) => l,
        Err(e) => return Output::fail(2, e),
    };
    for w in &loaded.warnings {
        tracing::warn!("{}", w);
    }
    let migrate = matches!(cli.command, Command::Run | Command::Migrate);
    let app = match App::open(loaded.config, migrate).await {
        Ok(a) => a,
        Err(e) => return Output::fail(1, e),
    };
    match cli.command {
        Command::Run => run_worker(app).await,
        Command::Migrate => Output::ok(format!(
            "migrations applied to the {} store\n",
            app.store.dialect()
        )),
        Command::Sweep { dry_run } => sweep(&app, dry_run).await,
        Command::Report {
            consumer,
            since,
            format,
            check,
        } => report_cmd(&app, consumer, since, format, check).await,
        Command::Reconcile {
            consumer,
            since,
            format,
        } => reconcile_cmd(&app, consumer, since, format).await,
        Command::Claims { command } => claims(&app, command).await,
        Command::Prune { dry_run } => {
            match retention::prune(&app.store, &app.config.retention, dry_run).await {
                Ok(r) if r.skipped_locked => {
                    Output::ok("another instance is pruning; nothing done\n".into())
                }
                Ok(r) if dry_run => Output::ok(format!(
                    "would delete {} terminal claims older than {}\n",
                    r.deleted, app.config.retention.keep_terminal_for
                )),
                Ok(r) => Output::ok(format!(
                    "deleted {} terminal claims older than {} in {} batches\n",
                    r.deleted, app.config.retention.keep_terminal_for, r.batches
                )),
                Err(e) => Output::fail(1, e),
            }
        }
        Command::Sandbox { .. } => unreachable!("handled above"),
    }
}

async fn since_utc(
    app: &App,
    since: Option<Dur>,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, Output> {
    let Some(d) = since else { return Ok(None) };
    let now = app.store.now().await.map_err(|e| Output::fail(1, e))?;
    Ok(d.before(now))
}

async fn sandbox(
    listen: &str,
    latency_ms: u64,
    fail_rate: f64,
    ambiguous_rate: f64,
    ignore_keys: bool,
) -> Output {
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => return Output::fail(1, format!("cannot listen on {listen}: {e}")),
    };
    tracing::info!(listen, "sandbox provider listening");
    let sandbox = Sandbox::new(SandboxOptions {
        latency: Duration::from_millis(latency_ms),
        fail_rate,
        ambiguous_rate,
        ignore_keys,
    });
    match sandbox.serve(listener, shutdown_signal()).await {
        Ok(()) => Output::default(),
        Err(e) => Output::fail(1, e),
    }
}

/// Resolves on the first SIGINT or SIGTERM; a second one exits the process at once.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tokio::spawn(async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::warn!("second signal: exiting now; in-flight claims stay started for the sweeper");
        std::process::exit(130);
    });
}

async fn run_worker(app: App) -> Output {
    let grace = app.config.run.shutdown_grace.0;
    let running = match run::start(app).await {
        Ok(r) => r,
        Err(e @ (run::RunError::InsecureAdmin(_) | run::RunError::OpenIntake(_))) => {
            return Output::fail(2, e);
        }
        Err(e) => return Output::fail(1, e),
    };
    shutdown_signal().await;
    tracing::info!("shutting down: no new work; finishing in-flight effects");
    let left = running.shutdown(grace).await;
    tracing::info!(left_started = left, "stopped");
    Output::default()
}

async fn sweep(app: &App, dry_run: bool) -> Output {
    let sweeper = Sweeper::new(app.claimer.clone(), app.config.sweeper.batch_size);
    match sweeper.pass(dry_run).await {
        Ok(r) => {
            let rows: Vec<Vec<String>> = r
                .items
                .iter()
                .map(|i| {
                    vec![
                        i.consumer.clone(),
                        i.tenant.clone(),
                        i.message_id.clone(),
                        i.attempt.to_string(),
                        i.action.clone(),
                        i.result.clone(),
                    ]
                })
                .collect();
            let mut out = if rows.is_empty() {
                "no stuck claims\n".to_string()
            } else {
                table(
                    &[
                        "consumer",
                        "tenant",
                        "message_id",
                        "attempt",
                        "action",
                        "result",
                    ],
                    &rows,
                )
            };
            if dry_run {
                out.push_str("(dry run: nothing changed)\n");
            }
            Output::ok(out)
        }
        Err(e) => Output::fail(1, e),
    }
}

async fn report_cmd(
    app: &App,
    consumer: Option<String>,
    window: Window,
    format: Format,
    check: bool,
) -> Output {
    let r = match report::build(
        &app.store,
        &app.consumer_names(),
        consumer.as_deref(),
        window,
        app.sweep_period(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return Output::fail(1, e),
    };
    let stdout = match format {
        Format::Table => report::render_table(&r),
        Format::Json => to_json(&r),
        Format::Csv => report::render_csv(&r),
    };
    let code = if check && r.has_problems() { 3 } else { 0 };
    Output {
        stdout,
        code,
        ..Default::default()
    }
}

async fn reconcile_cmd(
    app: &App,
    consumer: Option<String>,
    since: Option<Dur>,
    format: Format,
) -> Output {
    let since = match since_utc(app, since).await {
        Ok(s) => s,
        Err(o) => return o,
    };
    let audit = match reconcile::audit(&app.claimer, consumer.as_deref(), since).await {
        Ok(a) => a,
        Err(e) => return Output::fail(1, e),
    };
    let stdout = match format {
        Format::Json => to_json(&audit),
        Format::Csv => {
            let mut s = String::from("kind,consumer,tenant,message_id,state,suggestion\n");
            for m in &audit.mismatches {
                let kind = serde_json::to_value(m.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                let _ = writeln!(
                    s,
                    "{},{},{},{},{},{}",
                    kind,
                    csv_field(&m.consumer),
                    csv_field(&m.tenant),
                    csv_field(&m.message_id),
                    m.state,
                    csv_field(&m.suggestion)
                );
            }
            s
        }
        Format::Table => {
            let mut s = format!(
                "checked {} claims, {} undecided, {} mismatches{}\n",
                audit.checked,
                audit.undecided,
                audit.mismatches.len(),
                if audit.truncated {
                    " (window truncated: narrow --since)"
                } else {
                    ""
                }
            );
            for c in &audit.skipped_consumers {
                let _ = writeln!(s, "consumer {c}: no status endpoint; not auditable");
            }
            if !audit.mismatches.is_empty() {
                let rows: Vec<Vec<String>> = audit
                    .mismatches
                    .iter()
                    .map(|m| {
                        let kind = serde_json::to_value(m.kind)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default();
                        vec![
                            kind,
                            m.consumer.clone(),
                            m.tenant.clone(),
                            m.message_id.clone(),
                            m.state.clone(),
                            m.suggestion.clone(),
                        ]
                    })
                    .collect();
                s.push_str(&table(
                    &[
                        "kind",
                        "consumer",
                        "tenant",
                        "message_id",
                        "state",
                        "suggestion",
                    ],
                    &rows,
                ));
            }
            s
        }
    };
    let code = if audit.mismatches.is_empty() { 0 } else { 3 };
    Output {
        stdout,
        code,
        ..Default::default()
    }
}

fn time_or_dash(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into())
}

async fn claims(app: &App, command: ClaimsCommand) -> Output {
    let store = &app.store;
    match command {
        ClaimsCommand::List {
            state,
            stuck,
            consumer,
            limit,
            format,
        } => {
            let filter = ClaimFilter {
                state,
                consumer,
                stuck,
                since: None,
                limit,
            };
            let (list, now) = match (store.list(&filter).await, store.now().await) {
                (Ok(l), Ok(n)) => (l, n),
                (Err(e), _) | (_, Err(e)) => return Output::fail(1, e),
            };
            match format {
                Format::Json => Output::ok(to_json(&serde_json::json!({ "claims": list }))),
                Format::Csv => {
                    let mut s = String::from(
                        "consumer,tenant,message_id,state,attempt,stuck,received_utc,processed_utc,last_error\n",
                    );
                    for c in &list {
                        let _ = writeln!(
                            s,
                            "{},{},{},{},{},{},{},{},{}",
                            csv_field(&c.consumer),
                            csv_field(&c.tenant),
                            csv_field(&c.message_id),
                            c.state,
                            c.attempt,
                            c.is_stuck(now),
                            c.received_utc.to_rfc3339(),
                            time_or_dash(c.processed_utc),
                            csv_field(c.last_error.as_deref().unwrap_or(""))
                        );
                    }
                    Output::ok(s)
                }
                Format::Table => {
                    let rows: Vec<Vec<String>> = list
                        .iter()
                        .map(|c| {
                            vec![
                                c.consumer.clone(),
                                c.tenant.clone(),
                                c.message_id.clone(),
                                if c.is_stuck(now) {
                                    format!("{} (stuck)", c.state)
                                } else {
                                    c.state.to_string()
                                },
                                c.attempt.to_string(),
                                c.received_utc.format("%Y-%m-%d %H:%M:%S").to_string(),
                                c.last_error.clone().unwrap_or_default(),
                            ]
                        })
                        .collect();
                    Output::ok(table(
                        &[
                            "consumer",
                            "tenant",
                            "message_id",
                            "state",
                            "attempt",
                            "received_utc",
                            "last_error",
                        ],
                        &rows,
                    ))
                }
            }
        }
        ClaimsCommand::Show {
            consumer,
            message_id,
            tenant,
            format,
        } => {
            let claim = match store.get(&consumer, &tenant, &message_id).await {
                Ok(Some(c)) => c,
                Ok(None) => {
                    return Output::fail(
                        1,
                        format!("no claim {consumer}/{message_id} (tenant {tenant:?})"),
                    );
                }
                Err(e) => return Output::fail(1, e),
            };
            let history = match store.events(claim.id).await {
                Ok(h) => h,
                Err(e) => return Output::fail(1, e),
            };
            if format == Format::Json {
                return Output::ok(to_json(
                    &serde_json::json!({ "claim": claim, "history": history }),
                ));
            }
            let mut s = String::new();
            let fields: Vec<(&str, String)> = vec![
                ("consumer", claim.consumer.clone()),
                ("tenant", claim.tenant.clone()),
                ("message_id", claim.message_id.clone()),
                ("idempotency key", claim.idem_key.clone()),
                ("state", claim.state.to_string()),
                ("attempt", claim.attempt.to_string()),
                (
                    "lease",
                    format!(
                        "{} until {}",
                        claim.lease_owner.clone().unwrap_or_else(|| "-".into()),
                        time_or_dash(claim.lease_until)
                    ),
                ),
                ("received", claim.received_utc.to_rfc3339()),
                ("started", claim.started_utc.to_rfc3339()),
                ("processed", time_or_dash(claim.processed_utc)),
                ("fingerprint", claim.fingerprint.clone()),
                ("content type", claim.content_type.clone()),
                ("payload bytes", claim.payload.len().to_string()),
                ("duplicates", claim.duplicate_count.to_string()),
                ("mismatches", claim.mismatch_count.to_string()),
                ("re-sent", claim.resent_count.to_string()),
                ("reconciled", claim.reconciled.to_string()),
                (
                    "provider status",
                    claim
                        .provider_status
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| "-".into()),
                ),
                (
                    "provider answer",
                    claim
                        .provider_response
                        .clone()
                        .unwrap_or_else(|| "-".into()),
                ),
                (
                    "last error",
                    claim.last_error.clone().unwrap_or_else(|| "-".into()),
                ),
            ];
            for (k, v) in fields {
                let _ = writeln!(s, "{k:<16} {v}");
            }
            s.push_str("\nhistory:\n");
            let rows: Vec<Vec<String>> = history
                .iter()
                .map(|e| {
                    vec![
                        e.at_utc.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                        e.attempt.to_string(),
                        e.actor.clone(),
                        e.action.clone(),
                        e.outcome.clone(),
                        e.provider_status.map(|s| s.to_string()).unwrap_or_default(),
                        e.detail.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            s.push_str(&table(
                &[
                    "at_utc", "attempt", "actor", "action", "outcome", "status", "detail",
                ],
                &rows,
            ));
            Output::ok(s)
        }
        ClaimsCommand::Resolve {
            consumer,
            message_id,
            to,
            note,
            tenant,
        } => {
            if note.trim().is_empty() {
                return Output::fail(2, "--note must say why");
            }
            let actor = operator_name();
            match store
                .resolve(&consumer, &tenant, &message_id, to, &actor, &note)
                .await
            {
                Ok(Some(Ok(c))) => Output::ok(format!(
                    "{}/{} is now {} (by {actor}: {note})\n",
                    c.consumer, c.message_id, c.state
                )),
                Ok(Some(Err(state))) => Output::fail(
                    1,
                    format!(
                        "{consumer}/{message_id} is {state}; only needs_attention or failed claims can be resolved{}",
                        if state == ClaimState::Started {
                            " (a started claim belongs to the worker and the sweeper)"
                        } else {
                            ""
                        }
                    ),
                ),
                Ok(None) => Output::fail(
                    1,
                    format!("no claim {consumer}/{message_id} (tenant {tenant:?})"),
                ),
                Err(e) => Output::fail(1, e),
            }
        }
        ClaimsCommand::Redrive {
            consumer,
            message_id,
            tenant,
        } => {
            let actor = operator_name();
            match store.redrive(&consumer, &tenant, &message_id, &actor).await {
                Ok(Some(Ok(c))) => Output::ok(format!(
                    "{}/{} is started again as attempt {}; the next sweep performs it with key {:?}\n",
                    c.consumer, c.message_id, c.attempt, c.idem_key
                )),
                Ok(Some(Err(state))) => Output::fail(
                    1,
                    format!(
                        "{consumer}/{message_id} is {state}; only needs_attention or failed claims can be redriven"
                    ),
                ),
                Ok(None) => Output::fail(
                    1,
                    format!("no claim {consumer}/{message_id} (tenant {tenant:?})"),
                ),
                Err(e) => Output::fail(1, e),
            }
        }
    }
}

/// Who an operator command is recorded as: `$CLAIMD_OPERATOR`, else `$USER`, else `operator`.
fn operator_name() -> String {
    std::env::var("CLAIMD_OPERATOR")
        .or_else(|_| std::env::var("USER"))
        .map(|u| format!("operator:{u}"))
        .unwrap_or_else(|_| "operator".into())
}
