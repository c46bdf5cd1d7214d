//! The operator page as HTML: maud templates, checked when claimd compiles, that escape every
//! spliced value (only the stylesheet, a file compiled in, goes in unescaped). Text from
//! clients and providers (ids, keys, reasons, errors) also has its control and bidi characters
//! written out ([`visible`]), as the command line shows them. Pure: a [`Dashboard`] in, markup
//! out.

use super::actions::{Target, bulk_form, claim_forms};
use super::chart::{Series, histogram, histogram_svg};
use super::commands::{commands_for, commands_for_claim};
use super::layout::{search_form, shell};
use super::text::{human_secs, visible};
use super::{Dashboard, OpenKind, PageSession, REFRESH_SECONDS};
use crate::domain::claim::ClaimState;
use crate::ops::claim_query::{ClaimQuery, claim_path, claim_path_of};
use crate::ops::operator_command::{ClaimRef, OperatorCommands};
use crate::ops::report::{AttentionItem, Report, Window};
use crate::store::ConsumerCounts;
use chrono::{DateTime, Utc};
use maud::{Markup, html};

/// How many parked claims, stuck claims and failed claims the page lists each (the rest are
/// a link away, on the search page's pages).
pub const SHOWN_PER_LIST: usize = 10;

/// Escapes text for HTML element content and quoted attribute values, as the templates do
/// (`&`, `<`, `>` and `"`; attribute values are always double-quoted).
pub fn escape(s: &str) -> String {
    html! { (s) }.into_string()
}

fn fmt_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn window_label(window: Window) -> String {
    match window {
        // "the last 24h" rather than "the last 1d".
        Window::Last(d)
            if d.0.as_secs() % 3600 == 0 && d.0.as_secs() > 0 && d.0.as_secs() <= 48 * 3600 =>
        {
            format!("the last {}h", d.0.as_secs() / 3600)
        }
        Window::Last(d) => format!("the last {d}"),
        Window::All => "all time".into(),
    }
}

/// Stuck and parked claims over every consumer.
fn open_problems(r: &Report) -> (i64, i64) {
    let stuck = r.consumers.iter().map(|c| c.stuck).sum();
    let parked = r.consumers.iter().map(|c| c.needs_attention).sum();
    (stuck, parked)
}

/// The whole page, most urgent first: what needs a person (parked, stuck and failed claims,
/// providers and brokers that are down), then the counts and the charts. A section another
/// part of claimd adds is one function returning `Markup`, called from one line below.
pub fn render(d: &Dashboard) -> String {
    let r = &d.report;
    let (stuck, attention) = open_problems(r);
    let title = match stuck + attention {
        0 if r.sweeper.healthy => "claimd: all clear".to_string(),
        0 => "claimd: sweeper NOT RUNNING".to_string(),
        n => format!("claimd: {n} need a look"),
    };
    let consumers: Vec<String> = r.consumers.iter().map(|c| c.consumer.clone()).collect();
    let meta = html! {
        "generated " (fmt_time(r.generated_utc)) " (database clock) · store "
        (d.store) " · instance " (d.instance)
        @if d.session.is_none() { " · reloads every " (REFRESH_SECONDS) "s" }
    };
    let body = html! {
        main {
            (search_form(&ClaimQuery::default(), &consumers))
            (super::replication::render_read_from(d.read_from.as_ref()))
            (render_tiles(r, d.window))
            // What needs a person.
            (render_attention(r, &d.commands, d.session.as_ref()))
            (render_failed(d))
            (render_providers(r))
            (render_brokers(d))
            (super::replication::render_replication(d.replication.as_ref()))
            (super::ledger::render_ledger(&r.ledger))
            (super::outcomes::render_outcome_events(r))
            (super::schedules::render_schedules(&d.schedules, r.generated_utc))
            (super::storage::render_storage(r.storage.as_ref()))
            // How it is going.
            (render_counts(&r.consumers, d.window))
            (render_charts(d))
        }
        footer {
            @if d.session.is_none() { "Read-only (sign in at /signin to act). " }
            "The same figures: " code { (d.commands.report_json()) }
            " or " code { "GET /v1/report" } ". What each reason means and what to do: \
            docs/operations.md."
            @if !d.commands.names_config() {
                " This worker's configuration was not read from a file: add "
                code { "--config PATH" } " to the commands when it is not "
                code { "config/default.toml" } "."
            }
        }
    };
    shell(&title, meta, d.session.as_ref(), true, body)
}

