//! The reconciliation report: exact counts per consumer, the sweeper's health and the claims a
//! person should look at. Built from the store; rendered as table, JSON or CSV by pure functions
//! (tables and CSV through [`Table`]).

use crate::domain::claim::ClaimState;
use crate::domain::redaction::mask_text;
use crate::domain::table::Table;
use crate::store::{ClaimFilter, ConsumerCounts, Store, StoreResult};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::fmt::Write as _;
use std::time::Duration;

/// Most claims listed under `attention`.
pub const ATTENTION_LIMIT: u32 = 200;

/// The throughput window `report` and `GET /v1/report` use when none is given: the counts of
/// a whole large table need a pass over every row (seconds at 10 million claims), which a
/// `report --check` run from cron every minute should not cost the database.
pub const DEFAULT_WINDOW: crate::domain::duration::Dur =
    crate::domain::duration::Dur(Duration::from_secs(86_400));

/// `--since` / `?since=`: a duration back from now, or `all`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Window {
    /// Every claim in the table.
    All,
    /// Claims received within this long before now.
    Last(crate::domain::duration::Dur),
}

impl Default for Window {
    fn default() -> Self {
        Window::Last(DEFAULT_WINDOW)
    }
}

impl std::str::FromStr for Window {
    type Err = crate::domain::duration::DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "all" {
            Ok(Window::All)
        } else {
            s.parse().map(Window::Last)
        }
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Window::All => f.write_str("all"),
            Window::Last(d) => write!(f, "{d}"),
        }
    }
}

impl Window {
    /// The window's start at database time `now` (`None`: all time).
    pub fn start(self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Window::All => None,
            Window::Last(d) => d.before(now),
        }
    }
}

/// The sweeper's health: from the store, when the last pass by any instance *started*; from a
/// running worker, also whether a pass is running there and how long ago the worker started.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct SweeperHealth {
    /// Start of the last pass by any instance.
    pub last_run_utc: Option<DateTime<Utc>>,
    /// A pass started within three schedule periods, or one is running on this instance, or
    /// this instance started less than three periods ago (its first pass is not due yet).
    pub healthy: bool,
    /// `ok` (a pass started within three periods), `running` (this instance's pass is still
    /// busy), `starting` (within the grace period after start) or `not_running`.
    pub status: String,
    /// Whether a pass is running on this instance (`null` from the CLI, which cannot know).
    pub running: Option<bool>,
    /// How long this instance's running pass has been running, in seconds.
    pub running_for_s: Option<f64>,
}

pub use crate::engine::sweep_activity::{LocalSweeper, PassGuard, SweeperActivity};

/// The sweeper's health at database time `now`, for schedule `period`: healthy when the last
/// pass (any instance) started within three periods; a worker (`local`) also counts a pass
/// still running on it, and the first three periods after its start (the grace period).
pub fn sweeper_health(
    last: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    period: Duration,
    local: Option<LocalSweeper>,
) -> SweeperHealth {
    let recent = sweeper_healthy(last, now, period);
    let running_for = local.and_then(|l| l.running_for);
    let starting = local.is_some_and(|l| l.uptime <= period * 3);
    let status = if recent {
        "ok"
    } else if running_for.is_some() {
        "running"
    } else if starting {
        "starting"
    } else {
        "not_running"
    };
    SweeperHealth {
        last_run_utc: last,
        healthy: status != "not_running",
        status: status.to_string(),
        running: local.map(|l| l.running_for.is_some()),
        running_for_s: running_for.map(|d| d.as_secs_f64()),
    }
}

impl SweeperHealth {
    /// One phrase for `/readyz` and the table: `ok`, or what is going on.
    pub fn describe(&self, period: Duration) -> String {
        match self.status.as_str() {
            "ok" => "ok".into(),
            "running" => format!(
                "a pass has been running on this instance for {:.0}s (no pass started within 3 schedule periods, {}s)",
                self.running_for_s.unwrap_or(0.0),
                (period * 3).as_secs()
            ),
            "starting" => format!(
                "starting: first pass due within 3 schedule periods ({}s) of start",
                (period * 3).as_secs()
            ),
            _ => format!(
                "no sweeper pass started within 3 schedule periods ({}s)",
                (period * 3).as_secs()
            ),
        }
    }
}

