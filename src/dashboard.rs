//! The operator page: `GET /` on the HTTP listener, behind the admin token.
//!
//! A read-only dashboard served by claimd itself: one HTML document with inline CSS and an
//! inline SVG chart, no script and no external asset, so the binary serves it with nothing else
//! installed. It shows the report's counts per consumer, the sweeper's health, every stuck or
//! parked claim with its reason and the command that resolves it, and how long claims take.
//!
//! Everything that renders is a pure function (data in, `String` out); [`page`] gathers the
//! data — [`report::build`] and two [`ClaimStore::list`](crate::store::ClaimStore::list) calls —
//! and serves it. Every value that comes from data goes through [`escape`].

use crate::claim::ClaimState;
use crate::http::problem::problem;
use crate::http::state::AppState;
use crate::report::{self, AttentionItem, Report, Window};
use crate::store::{ClaimFilter, ConsumerCounts, StoreResult};
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use std::fmt::Write as _;

/// How many of the newest completed claims the time-to-complete chart reads.
pub const COMPLETED_SAMPLE: u32 = 500;

/// How many of the newest `started` claims the open-claim age chart reads.
pub const STARTED_SAMPLE: u32 = 500;

/// Seconds between automatic reloads (`<meta http-equiv="refresh">`). Long enough to select and
/// copy a command before the page reloads.
pub const REFRESH_SECONDS: u32 = 30;

/// The chart's buckets: label and exclusive upper bound in seconds.
pub const BUCKETS: [(&str, f64); 6] = [
    ("<1s", 1.0),
    ("1-5s", 5.0),
    ("5-30s", 30.0),
    ("30s-5m", 300.0),
    ("5m-1h", 3600.0),
    (">1h", f64::INFINITY),
];

/// The bucket (index into [`BUCKETS`]) of a duration in seconds. Negative durations (clock
/// rounding) count as the shortest.
pub fn bucket(seconds: f64) -> usize {
    BUCKETS
        .iter()
        .position(|(_, upper)| seconds < *upper)
        .unwrap_or(BUCKETS.len() - 1)
}

/// Counts durations (seconds) per bucket.
pub fn histogram(seconds: impl IntoIterator<Item = f64>) -> [u64; 6] {
    let mut counts = [0u64; 6];
    for s in seconds {
        counts[bucket(s)] += 1;
    }
    counts
}

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
    /// This worker's instance name.
    pub instance: String,
}

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Quotes a word for a POSIX shell (and zsh) so a pasted command passes it verbatim: plain
/// words stay as they are; anything else goes in single quotes.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/@+,".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A `claimd claims SUB CONSUMER MESSAGE_ID [OPTIONS] [--tenant T]` command line, quoted for a
/// shell. Ids that start with `-` would read as options, so then the options come first and
/// `--` ends them.
fn claims_command(sub: &str, item: &AttentionItem, options: &[&str]) -> String {
    let mut opts: Vec<String> = options.iter().map(|o| o.to_string()).collect();
    if !item.tenant.is_empty() {
        let sep = if item.tenant.starts_with('-') {
            "="
        } else {
            " "
        };
        opts.push(format!("--tenant{sep}{}", shell_quote(&item.tenant)));
    }
    let positional = format!(
        "{} {}",
        shell_quote(&item.consumer),
        shell_quote(&item.message_id)
    );
    let mut cmd = format!("claimd claims {sub}");
    if item.consumer.starts_with('-') || item.message_id.starts_with('-') {
        for o in &opts {
            let _ = write!(cmd, " {o}");
        }
        let _ = write!(cmd, " -- {positional}");
    } else {
        let _ = write!(cmd, " {positional}");
        for o in &opts {
            let _ = write!(cmd, " {o}");
        }
    }
    cmd
}

/// What an operator can do about one claim of the attention list: (when, command), in the
/// order to try them. Plain text; the page escapes it.
pub fn commands_for(item: &AttentionItem) -> Vec<(&'static str, String)> {
    let show = ("look first", claims_command("show", item, &[]));
    if item.state == ClaimState::Started.as_str() {
        vec![show, ("run a sweeper pass now", "claimd sweep".to_string())]
    } else {
        vec![
            show,
            (
                "the provider has the effect",
                claims_command("resolve", item, &["--as completed", "--note \"...\""]),
            ),
            (
                "the provider has no record of it",
                claims_command("redrive", item, &[]),
            ),
        ]
    }
}