fn tile(class: &str, label: &str, value: &str, sub: &str) -> Markup {
    html! {
        div class={ "tile " (class) } {
            div.label { (label) }
            div.value { (value) }
            div.sub { (sub) }
        }
    }
}

/// The row of tiles: sweeper health, stuck, needs attention, oldest started, failed.
pub fn render_tiles(r: &Report, window: Window) -> Markup {
    let (stuck, attention) = open_problems(r);
    let last = match r.sweeper.last_run_utc {
        Some(t) => format!(
            "last pass {} ago",
            human_secs((r.generated_utc - t).num_milliseconds() as f64 / 1000.0)
        ),
        None => "last pass: never".into(),
    };
    let sweeper = if r.sweeper.status == "starting" {
        // Just started, no pass yet: not a failure, but not a safety net yet either.
        tile(
            "warn",
            "sweeper",
            "STARTING",
            &format!("{last}; first pass due within 3 schedule periods of this worker's start"),
        )
    } else if r.sweeper.healthy && stuck > 0 {
        // Running, but claims wait for it: "healthy" alone would read as "nothing to do".
        tile(
            "warn",
            "sweeper",
            "healthy",
            &format!("{last}; {stuck} stuck claim(s) wait for its next pass"),
        )
    } else if r.sweeper.healthy {
        tile("ok", "sweeper", "healthy", &last)
    } else {
        tile(
            "bad",
            "sweeper",
            "NOT RUNNING",
            &format!("{last}; is a claimd run up?"),
        )
    };
    let failed: i64 = r.consumers.iter().map(|c| c.failed).sum();
    let pending: i64 = r.consumers.iter().map(|c| c.pending).sum();
    let oldest_pending = r
        .consumers
        .iter()
        .filter_map(|c| c.oldest_pending_age_s)
        .reduce(f64::max);
    let oldest = r
        .consumers
        .iter()
        .filter_map(|c| c.oldest_started_age_s)
        .reduce(f64::max);
    html! {
        div.tiles {
            (sweeper)
            (tile(if stuck > 0 { "warn" } else { "ok" }, "stuck", &stuck.to_string(),
                "started, lease expired"))
            (tile(if attention > 0 { "bad" } else { "ok" }, "needs attention",
                &attention.to_string(), "parked for a person"))
            (tile(if stuck > 0 { "warn" } else { "" }, "oldest started",
                &oldest.map_or("-".into(), human_secs), "age of the oldest started claim"))
            @if pending > 0 {
                (tile("", "pending", &pending.to_string(),
                    &format!("at the provider, not final; oldest {}",
                        oldest_pending.map_or("-".into(), human_secs))))
            }
            (tile(if failed > 0 { "warn" } else { "ok" }, "failed", &failed.to_string(),
                &format!("refused by the provider in {}", window_label(window))))
        }
    }
}

fn count_cell(n: i64, hot: &str) -> Markup {
    html! { td class=(if n == 0 { "zero" } else { hot }) { (n) } }
}

fn secs_cell(v: Option<f64>, hot: &str) -> Markup {
    html! {
        @match v {
            Some(s) => td class=(hot) { (human_secs(s)) },
            None => td.zero { "-" },
        }
    }
}

fn counts_row(c: &ConsumerCounts, class: &str) -> Markup {
    html! {
        tr class=(class) {
            td { (c.consumer) }
            (count_cell(c.needs_attention, "bad"))
            (count_cell(c.stuck, "bad"))
            (count_cell(c.failed, "warn"))
            (count_cell(c.started, ""))
            (count_cell(c.pending, ""))
            (count_cell(c.completed, ""))
            (count_cell(c.received, ""))
            (count_cell(c.duplicates, ""))
            (count_cell(c.payload_mismatches, "warn"))
            (count_cell(c.resent, ""))
            (secs_cell(c.oldest_started_age_s, if c.stuck > 0 { "warn" } else { "" }))
            (secs_cell(c.p50_complete_s, ""))
            (secs_cell(c.p95_complete_s, ""))
        }
    }
}

