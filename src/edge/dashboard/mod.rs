//! The operator page: `GET /` on the HTTP listener, behind the admin token.
//!
//! A read-only dashboard served by claimd itself: one HTML document with inline CSS and an
//! inline SVG chart, no script and no external asset, so the binary serves it with nothing else
//! installed. It shows the report's counts per consumer, the sweeper's health, every stuck or
//! parked claim with its reason and the command that resolves it, and how long claims take.
//!
//! By role: `data` reads the store ([`gather`]); `render` turns a [`Dashboard`] into HTML with
//! maud templates that escape every value (`render`); `layout` is what every page shares
//! (head, header, search box); `claims` serves the search results and a claim's own page;
//! `chart` draws the SVG histogram; `commands` says what to run about a claim; `actions`
//! takes the signed-in person's decisions; `page.css` is the stylesheet, compiled in. This
//! file holds what they share and the handler.

pub mod actions;
pub mod audit;
mod chart;
pub mod claims;
mod commands;
mod data;
mod layout;
mod ledger;
mod outcomes;
mod render;
mod replication;
mod schedules;
mod storage;
mod text;

pub use chart::{BUCKETS, Series, bucket, histogram, histogram_svg};
pub use commands::{commands_for, commands_for_claim};
pub use data::{COMPLETED_SAMPLE, STARTED_SAMPLE, gather};
pub use layout::search_form;
pub use render::{escape, render, render_attention, render_charts, render_counts, render_tiles};
pub use text::human_secs;

use crate::edge::AppState;
use crate::edge::http::problem::problem;
use crate::edge::http::session::Session;
use crate::ops::operator_command::OperatorCommands;
use crate::ops::report::{Report, Window};
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

/// Seconds between automatic reloads (`<meta http-equiv="refresh">`). Long enough to select and
/// copy a command before the page reloads.
pub const REFRESH_SECONDS: u32 = 30;

/// What an open claim is, for the age chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenKind {
    /// `started`, lease still running: a worker is on it.
    InFlight,
    /// `started`, lease expired: waiting for the sweeper.
    Stuck,
    /// `needs_attention`: waiting for a person.
    NeedsAttention,
}

/// Everything the page shows, gathered from the store.
#[derive(Debug, Clone)]
pub struct Dashboard {
    /// The report (counts over `window`, open work over the whole table, sweeper health,
    /// attention list). Its `generated_utc` is "now" for every age on the page.
    pub report: Report,
    /// The throughput window.
    pub window: Window,
    /// Receive-to-complete seconds of the newest completed claims in the window.
    pub completed_s: Vec<f64>,
    /// Ages in seconds of open claims (newest `started` ones and the attention list).
    pub open: Vec<(OpenKind, f64)>,
    /// `postgres` or `sqlite`.
    pub store: String,
    /// The store's replication as last read (PostgreSQL; `None` for SQLite or before the
    /// first reading).
    pub replication: Option<crate::store::replication::Replication>,
    /// Where the page was read, with a read replica (`[store] read_url`): the replica and its
    /// lag, or the primary because the replica could not be read. `None`: no replica.
    pub read_from: Option<crate::store::read_replica::ReadFrom>,
    /// This worker's instance name.
    pub instance: String,
    /// How the page writes the commands it suggests (with this worker's `--config`).
    pub commands: OperatorCommands,
    /// The newest `failed` claims in the window (refused by the provider), with their reason.
    pub failed: Vec<crate::domain::claim::Claim>,
    /// Each RabbitMQ consumer's connection and the dead letters it wrote since this worker
    /// started, by reason (the durable count per consumer is in the report's counts).
    pub brokers: Vec<BrokerView>,
    /// The configured `[[schedules]]` with their last and next slots.
    pub schedules: Vec<crate::ops::periodic::ScheduleView>,
    /// The signed-in person, when the page was opened with a session cookie: the page then
    /// offers actions (see [`actions`]). `None`: read-only.
    pub session: Option<PageSession>,
}

/// One broker consumer as the page shows it.
#[derive(Debug, Clone)]
pub struct BrokerView {
    /// Consumer name.
    pub consumer: String,
    /// `None` when consuming; else why not (the last connection error).
    pub down: Option<String>,
    /// Dead letters written by this worker since it started, by reason.
    pub dead_letters: Vec<(String, u64)>,
}

/// Who is signed in, and the CSRF token the page's forms carry.
#[derive(Debug, Clone)]
pub struct PageSession {
    /// The account's name (for the admin token, the name given at sign-in).
    pub name: String,
    /// The role signed in with.
    pub role: crate::domain::operator_role::Role,
    /// The session's CSRF token.
    pub csrf: String,
}

