//! `claimd run`, `claimd sweep` and `claimd sandbox`: the commands that start work.

use super::*;

/// `claimd sandbox`: options from the command line, each one not given taken from the
/// `[sandbox]` section of `--config` when a file is named, else from the defaults.
pub(super) async fn sandbox(cli: &Cli) -> Output {
    let Command::Sandbox {
        listen,
        latency_ms,
        fail_rate,
        ambiguous_rate,
        ignore_keys,
        rate_limit,
        key_field,
        state_file,
    } = &cli.command
    else {
        unreachable!("called for `claimd sandbox` only")
    };
    let (file, log) = match &cli.config {
        Some(path) => match Config::load(path) {
            Ok(l) => (l.config.sandbox, l.config.log.format),
            Err(e) => return Output::fail(2, e),
        },
        None => (Default::default(), Default::default()),
    };
    init_logging(cli.log_format, log);
    let listen = listen.clone().unwrap_or(file.listen.clone());
    let options = SandboxOptions {
        latency: Duration::from_millis(latency_ms.unwrap_or(file.latency_ms)),
        fail_rate: fail_rate.unwrap_or(file.fail_rate),
        ambiguous_rate: ambiguous_rate.unwrap_or(file.ambiguous_rate),
        // A flag can only turn it on; the file may have turned it on already.
        ignore_keys: *ignore_keys || file.ignore_keys,
        rate_limit: rate_limit.or(Some(file.rate_limit)).filter(|r| *r > 0),
    };
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(l) => l,
        Err(e) => return Output::fail(1, format!("cannot listen on {listen}: {e}")),
    };
    tracing::info!(
        listen,
        latency_ms = options.latency.as_millis() as u64,
        fail_rate = options.fail_rate,
        ambiguous_rate = options.ambiguous_rate,
        ignore_keys = options.ignore_keys,
        rate_limit = options.rate_limit,
        "sandbox provider listening"
    );
    let modes = crate::provider::sandbox::SandboxModes {
        key_field: key_field.clone(),
        ..file.modes()
    };
    let state_file = state_file.clone().or(file.state_file).unwrap_or_default();
    let sandbox = match crate::provider::sandbox::open(options, modes, &state_file) {
        Ok(s) => s,
        Err(e) => return Output::fail(1, e),
    };
    match sandbox.serve(listener, shutdown_signal()).await {
        Ok(()) => Output::default(),
        Err(e) => Output::fail(1, e),
    }
}

/// Resolves on the first SIGINT or SIGTERM; a second one exits the process at once.
pub(super) async fn shutdown_signal() {
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

/// With a SQLite store, the one `claimd run` on that file: an exclusive lock on
/// `<file>.run-lock`, held until the process ends (the system drops it on any exit, a crash
/// included). SQLite takes one writing process; a second worker on the same file would start
/// its own sweeper and HTTP listener beside the first. `Ok(None)`: not SQLite, or in memory.
pub(super) fn sqlite_run_lock(url: &str) -> Result<Option<std::fs::File>, String> {
    // Not SQLite, in memory, or a bad URL (opening the store reports it).
    let Some(file) = crate::store::sqlite_filename(url) else {
        return Ok(None);
    };
    let mut lock_path = file.as_os_str().to_owned();
    lock_path.push(".run-lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| {
            format!(
                "cannot open {}: {e}",
                std::path::Path::new(&lock_path).display()
            )
        })?;
    match lock.try_lock() {
        Ok(()) => Ok(Some(lock)),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "another `claimd run` is using the SQLite store {} (it holds {}); SQLite takes one \
             process: stop that one first, or use PostgreSQL for several instances",
            file.display(),
            std::path::Path::new(&lock_path).display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(format!(
            "cannot lock {}: {e}",
            std::path::Path::new(&lock_path).display()
        )),
    }
}

pub(super) async fn run_worker(app: App) -> Output {
    let grace = app.config.run.shutdown_grace.0;
    let mut running = match run::start(app).await {
        Ok(r) => r,
        // Configuration problems (exit 2): fixed in the file, not by trying again.
        Err(
            e @ (run::RunError::InsecureAdmin(_)
            | run::RunError::OpenIntake(_)
            | run::RunError::StatusProbe { .. }
            | run::RunError::Replication(crate::service::replication::Refusal::NotSynchronous(
                _,
            ))),
        ) => {
            return Output::fail(2, e);
        }
        // Exit 4: another instance runs a newer configuration of a consumer.
        Err(e @ run::RunError::Superseded(_)) => return Output::fail(4, e),
        Err(e) => return Output::fail(1, e),
    };
    let superseded = tokio::select! {
        _ = shutdown_signal() => None,
        why = running.superseded() => Some(why),
    };
    tracing::info!("shutting down: no new work; finishing in-flight effects");
    let left = running.shutdown(grace).await;
    tracing::info!(left_started = left, "stopped");
    match superseded {
        // Exit 4: replaced by a newer configuration (docs/operations.md, "Upgrading").
        Some(why) => Output::fail(4, why),
        None => Output::default(),
    }
}

pub(super) async fn sweep(app: &App, dry_run: bool) -> Output {
    // The process exits after the pass: every claim it took is finished first.
    let sweeper =
        Sweeper::new(app.claimer.clone(), app.config.sweeper.batch_size).finishing_every_claim();
    match sweeper.pass(dry_run).await {
        Ok(r) => {
            let mut t = Table::new(&[
                "consumer",
                "tenant",
                "message_id",
                "attempt",
                "action",
                "result",
            ]);
            for i in &r.items {
                t.row(vec![
                    i.consumer.clone(),
                    i.tenant.clone(),
                    i.message_id.clone(),
                    i.attempt.to_string(),
                    i.action.clone(),
                    i.result.clone(),
                ]);
            }
            let mut out = if t.is_empty() {
                "no stuck claims\n".to_string()
            } else {
                t.text()
            };
            if dry_run {
                out.push_str("(dry run: nothing changed)\n");
            }
            Output::ok(out)
        }
        Err(e) => Output::fail(1, e),
    }
}
