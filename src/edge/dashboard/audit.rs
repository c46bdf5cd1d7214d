//! `GET /audit`: the operator audit on the page, newest first, a page at a time (`before`:
//! the id the previous page ended at), filtered by actor and time like `claimd audit`.

use super::layout::shell;
use super::{PageSession, html_page};
use crate::edge::AppState;
use crate::edge::http::session::Session;
use crate::ops::audit::{self, AuditQuery};
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::html;

/// Lines per page.
pub const PAGE_LINES: u32 = 50;

/// `GET /audit?actor=&since=&before=`.
pub async fn audit_page(
    State(state): State<AppState>,
    session: Option<Extension<Session>>,
    Query(mut q): Query<AuditQuery>,
) -> Response {
    let session = session.map(|Extension(s)| PageSession::of(&state, s));
    q.limit = Some(q.limit.unwrap_or(PAGE_LINES).min(PAGE_LINES));
    let (entries, error) = match q.filter(chrono::Utc::now()) {
        Ok(f) => match audit::list(state.claimer.store().as_ref(), &f).await {
            Ok(e) => (e, None),
            Err(e) => (
                Vec::new(),
                Some(format!("the store could not be read: {e}")),
            ),
        },
        Err(e) => (Vec::new(), Some(e)),
    };
    let more = entries.len() as u32 == q.limit.unwrap_or(PAGE_LINES);
    let next = entries.last().map(|e| {
        let mut link = format!("/audit?before={}", e.id);
        for (k, v) in [("actor", &q.actor), ("since", &q.since)] {
            if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                link.push_str(&format!("&{k}={}", crate::ops::claim_query::url_escape(v)));
            }
        }
        link
    });
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    let body = html! { main { section {
        h2 { "Audit" }
        p { "Every sign-in, refused sign-in, sign-out, action and account change, newest first. Lines are never changed or deleted." }
        form.search method="get" action="/audit" {
            input type="text" name="actor" value=(v(&q.actor)) placeholder="actor" size="16" aria-label="actor";
            input type="text" name="since" value=(v(&q.since)) placeholder="since: 24h, 2026-05-01" size="18" aria-label="since";
            button type="submit" { "Filter" }
        }
        @if let Some(e) = &error { p.error role="alert" { (e) } }
        table.audit {
            thead { tr { th { "#" } th { "at (UTC)" } th { "actor" } th { "via" } th { "action" } th { "target" } th { "from" } th { "result" } th { "detail" } } }
            tbody {
                @for e in &entries {
                    tr {
                        td { (e.id) }
                        td { (e.at_utc.format("%Y-%m-%d %H:%M:%S")) }
                        td { (super::text::visible(&e.actor)) }
                        td { (e.source) }
                        td { (e.action) }
                        td { code { (super::text::visible(&e.target)) } }
                        td { (super::text::visible(&e.origin)) }
                        td { (super::text::visible(&e.result)) }
                        td.text { (super::text::visible(&e.detail)) }
                    }
                }
            }
        }
        @if entries.is_empty() && error.is_none() { p { "No lines match." } }
        @if more { @if let Some(next) = &next { p { a href=(next) rel="next" { "Older lines" } } } }
    } } };
    let status = if error.is_some() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    html_page(
        status,
        shell("claimd — audit", html! {}, session.as_ref(), false, body),
    )
}