impl PageSession {
    /// The page's view of a session.
    pub fn of(state: &AppState, s: Session) -> PageSession {
        PageSession {
            csrf: s.csrf(state.config.http.session_key()),
            role: s.role,
            name: s.name,
        }
    }
}

/// `GET /?since=DUR`: the operator page. `since` bounds the throughput figures (default 24h).
#[derive(Debug, Deserialize)]
pub struct PageQuery {
    /// Throughput window, like `1h` or `7d`, or `all`.
    pub since: Option<String>,
}

/// `GET /`: gathers the data and serves the page (behind the admin token, see `api::router`).
pub async fn page(
    State(state): State<AppState>,
    session: Option<Extension<Session>>,
    who: Option<Extension<crate::domain::operator_role::Identity>>,
    Query(q): Query<PageQuery>,
) -> Response {
    let window = match q.since.as_deref().map(str::parse::<Window>).transpose() {
        Ok(w) => w.unwrap_or_default(),
        Err(e) => {
            let session = session.map(|Extension(s)| PageSession::of(&state, s));
            return error_page(
                StatusCode::BAD_REQUEST,
                "bad since",
                &e.to_string(),
                session,
            );
        }
    };
    if let Err(e) = crate::ops::params::report_window("since", window) {
        return crate::edge::http::problem::bad_parameter(&e);
    }
    match gather(&state, window, crate::edge::http::claims::exposure_of(&who)).await {
        Ok(mut d) => {
            d.session = session.map(|Extension(s)| PageSession::of(&state, s));
            html(render(&d))
        }
        Err(e) => {
            tracing::warn!(error = %e, "operator page: store read failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "store unavailable",
                "the claim store could not be read; retry",
            )
        }
    }
}

/// A refusal a person reads in the browser: the page's frame with what was wrong and a way
/// back, rather than the API's problem+json.
fn error_page(
    status: StatusCode,
    title: &str,
    message: &str,
    session: Option<PageSession>,
) -> Response {
    let body = maud::html! { main { section {
        h2 { (title) }
        p { (message) }
        p { a href="/" { "Back to the operator page" } " (last 24 hours)." }
    } } };
    html_page(
        status,
        layout::shell(
            &format!("claimd: {title}"),
            maud::html! {},
            session.as_ref(),
            false,
            body,
        ),
    )
}

/// An HTML answer that runs no script, loads nothing, is never framed and never cached.
fn html(body: String) -> Response {
    html_page(StatusCode::OK, body)
}