/// The sum over every consumer (percentiles do not add up, so it has none).
fn total(consumers: &[ConsumerCounts]) -> ConsumerCounts {
    let sum = |f: fn(&ConsumerCounts) -> i64| consumers.iter().map(f).sum::<i64>();
    ConsumerCounts {
        consumer: "all consumers".into(),
        received: sum(|c| c.received),
        duplicates: sum(|c| c.duplicates),
        payload_mismatches: sum(|c| c.payload_mismatches),
        started: sum(|c| c.started),
        stuck: sum(|c| c.stuck),
        waiting: sum(|c| c.waiting),
        in_line: sum(|c| c.in_line),
        scheduled: sum(|c| c.scheduled),
        pending: sum(|c| c.pending),
        completed: sum(|c| c.completed),
        failed: sum(|c| c.failed),
        needs_attention: sum(|c| c.needs_attention),
        resent: sum(|c| c.resent),
        dead_lettered: sum(|c| c.dead_lettered),
        oldest_started_age_s: consumers
            .iter()
            .filter_map(|c| c.oldest_started_age_s)
            .reduce(f64::max),
        oldest_pending_age_s: consumers
            .iter()
            .filter_map(|c| c.oldest_pending_age_s)
            .reduce(f64::max),
        p50_complete_s: None,
        p95_complete_s: None,
    }
}

/// The table of counts per consumer, stuck and attention highlighted.
pub fn render_counts(consumers: &[ConsumerCounts], window: Window) -> Markup {
    let header = [
        "consumer",
        "needs attention",
        "stuck",
        "failed",
        "started",
        "pending",
        "completed",
        "received",
        "duplicates",
        "mismatches",
        "resent",
        "oldest started",
        "p50",
        "p95",
    ];
    html! {
        section {
            h2 { "Claims by consumer" }
            p.note {
                "received, duplicates, mismatches, completed, failed, resent and the \
                receive-to-complete times (p50, p95) over " (window_label(window)) "; started, \
                stuck, pending (accepted by the provider, not final), needs attention and the \
                oldest started claim over all claims."
            }
            div.scroll {
                table {
                    thead { tr { @for h in header { th { (h) } } } }
                    tbody {
                        @for c in consumers { (counts_row(c, "")) }
                        @if consumers.len() > 1 { (counts_row(&total(consumers), "total")) }
                        @if consumers.is_empty() {
                            tr { td colspan=(header.len()) { "no consumers configured" } }
                        }
                    }
                }
            }
        }
    }
}