/// A claim that needs a person, or is stuck.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AttentionItem {
    /// Consumer.
    pub consumer: String,
    /// Tenant.
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// `needs_attention`, or `started` for a stuck claim.
    pub state: String,
    /// Attempt number.
    pub attempt: i32,
    /// The claim's version (an action on it is fenced on the one shown).
    pub version: i64,
    /// Why (the recorded reason or last error).
    pub reason: String,
    /// Seconds since it was received.
    pub age_s: i64,
    /// The idempotency key sent to the provider: what to look the claim up by there.
    pub key: String,
    /// Claims waiting behind it in its order key's line (0 without a key): what settling it
    /// lets go.
    pub behind_in_line: i64,
}

/// `report --format json` and `GET /v1/report`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// When the report was made (database time).
    pub generated_utc: DateTime<Utc>,
    /// Sweeper health.
    pub sweeper: SweeperHealth,
    /// Counts per consumer.
    pub consumers: Vec<ConsumerCounts>,
    /// Claims needing attention, then stuck claims.
    pub attention: Vec<AttentionItem>,
    /// Start of the throughput window (`null`: all time). Open work is always counted in full.
    pub since_utc: Option<DateTime<Utc>>,
    /// Each running instance's view of each consumer's provider (breaker, pace, next probe).
    pub providers: Vec<ProviderView>,
    /// Each consumer's last ledger reconciliation (`claimd reconcile --ledger`).
    pub ledger: Vec<crate::ops::ledger::LedgerView>,
    /// The outcome relay's backlog, per consumer with an outcome destination.
    pub outcome_events: Vec<crate::store::outbox::OutboxBacklog>,
    /// Claims waiting in order keys' lines, per consumer that has some.
    pub in_line: std::collections::BTreeMap<String, i64>,
    /// The store's tables and what holds back vacuum (PostgreSQL; `null` on SQLite).
    pub storage: Option<crate::store::storage_health::StorageHealth>,
}

/// How long after its last write an instance's view of a provider is taken as gone (each
/// instance writes its view when it changes and every [`PROVIDER_VIEW_EVERY`]).
pub const PROVIDER_VIEW_STALE: Duration = Duration::from_secs(120);

/// How often a worker writes its view of each provider when nothing changes.
pub const PROVIDER_VIEW_EVERY: Duration = Duration::from_secs(30);

/// One instance's view of a consumer's provider (`report`, the page, `GET /v1/report`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProviderView {
    /// Consumer.
    pub consumer: String,
    /// The instance whose view it is.
    pub instance: String,
    /// `closed` (calls go through), `open` (nothing is sent until the next probe) or
    /// `probing` (one call is out to see whether the provider is back).
    pub state: String,
    /// Requests per second this instance sends now (`null`: no limit).
    pub rate_per_s: Option<f64>,
    /// Seconds until the next probe (open) or until a `Retry-After` pause ends.
    pub resumes_in_s: Option<f64>,
    /// Failed calls in a row.
    pub failures: u64,
    /// Seconds since the instance wrote it.
    pub updated_s_ago: f64,
}

impl ProviderView {
    /// The view an instance wrote, as of database time `now`; `None` when it is older than
    /// [`PROVIDER_VIEW_STALE`] (the instance stopped).
    pub fn from_record(r: &crate::store::DestinationRecord, now: DateTime<Utc>) -> Option<Self> {
        let age = (now - r.at_utc).to_std().unwrap_or_default();
        if age > PROVIDER_VIEW_STALE {
            return None;
        }
        let d = &r.detail;
        let age_s = age.as_secs_f64();
        Some(ProviderView {
            consumer: r.consumer.clone(),
            instance: r.instance.clone(),
            state: d["state"].as_str().unwrap_or("unknown").to_string(),
            rate_per_s: d["rate_per_s"].as_f64(),
            resumes_in_s: d["resumes_in_s"].as_f64().map(|s| (s - age_s).max(0.0)),
            failures: d["failures"].as_u64().unwrap_or(0),
            updated_s_ago: age_s,
        })
    }
}

/// What a worker writes of its destination (see [`ProviderView::from_record`]).
pub fn provider_detail(s: &crate::engine::destination::DestinationStatus) -> String {
    serde_json::json!({
        "state": s.state.as_str(),
        "rate_per_s": s.rate,
        "resumes_in_s": s.resumes_in.map(|d| d.as_secs_f64()),
        "failures": s.failures,
    })
    .to_string()
}

