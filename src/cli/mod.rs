//! The command line: argument definitions and what each command does. `main.rs` only parses,
//! calls [`execute`] and prints what it returns; nothing here prints.
//!
//! Exit codes: `0` ok, `1` runtime failure, `2` bad usage or configuration, `3` a check found
//! problems.

mod actor;
mod bulk;
mod claims;
mod cli_audit;
mod consumer_check;
mod erase;
mod keys;
mod masked_log;
mod migrate_plan;
mod operators;
mod reindex;
mod reports;
mod schedules;
mod store_failure;
mod worker;

pub use keys::KeysCommand;
use reports::{ledger_cmd, reconcile_cmd, report_cmd};
use worker::{run_worker, sandbox, sweep};

use crate::config::Config;
use crate::domain::claim::ClaimState;
use crate::domain::duration::Dur;
use crate::domain::table::{Table, escape_controls, escape_controls_keep_lines};
use crate::engine::retention;
use crate::engine::sweeper::Sweeper;
use crate::ops::reconcile;
use crate::ops::report::{self, Window};
use crate::provider::sandbox::SandboxOptions;
use crate::service::app::App;
use crate::service::run;
use clap::builder::TypedValueParser;
use clap::{Parser, Subcommand, ValueEnum};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// `claimd`: exactly-once-in-effect side effects on top of at-least-once delivery.
#[derive(Debug, Parser)]
#[command(name = "claimd", version, about)]
pub struct Cli {
    /// Configuration file [default: config/default.toml] (`claimd sandbox` reads one only
    /// when given).
    #[arg(long, global = true, value_name = "CONFIG")]
    pub config: Option<PathBuf>,
    /// Log format; wins over the configuration's `[log] format` [default: auto: pretty when
    /// stderr is a terminal, json otherwise].
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

pub use crate::config::LogFormat;

/// Where the configuration is read from when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "config/default.toml";

impl Cli {
    /// The configuration file: `--config`, else [`DEFAULT_CONFIG`].
    pub fn config_path(&self) -> PathBuf {
        self.config
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG))
    }
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
    Migrate {
        /// Apply nothing: list each pending migration, its statements and the locks it takes
        /// (with the table's rows, on PostgreSQL).
        #[arg(long)]
        plan: bool,
        /// Output format of `--plan`.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
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
        #[arg(long, default_value = "24h", value_parser = crate::ops::params::window_arg)]
        since: Window,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
        /// Exit 3 when anything is stuck or needs attention, or the sweeper is not running.
        #[arg(long)]
        check: bool,
    },
    /// Audit claims against the provider's status endpoint, or (--ledger) against the
    /// provider's own list of objects; exit 3 on any mismatch.
    Reconcile {
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// Only claims received within this window, like 24h (--ledger: default 24h).
        #[arg(long, conflicts_with_all = ["from", "to"], value_parser = crate::ops::params::dur_arg)]
        since: Option<Dur>,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
        /// Match claims with the provider's list of objects (`[consumers.effect.ledger]`):
        /// doubles, orphans, missing payments, amounts and totals.
        #[arg(long)]
        ledger: bool,
        /// With --ledger: the window's start (RFC 3339, like 2026-11-01T00:00:00Z).
        #[arg(long, requires_all = ["ledger", "to"])]
        from: Option<chrono::DateTime<chrono::Utc>>,
        /// With --ledger: the window's end, exclusive (RFC 3339).
        #[arg(long, requires_all = ["ledger", "from"])]
        to: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// Inspect and repair claims.
    Claims {
        /// What to do with claims.
        #[command(subcommand)]
        command: ClaimsCommand,
    },
    /// Operator accounts: add, list, disable, set-role.
    Operators {
        /// What to do with accounts.
        #[command(subcommand)]
        command: operators::OperatorsCommand,
    },
    /// The operator audit, newest first.
    Audit {
        /// Only lines at or after: a duration back (24h, 7d) or a time (2026-05-01 12:00).
        #[arg(long)]
        since: Option<String>,
        /// Only this actor's lines.
        #[arg(long)]
        actor: Option<String>,
        /// At most this many lines (1-1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Encryption at rest: count values per key, rotate to the active key.
    Keys {
        /// What to do with the keys.
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// The configured `[[schedules]]`: cron, consumer, catch_up, last and next slot.
    Schedules {
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Delete terminal claims older than the retention window, in batches.
    Prune {
        /// Only count what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
    /// Rebuild the indexes of claimd's tables that outgrew their rows (PostgreSQL, as the
    /// tables' owner): `REINDEX INDEX CONCURRENTLY`, one at a time, intake going on.
    Reindex {
        /// Only list each index, its size against a fresh build's, and what would be done.
        #[arg(long)]
        dry_run: bool,
        /// Rebuild an index at least this many times the size a fresh build would take.
        #[arg(long, default_value_t = 2.0, value_parser = times_fresh)]
        over: f64,
        /// Leave an index smaller than this many MiB.
        #[arg(long, default_value_t = 8)]
        min_mib: u32,
        /// Rebuild every index of at least --min-mib, whatever its estimate.
        #[arg(long)]
        all: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Run the provider simulator alone. With --config, the file's `[sandbox]` section sets
    /// each option that is not given here (`enabled` is not needed).
    Sandbox {
        /// Address to listen on [default: 127.0.0.1:8090].
        #[arg(long)]
        listen: Option<String>,
        /// Latency added to each effect, in milliseconds [default: 0].
        #[arg(long)]
        latency_ms: Option<u64>,
        /// Probability of answering 503 without applying [default: 0].
        #[arg(long, value_parser = probability)]
        fail_rate: Option<f64>,
        /// Probability of applying, then answering 500 or dropping the connection [default: 0].
        #[arg(long, value_parser = probability)]
        ambiguous_rate: Option<f64>,
        /// Behave like a provider without idempotency keys.
        #[arg(long)]
        ignore_keys: bool,
        /// Take at most N POSTs a second, answering 429 (Retry-After: 1) beyond [default: no limit].
        #[arg(long)]
        rate_limit: Option<u32>,
        /// Read the idempotency key from this field of a JSON body instead of the header
        /// (Square's `idempotency_key`; config/examples/square.toml runs against it).
        #[arg(long, value_name = "FIELD")]
        key_field: Option<String>,
        /// Keep the applied effects in this file across restarts [default: memory only].
        #[arg(long, value_name = "PATH")]
        state_file: Option<String>,
    },
}

/// `claimd claims ...`
#[derive(Debug, Subcommand)]
pub enum ClaimsCommand {
    /// List claims, newest first.
    List {
        /// Only this state.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["started", "pending", "completed", "failed", "needs_attention"]).map(|s| s.parse::<ClaimState>().expect("a listed state")))]
        state: Option<ClaimState>,
        /// Only started claims whose lease expired.
        #[arg(long)]
        stuck: bool,
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// Only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Only claims whose message id, idempotency key or provider id is this text or starts
        /// with it, or whose tenant is this text.
        #[arg(long, short = 'q', value_name = "TEXT")]
        search: Option<String>,
        /// Only claims received at or after this: a duration back from now (1h, 7d) or a time
        /// (2026-05-01T12:00:00Z; without a zone, UTC).
        #[arg(long, value_name = "WHEN")]
        since: Option<String>,
        /// Only claims received before this (as --since).
        #[arg(long, value_name = "WHEN")]
        until: Option<String>,
        /// Start after this position: the cursor the previous page printed.
        #[arg(long)]
        cursor: Option<String>,
        /// At most this many (at most 1000).
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
        /// Show the payload, provider answer, error and history as stored; without it their
        /// sensitive fields are masked.
        #[arg(long)]
        reveal: bool,
    },
    /// Erase the payload, provider answer and error of finished claims: one message
    /// (--consumer C --message ID [--tenant T]) or every claim of a tenant (--tenant T). Open
    /// claims are listed as not erased, with what to do.
    Erase {
        /// Consumer (one message, with --message).
        #[arg(long, requires = "message")]
        consumer: Option<String>,
        /// Message id (one message, with --consumer).
        #[arg(long, requires = "consumer")]
        message: Option<String>,
        /// Tenant: of the message, or alone every claim of this tenant.
        #[arg(long, default_value = "")]
        tenant: String,
        /// Why (kept in each claim's history, e.g. the request's reference; optional).
        #[arg(long, default_value = "")]
        note: String,
        /// Only list what would be erased.
        #[arg(long)]
        dry_run: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Operator decision on a needs_attention (or failed) claim, or (with --consumer and
    /// --reason-prefix) on every parked claim of a consumer with that reason: previewed unless
    /// --yes.
    Resolve {
        /// Consumer (one claim).
        #[arg(required_unless_present = "bulk_consumer", requires = "message_id")]
        consumer: Option<String>,
        /// Message id (one claim).
        message_id: Option<String>,
        /// The decision.
        #[arg(long = "as", value_parser = clap::builder::PossibleValuesParser::new(["completed", "failed"]).map(|s| resolution(&s).expect("a listed decision")))]
        to: ClaimState,
        /// Why (kept in the claim's history).
        #[arg(long)]
        note: String,
        /// Tenant (one claim).
        #[arg(long, default_value = "", conflicts_with = "bulk_consumer")]
        tenant: String,
        /// The bulk form's selection (parked claims of this consumer and reason).
        #[command(flatten)]
        bulk: BulkArgs,
    },
    /// Put a needs_attention/failed claim back to started so the next sweep performs it again;
    /// with --consumer and --reason-prefix, every parked claim of a consumer with that reason:
    /// previewed unless --yes.
    Redrive {
        /// Consumer (one claim).
        #[arg(required_unless_present = "bulk_consumer", requires = "message_id")]
        consumer: Option<String>,
        /// Message id (one claim).
        message_id: Option<String>,
        /// Why (kept in the claim's history; optional).
        #[arg(long, default_value = "")]
        note: String,
        /// Tenant (one claim).
        #[arg(long, default_value = "", conflicts_with = "bulk_consumer")]
        tenant: String,
        /// The bulk form's selection (parked claims of this consumer and reason).
        #[command(flatten)]
        bulk: BulkArgs,
    },
    /// Cancel a scheduled send (sent with Not-Before) before its time: it ends failed and is
    /// never sent. Refused once its time came and the sweeper took it.
    Cancel {
        /// Consumer.
        consumer: String,
        /// Message id.
        message_id: String,
        /// Why (kept in the claim's history and its reason).
        #[arg(long)]
        reason: String,
        /// Tenant.
        #[arg(long, default_value = "")]
        tenant: String,
    },
}

/// The bulk form of `claims resolve|redrive`: which parked claims, and whether to act.
#[derive(Debug, Clone, clap::Args)]
pub struct BulkArgs {
    /// Bulk form: the parked claims of this consumer (at most 200 at a time).
    #[arg(long = "consumer", id = "bulk_consumer", value_name = "CONSUMER", conflicts_with_all = ["consumer", "message_id"])]
    pub consumer: Option<String>,
    /// Bulk form: only parked claims whose reason starts with this text (default: any reason).
    #[arg(long, requires = "bulk_consumer", conflicts_with = "consumer")]
    pub reason_prefix: Option<String>,
    /// Bulk form: act; without it the command only lists what it would do.
    #[arg(long, requires = "bulk_consumer", conflicts_with = "consumer")]
    pub yes: bool,
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

pub(super) fn probability(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is not a probability between 0 and 1"))
    }
}

fn times_fresh(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (1.0..=1000.0).contains(&x) {
        Ok(x)
    } else {
        Err(format!(
            "{x}: an index is at least 1 times its fresh size (1 to 1000)"
        ))
    }
}

pub(super) fn resolution(s: &str) -> Result<ClaimState, String> {
    match s {
        "completed" => Ok(ClaimState::Completed),
        "failed" => Ok(ClaimState::Failed),
        other => Err(format!(
            "{other:?}: a claim can be resolved only as completed or failed"
        )),
    }
}

/// A store without claimd's tables answers "no such table" (SQLite) or "relation ... does
/// not exist" (PostgreSQL): say what to do about it.
fn never_migrated(mut out: Output, config: &std::path::Path) -> Output {
    let e = &out.stderr;
    if out.code == 1
        && (e.contains("no such table")
            || (e.contains("relation \"") && e.contains("does not exist")))
    {
        out.stderr = format!(
            "{}claimd: this database has no claimd tables yet: run `claimd --config {} migrate` (or start `claimd run`, which migrates)\n",
            out.stderr,
            crate::ops::operator_command::shell_quote(&config.to_string_lossy())
        );
    }
    out
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
    /// A store failure (exit 1), in the operator's words ([`store_failure::describe`]).
    fn store(app: &App, e: &crate::store::StoreError) -> Self {
        Output::fail(1, store_failure::describe(e, &app.config.store.url))
    }
    /// A failed read that ran where `from` says: named by the read replica's URL when it ran
    /// there, so the operator looks at the right server.
    fn read_store(
        app: &App,
        from: &crate::store::read_replica::ReadFrom,
        e: &crate::store::StoreError,
    ) -> Self {
        let store = &app.config.store;
        let url = if from.source == "replica" {
            &store.read_url
        } else {
            &store.url
        };
        Output::fail(1, store_failure::describe(e, url))
    }
    /// A one-line failure. The message may echo input (an id, a provider's answer): its
    /// controls are escaped, line breaks included, so it stays one line.
    fn fail(code: i32, message: impl std::fmt::Display) -> Self {
        Output {
            stderr: format!("claimd: {}\n", escape_controls(&message.to_string())),
            code,
            ..Default::default()
        }
    }
}

/// lapin's module that logs returned messages with their payload.
const QUIET_TARGET: &str = "lapin::returned_messages";

/// Sets up `tracing` on stderr: `--log-format` if given, else the configuration's
/// `[log] format`, `auto` deciding by whether stderr is a terminal. A second call (tests run
/// commands in one process) keeps the first set-up.
pub fn init_logging(cli: Option<LogFormat>, config: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("CLAIMD_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,sqlx=warn,tokio_cron_scheduler=warn")
    });
    // lapin logs every returned (unroutable) message at WARN with its whole body and headers;
    // claimd logs the unconfirmed dead letter itself, without them. Unless asked for by name.
    let filter = if std::env::var("CLAIMD_LOG").is_ok_and(|v| v.contains(QUIET_TARGET)) {
        filter
    } else {
        filter.add_directive(
            format!("{QUIET_TARGET}=error")
                .parse()
                .expect("a valid directive"),
        )
    };
    let terminal = std::io::stderr().is_terminal();
    let format = cli.unwrap_or(config).resolve(terminal);
    // Colours only for a terminal: pretty lines sent to a file stay plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(terminal)
        .with_writer(masked_log::masked_stderr);
    let _ = match format {
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
        LogFormat::Pretty | LogFormat::Auto => builder.compact().try_init(),
    };
}

pub(super) fn to_json<T: serde::Serialize>(v: &T) -> String {
    let mut s =
        serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}

/// Runs one command: reads the configuration, sets up logging (after the configuration, whose
/// `[log] format` it follows), then does the work.
///
/// What it returns is safe to print on a terminal: values are escaped where they are put in a
/// line (table cells, `claims show`, error messages), and the whole output is escaped again
/// with its line breaks kept ([`escape_controls_keep_lines`]), so no text a client or provider
/// wrote can reach the terminal as a control sequence, whichever line it ends up in. JSON
/// output parses to the same value: the escapes are JSON's.
pub async fn execute(cli: Cli) -> Output {
    let mut out = execute_unescaped(cli).await;
    for text in [&mut out.stdout, &mut out.stderr] {
        if let std::borrow::Cow::Owned(escaped) = escape_controls_keep_lines(text) {
            *text = escaped;
        }
    }
    out
}

/// [`execute`] on a multi-threaded runtime of its own, to the end: the `claimd` binary's whole
/// run. A plain function, so the binary only calls it: a future the binary polled itself would
/// be compiled again in the binary (about 80 s of CPU in a release build; docs/decisions.md,
/// "The first build").
pub fn execute_blocking(cli: Cli) -> Output {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => {
            let out = runtime.block_on(execute(cli));
            // Not the runtime's drop, which would wait without limit for blocking work still
            // running (a DNS lookup of a provider's host): the answer is ready.
            runtime.shutdown_background();
            out
        }
        Err(e) => Output::fail(1, format_args!("cannot start the runtime: {e}")),
    }
}

async fn execute_unescaped(cli: Cli) -> Output {
    if let Command::Sandbox { .. } = &cli.command {
        return sandbox(&cli).await;
    }
    let config_path = cli.config_path();
    // Only these call providers: the others run without the providers' secrets.
    let calls_providers = matches!(
        cli.command,
        Command::Run | Command::Sweep { .. } | Command::Reconcile { .. }
    );
    let loaded = match if calls_providers {
        Config::load(&config_path)
    } else {
        Config::load_without_provider_secrets(&config_path)
    } {
        Ok(l) => l,
        Err(e) => return Output::fail(2, e),
    };
    init_logging(cli.log_format, loaded.config.log.format);
    // Said by the commands that start work; a listing repeating them each time is noise.
    if calls_providers || matches!(cli.command, Command::Migrate { .. }) {
        for w in &loaded.warnings {
            tracing::warn!("{}", w);
        }
    }
    if let Command::Migrate { plan: true, format } = cli.command {
        return migrate_plan::show(&loaded.config.store.url, format).await;
    }
    let migrate = matches!(cli.command, Command::Run | Command::Migrate { .. });
    let mut note_only_in_store = String::new();
    // Held until this process ends: one `claimd run` per SQLite file.
    let _one_process = match &cli.command {
        Command::Run => match worker::sqlite_run_lock(&loaded.config.store.url) {
            Ok(lock) => lock,
            Err(why) => return Output::fail(2, why),
        },
        _ => None,
    };
    let store_url = loaded.config.store.url.clone();
    let app = match App::open(loaded.config, migrate).await {
        Ok(a) => a,
        Err(crate::service::app::AppError::Store(e)) => {
            return never_migrated(
                Output::fail(1, store_failure::describe(&e, &store_url)),
                &config_path,
            );
        }
        Err(e) => return Output::fail(1, e),
    };
    if let Some((name, usage)) = consumer_check::named_consumer(&cli.command) {
        match consumer_check::check_consumer(&app.config, app.store.as_ref(), name, usage).await {
            Ok(consumer_check::Checked::Configured) => {}
            Ok(consumer_check::Checked::OnlyInStore(note)) => note_only_in_store = note,
            Err((code, why)) => return never_migrated(Output::fail(code, why), &config_path),
        }
    }
    // What a one-off command traced (a sweep's attempts) is sent before the process ends.
    let traces = app.claimer.traces().clone();
    let out = match cli.command {
        Command::Run => run_worker(app).await,
        Command::Migrate { .. } => Output::ok(format!(
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
            ledger: true,
            from,
            to,
        } => ledger_cmd(&app, consumer, since, from.zip(to), format).await,
        Command::Reconcile {
            consumer,
            since,
            format,
            ..
        } => reconcile_cmd(&app, consumer, since, format).await,
        Command::Claims { command } => claims::audited_claims(&app, command).await,
        Command::Operators { command } => operators::operators(&app, command).await,
        Command::Audit {
            since,
            actor,
            limit,
            format,
        } => {
            let query = crate::ops::audit::AuditQuery {
                since,
                actor,
                before: None,
                limit: Some(limit),
            };
            operators::audit_cmd(&app, query, format).await
        }
        Command::Keys { command } => keys::keys_cmd(&app, command).await,
        Command::Schedules { format } => schedules::schedules_cmd(&app, format).await,
        Command::Prune { dry_run } => {
            let consumers = &app.config.consumers;
            match retention::prune(&app.store, &app.config.retention, consumers, dry_run).await {
                Ok(r) if r.skipped_locked => {
                    Output::ok("another instance is pruning; nothing done\n".into())
                }
                Ok(r) => Output::ok(reports::prune_summary(&r, &app.config.retention, dry_run)),
                Err(e) => Output::fail(1, e),
            }
        }
        Command::Reindex {
            dry_run,
            over,
            min_mib,
            all,
            format,
        } => {
            let choice = crate::store::index_rebuild::RebuildChoice {
                over,
                min_bytes: i64::from(min_mib) << 20,
                all,
            };
            reindex::reindex_cmd(&app, choice, dry_run, format).await
        }
        Command::Sandbox { .. } => unreachable!("handled above"),
    };
    if traces.is_on() {
        let _ = tokio::task::spawn_blocking(move || traces.shutdown(Duration::from_secs(5))).await;
    }
    let mut out = never_migrated(out, &config_path);
    out.stderr.insert_str(0, &note_only_in_store);
    out
}

pub(super) async fn since_utc(
    app: &App,
    since: Option<Dur>,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, Output> {
    let Some(d) = since else { return Ok(None) };
    let now = app.store.now().await.map_err(|e| Output::store(app, &e))?;
    Ok(d.before(now))
}