/// The parked claims (each with its reason, age, attempt, commands and, signed in, its
/// forms) and the stuck ones, the first `SHOWN_PER_LIST` of each; the rest are on the
/// search page.
pub fn render_attention(
    r: &Report,
    commands: &OperatorCommands,
    session: Option<&PageSession>,
) -> Markup {
    let (stuck, parked) = open_problems(r);
    let parked_items: Vec<&AttentionItem> = r
        .attention
        .iter()
        .filter(|a| a.state == ClaimState::NeedsAttention.as_str())
        .collect();
    let stuck_items: Vec<&AttentionItem> = r
        .attention
        .iter()
        .filter(|a| a.state == ClaimState::Started.as_str())
        .collect();
    html! {
        section.attention {
            h2 { "Needs a look (" (stuck + parked) ")" }
            p.note {
                "Parked claims wait for a decision: check the provider (its records for the \
                claim's key), then resolve or redrive. Stuck claims wait for the next sweeper \
                pass. Click a command to select it; open a claim for its history."
            }
            @if r.attention.is_empty() {
                p.clear { "Nothing is stuck and nothing needs attention." }
            }
            @if r.attention.len() > 1 {
                @let groups = reasons(r);
                p.groups {
                    "By reason: "
                    @for (i, (reason, n)) in groups.iter().enumerate() {
                        @if i > 0 { " · " }
                        strong { (n) } " × " (visible(reason))
                    }
                }
            }
            @if let Some(s) = session.filter(|_| parked > 0) {
                @let consumers: Vec<String> = r.consumers.iter().filter(|c| c.needs_attention > 0).map(|c| c.consumer.clone()).collect();
                (bulk_form(&consumers, &s.csrf))
            }
            @for a in parked_items.iter().take(SHOWN_PER_LIST) {
                (attention_card(a, commands, session))
            }
            @if parked > SHOWN_PER_LIST as i64 {
                p.more {
                    "Showing " (SHOWN_PER_LIST.min(parked_items.len())) " of " (parked) " parked claims: "
                    a href="/claims?state=needs_attention" { "all parked claims »" }
                    " (or " code { (commands.list(&["--state", "needs_attention"])) } ")"
                }
            }
            @if !stuck_items.is_empty() {
                h3.stuck { "Stuck (" (stuck) "): started, lease expired, waiting for the sweeper" }
                div.cmds {
                    span.when { "run a sweeper pass now" }
                    code { (commands.sweep()) }
                }
                div.scroll {
                    table.stuck {
                        thead { tr { th { "claim" } th { "attempt" } th { "received" } th { "reason" } th { "look first" } } }
                        tbody {
                            @for a in stuck_items.iter().take(SHOWN_PER_LIST) {
                                tr {
                                    td { a href=(claim_path_of(&a.consumer, &a.tenant, &a.message_id)) {
                                        (a.consumer) " / " code { (visible(&a.message_id)) } }
                                        @if !a.tenant.is_empty() { " · tenant " (visible(&a.tenant)) } }
                                    td { (a.attempt) }
                                    td { (human_secs(a.age_s as f64)) " ago" }
                                    td.text { (visible(&a.reason)) }
                                    td.cmdcell { code { (visible(&commands.show(ClaimRef {
                                        consumer: &a.consumer,
                                        tenant: &a.tenant,
                                        message_id: &a.message_id,
                                    }))) } }
                                }
                            }
                        }
                    }
                }
                @if stuck > SHOWN_PER_LIST as i64 {
                    p.more {
                        "Showing " (SHOWN_PER_LIST.min(stuck_items.len())) " of " (stuck) " stuck claims: "
                        a href="/claims?state=stuck" { "all stuck claims »" }
                        " (or " code { (commands.list(&["--stuck"])) } ")"
                    }
                }
            }
        }
    }
}

/// One parked claim's card.
fn attention_card(
    a: &AttentionItem,
    commands: &OperatorCommands,
    session: Option<&PageSession>,
) -> Markup {
    html! {
        div class="item attention" {
            div.head {
                span class="badge attention" { "needs attention" }
                a.who href=(claim_path_of(&a.consumer, &a.tenant, &a.message_id)) {
                    (a.consumer) " · " code { (visible(&a.message_id)) }
                    @if !a.tenant.is_empty() { " · tenant " (visible(&a.tenant)) }
                }
                span.facts {
                    "attempt " (a.attempt) " · received " (human_secs(a.age_s as f64))
                    " ago"
                }
            }
            div.reason {
                @if a.reason.is_empty() { "(no reason recorded)" } @else { (visible(&a.reason)) }
            }
            div.key { "idempotency key (look it up at the provider): " code { (visible(&a.key)) } }
            div.cmds {
                @for (when, cmd) in commands_for(commands, a) {
                    span.when { (when) }
                    code { (visible(&cmd)) }
                }
            }
            @if let Some(s) = session {
                (claim_forms(&Target {
                    consumer: a.consumer.clone(),
                    tenant: a.tenant.clone(),
                    message_id: a.message_id.clone(),
                    attempt: Some(a.attempt),
                    version: Some(a.version),
                }, &s.csrf))
            }
        }
    }
}