pub(crate) use crate::edge::http::problem::html_page;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::report::{AttentionItem, SweeperHealth};
    use crate::store::ConsumerCounts;
    use chrono::Utc;

    /// An attention-list entry (also for the `commands` tests).
    pub(super) fn item(
        state: &str,
        consumer: &str,
        tenant: &str,
        id: &str,
        reason: &str,
    ) -> AttentionItem {
        AttentionItem {
            consumer: consumer.into(),
            tenant: tenant.into(),
            message_id: id.into(),
            state: state.into(),
            attempt: 3,
            version: 5,
            reason: reason.into(),
            age_s: 4000,
            key: format!("{consumer}:{tenant}:{id}"),
            behind_in_line: 0,
        }
    }

    fn dashboard(attention: Vec<AttentionItem>, healthy: bool) -> Dashboard {
        let now = Utc::now();
        Dashboard {
            report: Report {
                storage: None,
                generated_utc: now,
                sweeper: SweeperHealth {
                    last_run_utc: healthy.then(|| now - chrono::Duration::seconds(4)),
                    healthy,
                    ..Default::default()
                },
                since_utc: None,
                providers: vec![],
                ledger: vec![],
                outcome_events: vec![],
                in_line: Default::default(),
                consumers: vec![
                    ConsumerCounts {
                        consumer: "payments".into(),
                        received: 120,
                        duplicates: 7,
                        completed: 100,
                        started: 3,
                        stuck: 2,
                        needs_attention: 1,
                        oldest_started_age_s: Some(754.0),
                        p50_complete_s: Some(0.4),
                        p95_complete_s: Some(2.5),
                        ..Default::default()
                    },
                    ConsumerCounts {
                        consumer: "emails".into(),
                        received: 5,
                        completed: 5,
                        ..Default::default()
                    },
                ],
                attention,
            },
            window: Window::default(),
            completed_s: vec![0.2, 0.5, 3.0, 12.0, 100.0, 7200.0],
            open: vec![(OpenKind::Stuck, 120.0), (OpenKind::NeedsAttention, 4000.0)],
            store: "sqlite".into(),
            replication: None,
            read_from: None,
            instance: "host-1".into(),
            commands: OperatorCommands::default(),
            failed: vec![],
            brokers: vec![],
            schedules: vec![],
            session: None,
        }
    }

    #[test]
    fn escape_covers_markup_and_quotes() {
        // Attribute values are always double-quoted, so a single quote needs no escaping.
        assert_eq!(
            escape(r#"<a href="x" b='y'>&amp;</a>"#),
            "&lt;a href=&quot;x&quot; b='y'&gt;&amp;amp;&lt;/a&gt;"
        );
        assert_eq!(escape("plain-id_1"), "plain-id_1");
    }

    #[test]
    fn every_data_value_is_escaped() {
        let evil = "<script>alert(1)</script>";
        let mut d = dashboard(
            vec![
                item("needs_attention", evil, evil, evil, evil),
                item(
                    "started",
                    "payments",
                    "",
                    "\"><img src=x onerror=alert(1)>",
                    evil,
                ),
            ],
            true,
        );
        d.report.consumers[0].consumer = evil.into();
        d.store = evil.into();
        d.instance = evil.into();
        let page = render(&d);
        // The page has no script of its own, so any `<script` or injected tag is from data.
        assert!(!page.contains("<script"), "raw script tag in the page");
        assert!(!page.contains("<img"), "raw img tag in the page");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(page.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"));
    }

    #[test]
    fn the_commands_name_the_workers_configuration_file() {
        let mut d = dashboard(
            vec![item("needs_attention", "payments", "", "order-1", "r")],
            true,
        );
        d.commands = OperatorCommands::new(Some(std::path::Path::new("/etc/claimd.toml")));
        let page = render(&d);
        assert!(page.contains("claimd claims redrive payments order-1 --config /etc/claimd.toml"));
        assert!(page.contains("claimd report --format json --config /etc/claimd.toml"));
        assert!(
            !page.contains("--config PATH"),
            "no advice to add it by hand"
        );
        let page = render(&dashboard(vec![], true));
        assert!(page.contains("--config PATH"));
    }

    #[test]
    fn a_sweeper_that_does_not_run_is_shown_red() {
        let page = render(&dashboard(vec![], false));
        assert!(page.contains("NOT RUNNING") && page.contains("last pass: never"));
        assert!(page.contains("tile bad"));
        let page = render(&dashboard(vec![], true));
        assert!(page.contains(">healthy<") && page.contains("last pass 4s ago"));
    }

    #[test]
    fn the_page_lists_reasons_and_highlights_problems() {
        let page = render(&dashboard(
            vec![
                item(
                    "needs_attention",
                    "payments",
                    "",
                    "order-1",
                    "attempts exhausted: attempt 8 of max_attempts 8",
                ),
                item("started", "payments", "", "order-2", "lease expired"),
            ],
            true,
        ));
        assert!(page.contains("attempts exhausted: attempt 8 of max_attempts 8"));
        assert!(page.contains("claimd claims redrive payments order-1"));
        assert!(page.contains("claimd sweep"));
        assert!(page.contains("received 1h 06m ago") && page.contains("attempt 3"));
        assert!(
            page.contains("<td class=\"bad\">2</td>"),
            "stuck highlighted"
        );
        assert!(
            page.contains("<td class=\"bad\">1</td>"),
            "attention highlighted"
        );
        assert!(page.contains("all consumers"), "a total row");
        assert!(page.contains("<title>claimd: 3 need a look</title>"));
        assert!(page.contains("<svg") && page.contains("http-equiv=\"refresh\""));
        assert_eq!(
            page.matches("http").count(),
            page.matches("http://www.w3.org/2000/svg").count() + page.matches("http-equiv").count(),
            "no external reference"
        );
        let clear = render(&Dashboard {
            report: Report {
                storage: None,
                consumers: vec![],
                attention: vec![],
                ..dashboard(vec![], true).report
            },
            ..dashboard(vec![], true)
        });
        assert!(clear.contains("Nothing is stuck and nothing needs attention."));
        assert!(clear.contains("<title>claimd: all clear</title>"));
    }

    #[test]
    fn durations_read_like_a_person_would_say_them() {
        // Sub-second figures (a fast provider's p50) in ms: "0s" would say nothing.
        assert_eq!(human_secs(0.42), "420ms");
        assert_eq!(human_secs(0.004), "4ms");
        assert_eq!(human_secs(1.25), "1.2s");
        assert_eq!(human_secs(3.0), "3s");
        assert_eq!(human_secs(59.4), "59s");
        assert_eq!(human_secs(754.0), "12m 34s");
        assert_eq!(human_secs(4000.0), "1h 06m");
        assert_eq!(human_secs(200_000.0), "2d 07h");
        assert_eq!(human_secs(-1.0), "0ms");
    }
}