/// A duration for people: `0.4s`, `12s`, `4m 12s`, `3h 05m`, `2d 04h`.
pub fn human_secs(s: f64) -> String {
    if !s.is_finite() {
        return "-".into();
    }
    let s = s.max(0.0);
    if s < 10.0 {
        let t = format!("{s:.1}");
        return format!("{}s", t.strip_suffix(".0").unwrap_or(&t));
    }
    let n = s.round() as u64;
    match n {
        0..60 => format!("{n}s"),
        60..3600 => format!("{}m {:02}s", n / 60, n % 60),
        3600..86400 => format!("{}h {:02}m", n / 3600, n % 3600 / 60),
        _ => format!("{}d {:02}h", n / 86400, n % 86400 / 3600),
    }
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

const CSS: &str = r#"
:root{--bg:#f4f5f7;--card:#fff;--ink:#1f2937;--muted:#6b7280;--line:#e5e7eb;
--ok:#047857;--okbg:#ecfdf5;--warn:#b45309;--warnbg:#fff7e6;--bad:#b91c1c;--badbg:#fdecec}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans","Liberation Sans",sans-serif}
header{background:#111827;color:#f9fafb;padding:12px 28px;display:flex;align-items:baseline;gap:14px;flex-wrap:wrap}
header h1{font-size:20px;margin:0;letter-spacing:.02em}
header .what{color:#d1d5db}
header .meta{color:#9ca3af;font-size:12.5px;margin-left:auto}
main{padding:18px 28px 8px;max-width:1500px;margin:0 auto}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:14px 20px 16px;margin-bottom:16px}
h2{font-size:16px;margin:0 0 2px}
h3{font-size:14px;margin:0 0 2px}
.note{color:var(--muted);margin:0 0 10px;font-size:12.5px}
.tiles{display:grid;grid-template-columns:1.3fr repeat(4,1fr);gap:14px;margin-bottom:16px}
.tile{background:var(--card);border:1px solid var(--line);border-left:6px solid #9ca3af;border-radius:8px;padding:10px 14px}
.tile .label{font-size:11.5px;text-transform:uppercase;letter-spacing:.05em;color:var(--muted);font-weight:600}
.tile .value{font-size:25px;font-weight:700;line-height:1.25;white-space:nowrap}
.tile .sub{font-size:12.5px;color:var(--muted)}
.tile.ok{border-left-color:var(--ok)} .tile.ok .value{color:var(--ok)}
.tile.warn{border-left-color:#d97706;background:var(--warnbg)} .tile.warn .value{color:var(--warn)}
.tile.bad{border-left-color:#dc2626;background:var(--badbg)} .tile.bad .value{color:var(--bad)}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:6px 9px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
th{font-size:11.5px;color:var(--muted);font-weight:600;text-transform:uppercase;letter-spacing:.03em;
white-space:normal;vertical-align:bottom}
td.zero{color:#b0b6bf}
td.warn{background:var(--warnbg);color:var(--warn);font-weight:700}
td.bad{background:var(--badbg);color:var(--bad);font-weight:700}
tr.total td{font-weight:600;border-top:2px solid #d1d5db;border-bottom:none}
.clear{color:var(--ok);font-weight:600;margin:6px 0 0}
.item{border:1px solid var(--line);border-left:5px solid #d97706;border-radius:6px;padding:9px 14px 10px;margin-top:10px}
.item.attention{border-left-color:#dc2626}
.item .head{display:flex;gap:10px;align-items:baseline;flex-wrap:wrap}
.badge{display:inline-block;padding:0 8px;border-radius:10px;font-size:12px;font-weight:700}
.badge.attention{background:var(--badbg);color:var(--bad)}
.badge.stuck{background:var(--warnbg);color:var(--warn)}
.who{font-weight:600;word-break:break-all}
.facts{color:var(--muted);font-size:12.5px;margin-left:auto}
.reason{margin:5px 0 7px;word-break:break-word}
.cmds{display:grid;grid-template-columns:200px 1fr;gap:4px 12px;align-items:center}
.cmds .when{color:var(--muted);font-size:12px;text-align:right}
code{font-family:ui-monospace,"DejaVu Sans Mono","Liberation Mono",Menlo,Consolas,monospace;font-size:12.5px}
.cmds code{background:#f3f4f6;border:1px solid var(--line);border-radius:4px;padding:2px 8px;
user-select:all;white-space:pre-wrap;word-break:break-all}
.more{color:var(--muted);margin-top:10px}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:28px}
.charts svg{width:100%;height:auto;display:block}
footer{color:var(--muted);font-size:12px;padding:0 28px 18px;max-width:1500px;margin:0 auto}
@media (max-width:900px){.tiles{grid-template-columns:repeat(2,1fr)}.charts{grid-template-columns:1fr}}
"#;

/// The whole page.
pub fn render(d: &Dashboard) -> String {
    let r = &d.report;
    let stuck: i64 = r.consumers.iter().map(|c| c.stuck).sum();
    let attention: i64 = r.consumers.iter().map(|c| c.needs_attention).sum();
    let title = match stuck + attention {
        0 if r.sweeper.healthy => "claimd: all clear".to_string(),
        0 => "claimd: sweeper NOT RUNNING".to_string(),
        n => format!("claimd: {n} need a look"),
    };
    let mut out = String::with_capacity(16 * 1024);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">\
         <link rel=\"icon\" href=\"data:,\">\
         <title>{}</title><style>{CSS}</style></head><body>\n",
        escape(&title)
    );
    let _ = write!(
        out,
        "<header><h1>claimd</h1><span class=\"what\">operator page</span>\
         <span class=\"meta\">generated {} (database clock) &middot; store {} &middot; \
         instance {} &middot; reloads every {REFRESH_SECONDS}s</span></header>\n<main>\n",
        escape(&fmt_time(r.generated_utc)),
        escape(&d.store),
        escape(&d.instance)
    );
    out.push_str(&render_tiles(r, d.window));
    out.push_str(&render_counts(&r.consumers, d.window));
    out.push_str(&render_charts(d));
    out.push_str(&render_attention(r));
    out.push_str(
        "</main>\n<footer>Read-only. The same figures: <code>claimd report --format json</code> \
         or <code>GET /v1/report</code>. What each reason means and what to do: \
         docs/operations.md. Add <code>--config PATH</code> to the commands when this \
         worker's configuration is not <code>config/default.toml</code>.</footer>\n\
         </body></html>\n",
    );
    out
}

fn tile(out: &mut String, class: &str, label: &str, value: &str, sub: &str) {
    let _ = write!(
        out,
        "<div class=\"tile {class}\"><div class=\"label\">{}</div>\
         <div class=\"value\">{}</div><div class=\"sub\">{}</div></div>",
        escape(label),
        escape(value),
        escape(sub)
    );
}

/// The row of tiles: sweeper health, stuck, needs attention, oldest started, failed.
pub fn render_tiles(r: &Report, window: Window) -> String {
    let mut out = String::from("<div class=\"tiles\">");
    let last = match r.sweeper.last_run_utc {
        Some(t) => format!(
            "last pass {} ago",
            human_secs((r.generated_utc - t).num_milliseconds() as f64 / 1000.0)
        ),
        None => "last pass: never".into(),
    };
    if r.sweeper.status == "starting" {
        // Just started, no pass yet: not a failure, but not a safety net yet either.
        tile(
            &mut out,
            "warn",
            "sweeper",
            "STARTING",
            &format!("{last}; first pass due within 3 schedule periods of this worker's start"),
        );
    } else if r.sweeper.healthy {
        tile(&mut out, "ok", "sweeper", "healthy", &last);
    } else {
        tile(
            &mut out,
            "bad",
            "sweeper",
            "NOT RUNNING",
            &format!("{last}; is a claimd run up?"),
        );
    }
    let sum = |f: fn(&ConsumerCounts) -> i64| r.consumers.iter().map(f).sum::<i64>();
    let stuck = sum(|c| c.stuck);
    let attention = sum(|c| c.needs_attention);
    let failed = sum(|c| c.failed);
    tile(
        &mut out,
        if stuck > 0 { "warn" } else { "ok" },
        "stuck",
        &stuck.to_string(),
        "started, lease expired",
    );
    tile(
        &mut out,
        if attention > 0 { "bad" } else { "ok" },
        "needs attention",
        &attention.to_string(),
        "parked for a person",
    );
    let oldest = r
        .consumers
        .iter()
        .filter_map(|c| c.oldest_started_age_s)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    tile(
        &mut out,
        if stuck > 0 { "warn" } else { "" },
        "oldest started",
        &oldest.map_or("-".into(), human_secs),
        "age of the oldest started claim",
    );
    tile(
        &mut out,
        "",
        "failed",
        &failed.to_string(),
        &format!("refused by the provider in {}", window_label(window)),
    );
    out.push_str("</div>\n");
    out
}

fn count_cell(out: &mut String, n: i64, hot: &str) {
    let class = if n == 0 { "zero" } else { hot };
    let _ = write!(out, "<td class=\"{class}\">{n}</td>");
}

fn secs_cell(out: &mut String, v: Option<f64>, hot: &str) {
    match v {
        Some(s) => {
            let _ = write!(out, "<td class=\"{hot}\">{}</td>", escape(&human_secs(s)));
        }
        None => out.push_str("<td class=\"zero\">-</td>"),
    }
}

/// The table of counts per consumer, stuck and attention highlighted.
pub fn render_counts(consumers: &[ConsumerCounts], window: Window) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<section><h2>Claims by consumer</h2><p class=\"note\">received, duplicates, \
         mismatches, completed, failed, resent and the receive-to-complete times (p50, p95) \
         over {}; started, stuck, needs attention and the oldest started claim over all \
         claims.</p><div class=\"scroll\"><table><thead><tr><th>consumer</th>\
         <th>received</th><th>duplicates</th><th>mismatches</th><th>started</th>\
         <th>stuck</th><th>completed</th><th>failed</th><th>needs attention</th>\
         <th>resent</th><th>oldest started</th><th>p50</th><th>p95</th>\
         </tr></thead><tbody>",
        escape(&window_label(window))
    );
    let row = |out: &mut String, c: &ConsumerCounts, class: &str| {
        let _ = write!(
            out,
            "<tr class=\"{class}\"><td>{}</td>",
            escape(&c.consumer)
        );
        count_cell(out, c.received, "");
        count_cell(out, c.duplicates, "");
        count_cell(out, c.payload_mismatches, "warn");
        count_cell(out, c.started, "");
        count_cell(out, c.stuck, "bad");
        count_cell(out, c.completed, "");
        count_cell(out, c.failed, "");
        count_cell(out, c.needs_attention, "bad");
        count_cell(out, c.resent, "");
        secs_cell(
            out,
            c.oldest_started_age_s,
            if c.stuck > 0 { "warn" } else { "" },
        );
        secs_cell(out, c.p50_complete_s, "");
        secs_cell(out, c.p95_complete_s, "");
        out.push_str("</tr>");
    };
    for c in consumers {
        row(&mut out, c, "");
    }
    if consumers.len() > 1 {
        let sum = |f: fn(&ConsumerCounts) -> i64| consumers.iter().map(f).sum::<i64>();
        let total = ConsumerCounts {
            consumer: "all consumers".into(),
            received: sum(|c| c.received),
            duplicates: sum(|c| c.duplicates),
            payload_mismatches: sum(|c| c.payload_mismatches),
            started: sum(|c| c.started),
            stuck: sum(|c| c.stuck),
            completed: sum(|c| c.completed),
            failed: sum(|c| c.failed),
            needs_attention: sum(|c| c.needs_attention),
            resent: sum(|c| c.resent),
            dead_lettered: sum(|c| c.dead_lettered),
            oldest_started_age_s: consumers
                .iter()
                .filter_map(|c| c.oldest_started_age_s)
                .reduce(f64::max),
            p50_complete_s: None,
            p95_complete_s: None,
        };
        row(&mut out, &total, "total");
    }
    if consumers.is_empty() {
        out.push_str("<tr><td colspan=\"13\">no consumers configured</td></tr>");
    }
    out.push_str("</tbody></table></div></section>\n");
    out
}

/// The stuck and parked claims, each with its reason, age, attempt and commands.
pub fn render_attention(r: &Report) -> String {
    let stuck: i64 = r.consumers.iter().map(|c| c.stuck).sum();
    let parked: i64 = r.consumers.iter().map(|c| c.needs_attention).sum();
    let mut out = String::new();
    let _ = write!(
        out,
        "<section><h2>Needs a look ({})</h2><p class=\"note\">Parked claims wait for a \
         decision: check the provider (its records for the claim's key), then resolve or \
         redrive. Stuck claims wait for the next sweeper pass. Click a command to select \
         it.</p>",
        stuck + parked
    );
    if r.attention.is_empty() {
        out.push_str("<p class=\"clear\">Nothing is stuck and nothing needs attention.</p>");
    }
    for a in &r.attention {
        let is_stuck = a.state == ClaimState::Started.as_str();
        let (class, badge) = if is_stuck {
            ("stuck", "stuck")
        } else {
            ("attention", "needs attention")
        };
        let tenant = if a.tenant.is_empty() {
            String::new()
        } else {
            format!(" &middot; tenant {}", escape(&a.tenant))
        };
        let _ = write!(
            out,
            "<div class=\"item {class}\"><div class=\"head\">\
             <span class=\"badge {class}\">{badge}</span>\
             <span class=\"who\">{} &middot; <code>{}</code>{tenant}</span>\
             <span class=\"facts\">attempt {} &middot; received {} ago</span></div>\
             <div class=\"reason\">{}</div><div class=\"cmds\">",
            escape(&a.consumer),
            escape(&a.message_id),
            a.attempt,
            escape(&human_secs(a.age_s as f64)),
            if a.reason.is_empty() {
                "(no reason recorded)".to_string()
            } else {
                escape(&a.reason)
            }
        );
        for (when, cmd) in commands_for(a) {
            let _ = write!(
                out,
                "<span class=\"when\">{}</span><code>{}</code>",
                escape(when),
                escape(&cmd)
            );
        }
        out.push_str("</div></div>");
    }
    let shown = r.attention.len() as i64;
    if shown < stuck + parked {
        let _ = write!(
            out,
            "<p class=\"more\">Showing {shown} of {}; <code>claimd claims list --state \
             needs_attention</code> and <code>claimd claims list --stuck</code> list them all.</p>",
            stuck + parked
        );
    }
    out.push_str("</section>\n");
    out
}

/// One stacked series of a histogram.
#[derive(Debug, Clone)]
pub struct Series<'a> {
    /// Legend text.
    pub name: &'a str,
    /// Fill colour (`#rrggbb`).
    pub color: &'a str,
    /// Count per bucket of [`BUCKETS`].
    pub counts: [u64; 6],
}

/// A round step for an axis going up to `max` in about four steps (1, 2 or 5 × 10ⁿ).
fn nice_step(max: u64) -> u64 {
    let rough = (max as f64 / 4.0).max(1.0);
    let mut pow = 1u64;
    while (pow as f64) * 10.0 <= rough {
        pow *= 10;
    }
    [1, 2, 5, 10]
        .into_iter()
        .map(|m| m * pow)
        .find(|s| *s as f64 >= rough)
        .unwrap_or(10 * pow)
}

/// A histogram over [`BUCKETS`] as an inline SVG: stacked bars, the total above each bar,
/// bucket labels under the x axis, a y axis with round ticks, and a legend.
pub fn histogram_svg(aria_label: &str, x_title: &str, series: &[Series<'_>]) -> String {
    const W: f64 = 600.0;
    const H: f64 = 280.0;
    const LEFT: f64 = 52.0;
    const RIGHT: f64 = 14.0;
    const TOP: f64 = 50.0;
    const BOTTOM: f64 = 50.0;
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let totals: Vec<u64> = (0..BUCKETS.len())
        .map(|i| series.iter().map(|s| s.counts[i]).sum())
        .collect();
    let max = totals.iter().copied().max().unwrap_or(0);
    let step = nice_step(max);
    let top = (max.div_ceil(step)).max(1) * step;
    let y = |v: f64| TOP + plot_h - v / top as f64 * plot_h;
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" role=\"img\" \
         aria-label=\"{}\" font-size=\"13\" fill=\"#374151\">",
        escape(aria_label)
    );
    // Legend.
    let mut lx = LEFT;
    for s in series {
        let _ = write!(
            out,
            "<rect x=\"{lx}\" y=\"10\" width=\"12\" height=\"12\" rx=\"2\" fill=\"{}\"/>\
             <text x=\"{}\" y=\"20.5\">{}</text>",
            escape(s.color),
            lx + 17.0,
            escape(s.name)
        );
        lx += 17.0 + 7.6 * s.name.chars().count() as f64 + 22.0;
    }
    // Y axis: grid lines and tick labels.
    let mut t = 0;
    while t <= top {
        let yy = y(t as f64);
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"{}\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#6b7280\">{t}</text>",
            W - RIGHT,
            if t == 0 { "#9ca3af" } else { "#e5e7eb" },
            LEFT - 8.0,
            yy + 4.5
        );
        t += step;
    }
    // Bars.
    let slot = plot_w / BUCKETS.len() as f64;
    let bw = slot * 0.62;
    for (i, (label, _)) in BUCKETS.iter().enumerate() {
        let x = LEFT + i as f64 * slot + (slot - bw) / 2.0;
        let mut base = 0u64;
        for s in series {
            let n = s.counts[i];
            if n == 0 {
                continue;
            }
            let y0 = y(base as f64);
            let y1 = y((base + n) as f64);
            let _ = write!(
                out,
                "<rect x=\"{x:.1}\" y=\"{y1:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" \
                 fill=\"{}\"><title>{}: {n} ({})</title></rect>",
                (y0 - y1).max(0.5),
                escape(s.color),
                escape(s.name),
                escape(label)
            );
            base += n;
        }
        let cx = x + bw / 2.0;
        let _ = write!(
            out,
            "<text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-weight=\"700\" \
             fill=\"{}\">{}</text>\
             <text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            y(totals[i] as f64) - 6.0,
            if totals[i] == 0 { "#9ca3af" } else { "#111827" },
            totals[i],
            TOP + plot_h + 19.0,
            escape(label)
        );
    }
    let _ = write!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#6b7280\">{}</text></svg>",
        LEFT + plot_w / 2.0,
        H - 8.0,
        escape(x_title)
    );
    out
}

/// The two charts: time to complete of recent completed claims, and age of open claims.
pub fn render_charts(d: &Dashboard) -> String {
    let completed = histogram(d.completed_s.iter().copied());
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
    let mut out = String::from("<section><h2>Timing</h2><div class=\"charts\"><div>");
    let _ = write!(
        out,
        "<h3>Time to complete</h3><p class=\"note\">processed minus received, newest {} \
         completed claims received in {}</p>",
        d.completed_s.len(),
        escape(&window_label(d.window))
    );
    out.push_str(&histogram_svg(
        "histogram of time to complete",
        "receive → complete",
        &[Series {
            name: "completed",
            color: "#0f766e",
            counts: completed,
        }],
    ));
    let _ = write!(
        out,
        "</div><div><h3>Age of open claims</h3><p class=\"note\">now minus received, {} of \
         {open_total} open claims (started and needs attention)</p>",
        d.open.len()
    );
    out.push_str(&histogram_svg(
        "histogram of open claim age",
        "age",
        &[
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
        ],
    ));
    out.push_str("</div></div></section>\n");
    out
}

/// Reads everything the page shows. `window` bounds the throughput figures and the
/// time-to-complete sample; open work is counted in full.
pub async fn gather(state: &AppState, window: Window) -> StoreResult<Dashboard> {
    let store = state.claimer.store();
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
        instance: state.claimer.instance().to_string(),
    })
}

/// `GET /?since=DUR`: the operator page. `since` bounds the throughput figures (default 24h).
#[derive(Debug, Deserialize)]
pub struct PageQuery {
    /// Throughput window, like `1h` or `7d`, or `all`.
    pub since: Option<String>,
}

/// `GET /`: gathers the data and serves the page (behind the admin token, see `api::router`).
pub async fn page(State(state): State<AppState>, Query(q): Query<PageQuery>) -> Response {
    let window = match q.since.as_deref().map(str::parse::<Window>).transpose() {
        Ok(w) => w.unwrap_or_default(),
        Err(e) => return problem(StatusCode::BAD_REQUEST, "bad since", &e.to_string()),
    };
    match gather(&state, window).await {
        Ok(d) => html(render(&d)),
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

/// An HTML answer that runs no script, loads nothing, is never framed and never cached.
fn html(body: String) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; \
             frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::SweeperHealth;

    fn item(state: &str, consumer: &str, tenant: &str, id: &str, reason: &str) -> AttentionItem {
        AttentionItem {
            consumer: consumer.into(),
            tenant: tenant.into(),
            message_id: id.into(),
            state: state.into(),
            attempt: 3,
            reason: reason.into(),
            age_s: 4000,
        }
    }

    fn dashboard(attention: Vec<AttentionItem>, healthy: bool) -> Dashboard {
        let now = Utc::now();
        Dashboard {
            report: Report {
                generated_utc: now,
                sweeper: SweeperHealth {
                    last_run_utc: healthy.then(|| now - chrono::Duration::seconds(4)),
                    healthy,
                    ..Default::default()
                },
                since_utc: None,
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
            instance: "host-1".into(),
        }
    }

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(
            escape(r#"<a href="x" b='y'>&amp;</a>"#),
            "&lt;a href=&quot;x&quot; b=&#39;y&#39;&gt;&amp;amp;&lt;/a&gt;"
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
    fn parked_claims_get_resolve_and_redrive_commands_with_their_tenant() {
        let a = item("needs_attention", "payments", "", "order-1", "r");
        let cmds: Vec<String> = commands_for(&a).into_iter().map(|(_, c)| c).collect();
        assert_eq!(
            cmds,
            [
                "claimd claims show payments order-1",
                "claimd claims resolve payments order-1 --as completed --note \"...\"",
                "claimd claims redrive payments order-1",
            ]
        );
        let a = item("needs_attention", "payments", "acme", "order-1", "r");
        let cmds: Vec<String> = commands_for(&a).into_iter().map(|(_, c)| c).collect();
        assert_eq!(
            cmds[1],
            "claimd claims resolve payments order-1 --as completed --note \"...\" --tenant acme"
        );
        assert_eq!(
            cmds[2],
            "claimd claims redrive payments order-1 --tenant acme"
        );
    }

    #[test]
    fn stuck_claims_point_at_a_sweeper_pass() {
        let a = item("started", "payments", "t", "order-2", "lease expired");
        let cmds = commands_for(&a);
        assert_eq!(cmds.last().unwrap().1, "claimd sweep");
        assert_eq!(cmds[0].1, "claimd claims show payments order-2 --tenant t");
    }

    #[test]
    fn commands_quote_what_a_shell_would_read() {
        assert_eq!(shell_quote("order-1:a/b@c.d"), "order-1:a/b@c.d");
        assert_eq!(shell_quote("$(rm -rf ~)"), "'$(rm -rf ~)'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("a;b"), "'a;b'");
        assert_eq!(shell_quote(""), "''");
        let a = item("needs_attention", "payments", "-t", "-x", "r");
        assert_eq!(
            commands_for(&a)[2].1,
            "claimd claims redrive --tenant=-t -- payments -x"
        );
        let a = item("needs_attention", "payments", "a b", "`id`", "r");
        assert_eq!(
            commands_for(&a)[2].1,
            "claimd claims redrive payments '`id`' --tenant 'a b'"
        );
    }

    #[test]
    fn buckets_split_at_their_bounds() {
        assert_eq!(bucket(-0.01), 0);
        assert_eq!(bucket(0.999), 0);
        assert_eq!(bucket(1.0), 1);
        assert_eq!(bucket(4.99), 1);
        assert_eq!(bucket(5.0), 2);
        assert_eq!(bucket(30.0), 3);
        assert_eq!(bucket(299.0), 3);
        assert_eq!(bucket(300.0), 4);
        assert_eq!(bucket(3600.0), 5);
        assert_eq!(bucket(1e12), 5);
        assert_eq!(histogram([0.1, 0.2, 2.0, 40.0, 9000.0]), [2, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn the_chart_labels_buckets_and_counts() {
        let svg = histogram_svg(
            "x",
            "receive → complete",
            &[Series {
                name: "completed",
                color: "#0f766e",
                counts: [12, 3, 0, 1, 0, 0],
            }],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        for (label, _) in BUCKETS {
            assert!(
                svg.contains(&format!(">{}</text>", escape(label))),
                "{label}"
            );
        }
        assert!(svg.contains(">12</text>") && svg.contains(">3</text>"));
        assert!(svg.contains("receive → complete"));
        assert_eq!(svg.matches("<rect").count(), 1 + 3, "legend and three bars");
    }

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(nice_step(0), 1);
        assert_eq!(nice_step(3), 1);
        assert_eq!(nice_step(12), 5);
        assert_eq!(nice_step(40), 10);
        assert_eq!(nice_step(1234), 500);
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
        assert_eq!(human_secs(0.42), "0.4s");
        assert_eq!(human_secs(3.0), "3s");
        assert_eq!(human_secs(59.4), "59s");
        assert_eq!(human_secs(754.0), "12m 34s");
        assert_eq!(human_secs(4000.0), "1h 06m");
        assert_eq!(human_secs(200_000.0), "2d 07h");
        assert_eq!(human_secs(-1.0), "0s");
    }
}