/// Parked claims counted by reason (the text before any `(`, so "outcome unknown (timeout)"
/// and "outcome unknown (500)" group together), most frequent first.
fn reasons(r: &Report) -> Vec<(String, usize)> {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for a in &r.attention {
        let head = if a.state == ClaimState::Started.as_str() {
            "stuck: lease expired"
        } else {
            a.reason.split(['(', ':']).next().unwrap_or("").trim()
        };
        *counts.entry(head.to_string()).or_default() += 1;
    }
    let mut v: Vec<_> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// The newest failed claims: when, what the provider answered (status and message), and
/// what can be done (resolve or redrive accept a failed claim).
pub fn render_failed(d: &Dashboard) -> Markup {
    let failed: i64 = d.report.consumers.iter().map(|c| c.failed).sum();
    let now = d.report.generated_utc;
    html! {
        @if !d.failed.is_empty() {
            section.failed {
                h2 { "Failed in " (window_label(d.window)) " (" (failed) ")" }
                p.note { "Refused by the provider: final unless someone acts. The provider's status \
                    and message say why; if the cause is fixed, redrive sends it again with the same key." }
                div.scroll {
                    table.failed {
                        thead { tr { th { "claim" } th { "when" } th { "provider said" } th { "what to do" } } }
                        tbody {
                            @for c in d.failed.iter().take(SHOWN_PER_LIST) {
                                @let claim = ClaimRef { consumer: &c.consumer, tenant: &c.tenant, message_id: &c.message_id };
                                tr {
                                    td {
                                        a href=(claim_path(c)) { (c.consumer) " / " code { (visible(&c.message_id)) } }
                                        @if !c.tenant.is_empty() { br; "tenant " (visible(&c.tenant)) }
                                        br; span.sub { "key " code { (visible(&c.idem_key)) } }
                                    }
                                    td { @match c.processed_utc {
                                        Some(t) => { (human_secs((now - t).num_milliseconds() as f64 / 1000.0)) " ago" br; span.sub { (fmt_time(t)) } },
                                        None => { "received " (human_secs((now - c.received_utc).num_milliseconds() as f64 / 1000.0)) " ago" },
                                    } }
                                    td.text {
                                        @if let Some(s) = c.provider_status { strong { (s) } " " }
                                        (visible(c.provider_response.as_deref().filter(|r| !r.is_empty()).unwrap_or("")))
                                        @if let Some(e) = &c.last_error { br; span.sub { (visible(e)) } }
                                    }
                                    td.cmdcell {
                                        @for (_, cmd) in commands_for_claim(&d.commands, claim, "failed").into_iter().skip(1) {
                                            code { (visible(&cmd)) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                @if failed > SHOWN_PER_LIST as i64 {
                    p.more { "Showing the newest " (SHOWN_PER_LIST.min(d.failed.len())) " of " (failed) ": "
                        a href="/claims?state=failed" { "all failed claims »" } }
                }
            }
        }
    }
}

/// Each instance's view of each consumer's provider: its breaker, its pace, and how many claims
/// wait for it. Shown when a provider is anything but healthy and unlimited.
fn render_providers(r: &Report) -> Markup {
    // Only the claims waiting for their provider (not in a line, not for their time).
    let for_provider = |c: &ConsumerCounts| c.waiting - c.in_line - c.scheduled;
    let waiting = |name: &str| {
        r.consumers
            .iter()
            .find(|c| c.consumer == name)
            .map_or(0, for_provider)
    };
    let worth_showing = r
        .providers
        .iter()
        .any(|p| p.state != "closed" || p.rate_per_s.is_some())
        || r.consumers.iter().any(|c| for_provider(c) > 0);
    html! {
        @if worth_showing {
            section {
                h2 { "Providers" }
                table {
                    thead { tr { th { "consumer" } th { "instance" } th { "breaker" } th { "pace" } th { "next probe / pause ends" } th { "claims waiting" } } }
                    tbody {
                        @for p in &r.providers {
                            tr {
                                td { (p.consumer) }
                                td { (p.instance) }
                                td {
                                    @match p.state.as_str() {
                                        "closed" => span.ok { "closed (sending)" },
                                        "open" => span.bad { "OPEN: failing, nothing sent; claims wait (no attempt spent)" },
                                        other => span.bad { (other) ": one probe out" },
                                    }
                                }
                                td.num { (p.rate_per_s.map(|x| format!("{x:.1}/s")).unwrap_or_else(|| "no limit".into())) }
                                td.num { (p.resumes_in_s.map(|x| format!("{x:.0}s")).unwrap_or_else(|| "-".into())) }
                                td.num { (waiting(&p.consumer)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Broker consumers: connected or not, and dead letters by consumer and reason.
pub fn render_brokers(d: &Dashboard) -> Markup {
    let durable = |name: &str| {
        d.report
            .consumers
            .iter()
            .find(|c| c.consumer == name)
            .map_or(0, |c| c.dead_lettered)
    };
    html! {
        @if !d.brokers.is_empty() {
            section {
                h2 { "Broker intake" }
                table {
                    thead { tr { th { "consumer" } th { "connection" } th { "dead letters (window)" } th { "by reason, since this worker started" } } }
                    tbody {
                        @for b in &d.brokers {
                            tr {
                                td { (b.consumer) }
                                td {
                                    @match &b.down {
                                        None => span.ok { "consuming" },
                                        Some(why) => span.bad { "DISCONNECTED: " (visible(why)) },
                                    }
                                }
                                td.num { (durable(&b.consumer)) }
                                td {
                                    @if b.dead_letters.is_empty() { "-" }
                                    @for (i, (reason, n)) in b.dead_letters.iter().enumerate() {
                                        @if i > 0 { " · " }
                                        (visible(reason)) " " strong { (n) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The two charts: time to complete of recent completed claims, and age of open claims.
pub fn render_charts(d: &Dashboard) -> Markup {
    let open_of = |kind: OpenKind| {
        histogram(
            d.open
                .iter()
                .filter(|(k, _)| *k == kind)
                .map(|(_, age)| *age),
        )
    };
    let open_total: i64 = d
        .report
        .consumers
        .iter()
        .map(|c| c.started + c.needs_attention)
        .sum();
    let completed = [Series {
        name: "completed",
        color: "#0f766e",
        counts: histogram(d.completed_s.iter().copied()),
    }];
    let open = [
        Series {
            name: "in flight",
            color: "#2563eb",
            counts: open_of(OpenKind::InFlight),
        },
        Series {
            name: "stuck",
            color: "#d97706",
            counts: open_of(OpenKind::Stuck),
        },
        Series {
            name: "needs attention",
            color: "#dc2626",
            counts: open_of(OpenKind::NeedsAttention),
        },
    ];
    html! {
        section {
            h2 { "Timing" }
            div.charts {
                div {
                    h3 { "Time to complete" }
                    p.note {
                        "processed minus received, newest " (d.completed_s.len())
                        " completed claims received in " (window_label(d.window))
                    }
                    (histogram_svg("histogram of time to complete", "receive → complete",
                        &completed))
                }
                div {
                    h3 { "Age of open claims" }
                    p.note {
                        "now minus received, " (d.open.len()) " of " (open_total)
                        " open claims (started and needs attention)"
                    }
                    (histogram_svg("histogram of open claim age", "age", &open))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::report::{AttentionItem, SweeperHealth};

    /// Issue 24: what a provider wrote is HTML-escaped and its control and bidi characters
    /// are shown, not obeyed (a right-to-left override would reorder the reason).
    #[test]
    fn the_page_shows_control_and_bidi_characters_visibly() {
        let hostile = "<b>x</b>\x1b]8;;https://evil.example\x07\u{202e}txt.exe\r\nline";
        let report = Report {
            storage: None,
            providers: vec![],
            ledger: vec![],
            outcome_events: vec![],
            in_line: Default::default(),
            generated_utc: Utc::now(),
            sweeper: SweeperHealth::default(),
            consumers: vec![ConsumerCounts {
                consumer: "payments".into(),
                needs_attention: 1,
                ..Default::default()
            }],
            attention: vec![AttentionItem {
                consumer: "payments".into(),
                tenant: "acme\u{2066}".into(),
                message_id: "m-1\u{9b}".into(),
                state: "needs_attention".into(),
                attempt: 1,
                version: 1,
                reason: hostile.into(),
                age_s: 5,
                key: "payments:acme:m-1".into(),
                behind_in_line: 0,
            }],
            since_utc: None,
        };
        let html = render_attention(&report, &OperatorCommands::new(None), None).into_string();
        assert!(
            !html
                .chars()
                .any(|c| c != '\n' && crate::domain::table::is_control(c)),
            "{html:?}"
        );
        assert!(
            html.contains(
                "&lt;b&gt;x&lt;/b&gt;\\u001b]8;;https://evil.example\\u0007\\u202etxt.exe\\r\\nline"
            ),
            "{html}"
        );
        assert!(
            html.contains("acme\\u2066") && html.contains("m-1\\u009b"),
            "{html}"
        );
    }
}