impl Report {
    /// Whether anything is stuck or needs attention, or a table is bloated or vacuum held
    /// back (`report --check` exits 3 then).
    ///
    /// A sweeper that is not running is shown (and turns `/readyz` red) but is not counted
    /// here: `report` is often run when no worker is up, and what matters to the check is
    /// whether claims are stuck, which they become soon enough without a sweeper.
    pub fn has_problems(&self) -> bool {
        self.consumers
            .iter()
            .any(|c| c.stuck > 0 || c.needs_attention > 0)
            || self
                .storage
                .as_ref()
                .is_some_and(|s| s.horizon.held_back() || s.tables.iter().any(|t| t.bloated()))
    }
}

/// Whether a sweeper that last ran at `last` is healthy at `now` with schedule `period`.
pub fn sweeper_healthy(last: Option<DateTime<Utc>>, now: DateTime<Utc>, period: Duration) -> bool {
    let limit = chrono::Duration::from_std(period * 3).unwrap_or(chrono::Duration::MAX);
    last.is_some_and(|t| now - t <= limit)
}

/// Builds the report. `consumers` lists configured consumers so idle ones show zeros;
/// `window` bounds the throughput figures, measured back from the database's clock (open work
/// is always counted in full).
pub async fn build(
    store: &Store,
    consumers: &[String],
    only: Option<&str>,
    window: Window,
    sweep_period: Duration,
) -> StoreResult<Report> {
    let now = store.now().await?;
    let since = window.start(now);
    let mut counts = store.counts(since).await?;
    for name in consumers {
        if !counts.iter().any(|c| &c.consumer == name) {
            counts.push(ConsumerCounts {
                consumer: name.clone(),
                ..Default::default()
            });
        }
    }
    counts.sort_by(|a, b| a.consumer.cmp(&b.consumer));
    if let Some(only) = only {
        counts.retain(|c| c.consumer == only);
    }
    let mut attention = Vec::new();
    for (state, stuck) in [
        (ClaimState::NeedsAttention, false),
        (ClaimState::Started, true),
    ] {
        let claims = store
            .list(&ClaimFilter {
                state: Some(state),
                consumer: only.map(str::to_string),
                stuck,
                limit: ATTENTION_LIMIT,
                ..Default::default()
            })
            .await?;
        let mut behind = Vec::with_capacity(claims.len());
        for c in &claims {
            behind.push(store.behind_in_line(c).await?);
        }
        attention.extend(
            claims
                .into_iter()
                .zip(behind)
                .map(|(c, behind)| AttentionItem {
                    behind_in_line: behind,
                    // Masked: the report is shown on the page, over HTTP and in alerts.
                    reason: c.last_error.as_deref().map(mask_text).unwrap_or_else(|| {
                        if stuck {
                            "lease expired; waiting for the sweeper".into()
                        } else {
                            String::new()
                        }
                    }),
                    age_s: (now - c.received_utc).num_seconds(),
                    consumer: c.consumer,
                    tenant: c.tenant,
                    message_id: c.message_id,
                    state: c.state.as_str().to_string(),
                    attempt: c.attempt,
                    version: c.version,
                    key: c.idem_key,
                }),
        );
    }
    let last = store.last_sweep().await?;
    let providers = store
        .destinations()
        .await?
        .iter()
        .filter(|r| only.is_none_or(|o| o == r.consumer))
        .filter_map(|r| ProviderView::from_record(r, now))
        .collect();
    let outcome_events = outbox_backlog(store, only).await?;
    let mut in_line = store.in_line().await?;
    in_line.retain(|c, _| only.is_none_or(|o| o == c));
    Ok(Report {
        in_line,
        generated_utc: now,
        sweeper: sweeper_health(last, now, sweep_period, None),
        consumers: counts,
        attention,
        since_utc: since,
        providers,
        ledger: crate::ops::ledger::LedgerView::all(store, only).await?,
        outcome_events,
        storage: store.storage_health().await?,
    })
}

/// The relay's backlog of every outcome destination (`only`: that consumer's), zero for
/// those with none unsent.
async fn outbox_backlog(
    store: &Store,
    only: Option<&str>,
) -> StoreResult<Vec<crate::store::outbox::OutboxBacklog>> {
    let destinations = store.outcome_destinations();
    if destinations.is_empty() {
        return Ok(Vec::new());
    }
    let backlog = store.outbox_backlog().await?;
    Ok(destinations
        .into_iter()
        .filter(|(c, _)| only.is_none_or(|o| o == c))
        .map(|(consumer, destination)| {
            backlog
                .iter()
                .find(|b| b.consumer == consumer && b.destination == destination)
                .cloned()
                .unwrap_or(crate::store::outbox::OutboxBacklog {
                    consumer,
                    destination,
                    ..Default::default()
                })
        })
        .collect())
}

