//! `claimd run`, `claimd sweep` and `claimd sandbox`: the commands that start work.

use super::*;

pub(super) async fn sandbox(
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

pub(super) async fn run_worker(app: App) -> Output {
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

pub(super) async fn sweep(app: &App, dry_run: bool) -> Output {
    let sweeper = Sweeper::new(app.claimer.clone(), app.config.sweeper.batch_size);
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
