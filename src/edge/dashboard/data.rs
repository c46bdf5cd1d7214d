//! What the operator page shows, read from the store: the report, the newest completed claims
//! (time to complete) and the newest `started` claims (ages of open work). The only part of
//! the page that does I/O.

use super::{BrokerView, Dashboard, OpenKind};
use crate::domain::claim::ClaimState;
use crate::edge::AppState;
use crate::ops::operator_command::OperatorCommands;
use crate::ops::report::{self, Window};
use crate::store::{ClaimFilter, StoreResult};

/// How many of the newest completed claims the time-to-complete chart reads.
pub const COMPLETED_SAMPLE: u32 = 500;

/// How many of the newest `started` claims the open-claim age chart reads.
pub const STARTED_SAMPLE: u32 = 500;

/// How many of the newest `failed` claims the page lists (the rest: on the search page).
pub const FAILED_SHOWN: u32 = super::render::SHOWN_PER_LIST as u32;

/// Reads everything the page shows. `window` bounds the throughput figures and the
/// time-to-complete sample; open work is counted in full.
pub async fn gather(
    state: &AppState,
    window: Window,
    exposure: crate::domain::redaction::Exposure,
) -> StoreResult<Dashboard> {
    // On the read replica when there is one ([store] read_url): a page open in many
    // browsers, reloading itself, never loads the primary.
    let reader = state.reads.reader().await?;
    let store = &reader.store;
    let names = state.config.consumer_names();
    let mut report = report::build(store, &names, None, window, state.sweep_period).await?;
    let (now, since) = (report.generated_utc, report.since_utc);
    report.sweeper = state.sweeper_health(report.sweeper.last_run_utc, now);
    let completed = store
        .list(&ClaimFilter {
            state: Some(ClaimState::Completed),
            since,
            limit: COMPLETED_SAMPLE,
            ..Default::default()
        })
        .await?;
    let started = store
        .list(&ClaimFilter {
            state: Some(ClaimState::Started),
            limit: STARTED_SAMPLE,
            ..Default::default()
        })
        .await?;
    let mut failed = store
        .list(&ClaimFilter {
            state: Some(ClaimState::Failed),
            since,
            limit: FAILED_SHOWN,
            ..Default::default()
        })
        .await?;
    crate::ops::exposure::shown_claims(&state.config, &mut failed, exposure);
    let brokers = state
        .amqp
        .iter()
        .flat_map(|a| a.consumers())
        .map(|c| BrokerView {
            consumer: c.name().to_string(),
            down: (!c.connected()).then(|| {
                c.last_error()
                    .unwrap_or_else(|| "not connected yet".to_string())
            }),
            dead_letters: c
                .dead_lettered()
                .into_iter()
                .map(|(reason, n)| (reason.as_str().to_string(), n))
                .collect(),
        })
        .collect();
    let schedules = crate::ops::periodic::list(store.as_ref(), &state.config, now).await?;
    let secs = |d: chrono::Duration| d.num_milliseconds() as f64 / 1000.0;
    let completed_s = completed
        .iter()
        .filter_map(|c| c.processed_utc.map(|p| secs(p - c.received_utc)))
        .collect();
    let mut open: Vec<(OpenKind, f64)> = started
        .iter()
        .map(|c| {
            let kind = if c.is_stuck(now) {
                OpenKind::Stuck
            } else {
                OpenKind::InFlight
            };
            (kind, secs(now - c.received_utc))
        })
        .collect();
    open.extend(
        report
            .attention
            .iter()
            .filter(|a| a.state == ClaimState::NeedsAttention.as_str())
            .map(|a| (OpenKind::NeedsAttention, a.age_s as f64)),
    );
    Ok(Dashboard {
        report,
        window,
        completed_s,
        open,
        store: store.dialect().to_string(),
        replication: state.claimer.replication().get(),
        read_from: state.reads.has_replica().then(|| reader.from.clone()),
        instance: state.claimer.instance().to_string(),
        commands: OperatorCommands::for_config(&state.config),
        failed,
        brokers,
        schedules,
        session: None,
    })
}