fn opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into())
}

/// The report as an aligned text table.
pub fn render_table(r: &Report) -> String {
    let mut out = String::new();
    let last = r
        .sweeper
        .last_run_utc
        .map(|t| t.to_rfc3339())
        .unwrap_or_else(|| "never".into());
    let _ = writeln!(
        out,
        "generated {}   sweeper last run {} ({})   counts since {}",
        r.generated_utc.to_rfc3339(),
        last,
        if r.sweeper.healthy {
            "healthy"
        } else {
            "NOT RUNNING"
        },
        r.since_utc
            .map(|t| t.to_rfc3339())
            .unwrap_or_else(|| "the beginning (--since all)".into())
    );
    let mut counts = Table::new(&[
        "consumer",
        "received",
        "dups",
        "mismatch",
        "started",
        "stuck",
        "waiting",
        "pending",
        "completed",
        "failed",
        "attention",
        "resent",
        "dead_lettered",
        "oldest_s",
        "p50_s",
        "p95_s",
    ]);
    for c in &r.consumers {
        counts.row(count_cells(c, opt));
    }
    out.push_str(&counts.text());
    if r.providers
        .iter()
        .any(|p| p.state != "closed" || p.rate_per_s.is_some())
    {
        out.push_str("\nproviders (breaker, pace):\n");
        let mut providers = Table::new(&[
            "consumer",
            "instance",
            "state",
            "rate_per_s",
            "resumes_in_s",
            "failures",
        ]);
        for p in &r.providers {
            providers.row(vec![
                p.consumer.clone(),
                p.instance.clone(),
                p.state.clone(),
                p.rate_per_s
                    .map(|r| format!("{r:.1}"))
                    .unwrap_or_else(|| "no limit".into()),
                opt(p.resumes_in_s),
                p.failures.to_string(),
            ]);
        }
        out.push_str(&providers.text());
    }
    if !r.outcome_events.is_empty() {
        out.push_str("\noutcome events (relay backlog):\n");
        let mut outbox = Table::new(&["consumer", "destination", "unsent", "oldest_unsent_s"]);
        for b in &r.outcome_events {
            outbox.row(vec![
                b.consumer.clone(),
                b.destination.clone(),
                b.unsent.to_string(),
                opt(b.oldest_unsent_age_s),
            ]);
        }
        out.push_str(&outbox.text());
    }
    if !r.in_line.is_empty() {
        out.push_str("\nwaiting in order keys' lines:\n");
        let mut lines = Table::new(&["consumer", "waiting"]);
        for (consumer, n) in &r.in_line {
            lines.row(vec![consumer.clone(), n.to_string()]);
        }
        out.push_str(&lines.text());
    }
    if !r.attention.is_empty() {
        out.push_str("\nneeds a look:\n");
        out.push_str(&attention_table(&r.attention, false).text());
    }
    out.push_str(&crate::ops::ledger::render::report_section(&r.ledger));
    if let Some(storage) = &r.storage {
        out.push_str("\nStorage\n");
        for line in storage.describe() {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}

/// The claims that need a look, one row each; `with_key` adds the idempotency key (CSV, for
/// scripts that look the payment up at the provider).
fn attention_table(items: &[AttentionItem], with_key: bool) -> Table {
    let mut columns = vec![
        "consumer",
        "tenant",
        "message_id",
        "state",
        "attempt",
        "age_s",
        "reason",
    ];
    if with_key {
        columns.push("idempotency_key");
    }
    let mut t = Table::new(&columns);
    for a in items {
        let mut row = vec![
            a.consumer.clone(),
            a.tenant.clone(),
            a.message_id.clone(),
            a.state.clone(),
            a.attempt.to_string(),
            a.age_s.to_string(),
            match a.behind_in_line {
                0 => a.reason.clone(),
                n => format!("{} (holds {n} claims behind it in its line)", a.reason),
            },
        ];
        if with_key {
            row.push(a.key.clone());
        }
        t.row(row);
    }
    t
}

/// One consumer's counts as cells, an absent figure written by `figure`.
fn count_cells(c: &ConsumerCounts, figure: fn(Option<f64>) -> String) -> Vec<String> {
    vec![
        c.consumer.clone(),
        c.received.to_string(),
        c.duplicates.to_string(),
        c.payload_mismatches.to_string(),
        c.started.to_string(),
        c.stuck.to_string(),
        c.waiting.to_string(),
        c.pending.to_string(),
        c.completed.to_string(),
        c.failed.to_string(),
        c.needs_attention.to_string(),
        c.resent.to_string(),
        c.dead_lettered.to_string(),
        figure(c.oldest_started_age_s),
        figure(c.p50_complete_s),
        figure(c.p95_complete_s),
    ]
}

/// The per-consumer counts as CSV (one header line).
pub fn render_csv(r: &Report) -> String {
    let mut t = Table::new(&[
        "consumer",
        "received",
        "duplicates",
        "payload_mismatches",
        "started",
        "stuck",
        "waiting",
        "pending",
        "completed",
        "failed",
        "needs_attention",
        "resent",
        "dead_lettered",
        "oldest_started_age_s",
        "p50_complete_s",
        "p95_complete_s",
    ]);
    for c in &r.consumers {
        t.row(count_cells(c, |v| {
            v.map(|x| format!("{x:.3}")).unwrap_or_default()
        }));
    }
    let mut out = t.csv();
    // The claims that need a look, as a second table after a blank line (as the text
    // report lists them after the counts).
    if !r.attention.is_empty() {
        out.push('\n');
        out.push_str(&attention_table(&r.attention, true).csv());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_defaults_to_a_day_and_all_means_everything() {
        let now = Utc::now();
        assert_eq!(
            Window::default().start(now),
            Some(now - chrono::Duration::hours(24))
        );
        assert_eq!("all".parse::<Window>().unwrap().start(now), None);
        assert_eq!(
            "90m".parse::<Window>().unwrap().start(now),
            Some(now - chrono::Duration::minutes(90))
        );
        assert!("forever".parse::<Window>().is_err());
        assert_eq!(
            Window::default().to_string().parse::<Window>().unwrap(),
            Window::default()
        );
    }

    #[test]
    fn sweeper_health_allows_three_periods() {
        let now = Utc::now();
        let p = Duration::from_secs(10);
        assert!(sweeper_healthy(
            Some(now - chrono::Duration::seconds(29)),
            now,
            p
        ));
        assert!(!sweeper_healthy(
            Some(now - chrono::Duration::seconds(31)),
            now,
            p
        ));
        assert!(!sweeper_healthy(None, now, p));
    }

    #[test]
    fn a_worker_counts_its_running_pass_and_a_grace_period_after_start() {
        let now = Utc::now();
        let p = Duration::from_secs(10);
        let old = Some(now - chrono::Duration::seconds(300));
        let at = |uptime: u64, running: Option<u64>| LocalSweeper {
            uptime: Duration::from_secs(uptime),
            running_for: running.map(Duration::from_secs),
        };
        // Seconds after start, before any pass: starting, healthy.
        let h = sweeper_health(None, now, p, Some(at(2, None)));
        assert_eq!((h.status.as_str(), h.healthy), ("starting", true));
        // A long pass on this instance: running, healthy.
        let h = sweeper_health(old, now, p, Some(at(600, Some(120))));
        assert_eq!((h.status.as_str(), h.healthy), ("running", true));
        assert_eq!((h.running, h.running_for_s), (Some(true), Some(120.0)));
        // Nothing for five minutes, long after start: not running.
        let h = sweeper_health(old, now, p, Some(at(600, None)));
        assert_eq!((h.status.as_str(), h.healthy), ("not_running", false));
        // The CLI knows only the store.
        let h = sweeper_health(old, now, p, None);
        assert_eq!(
            (h.status.as_str(), h.healthy, h.running),
            ("not_running", false, None)
        );
        let h = sweeper_health(Some(now), now, p, None);
        assert_eq!((h.status.as_str(), h.healthy), ("ok", true));
    }

    #[test]
    fn sweeper_activity_tracks_overlapping_passes() {
        let a = SweeperActivity::default();
        assert_eq!(a.local().running_for, None);
        let g1 = a.begin();
        let g2 = a.begin();
        drop(g1);
        assert!(a.local().running_for.is_some(), "one pass still running");
        drop(g2);
        assert_eq!(a.local().running_for, None);
    }
}
