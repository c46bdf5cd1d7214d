//! What every page of the console shares: the document head (stylesheet, no script), the
//! header with the sign-in state, and the search box.

use super::text::CSS;
use super::{PageSession, REFRESH_SECONDS};
use crate::ops::claim_query::ClaimQuery;
use maud::{DOCTYPE, Markup, PreEscaped, html};

/// A whole page: `title`, the header (with `meta` on the right), then `body`. It reloads
/// every [`REFRESH_SECONDS`] when `refresh` and nobody is signed in (a signed-in person may be
/// typing a note).
pub(super) fn shell(
    title: &str,
    meta: Markup,
    session: Option<&PageSession>,
    refresh: bool,
    body: Markup,
) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if refresh && session.is_none() {
                    meta http-equiv="refresh" content=(REFRESH_SECONDS);
                }
                link rel="icon" href="data:,";
                title { (title) }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    h1 { a href="/" { "claimd" } }
                    span.what { "operator page" }
                    span.meta { (meta) }
                    @if let Some(s) = session {
                        form.signout method="post" action="/signout" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            "signed in as " strong { (s.name) } " (" (s.role) ") · "
                            a href="/" { "reload" } " · "
                            a href="/audit" { "audit" } " "
                            button type="submit" { "Sign out" }
                        }
                    } @else {
                        a.signin href="/signin" { "Sign in to act" }
                    }
                }
                (body)
            }
        }
    }
    .into_string()
}

/// The search box and its filters (a plain GET form to `/claims`), filled in with `q`.
pub fn search_form(q: &ClaimQuery, consumers: &[String]) -> Markup {
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    let state = v(&q.state);
    let consumer = v(&q.consumer);
    html! {
        form.search method="get" action="/claims" role="search" {
            input type="search" name="q" value=(v(&q.q)) aria-label="search claims"
                placeholder="message id, idempotency key, provider id (or their beginning), tenant";
            select name="consumer" aria-label="consumer" {
                option value="" { "any consumer" }
                @for c in consumers { option value=(c) selected[*c == consumer] { (c) } }
            }
            select name="state" aria-label="state" {
                option value="" { "any state" }
                @for s in ["needs_attention", "stuck", "failed", "started", "pending", "completed"] {
                    option value=(s) selected[s == state] { (s) }
                }
            }
            input type="text" name="tenant" value=(v(&q.tenant)) placeholder="tenant" size="10" aria-label="tenant";
            input type="text" name="since" value=(v(&q.since)) placeholder="since: 24h, 2026-05-01 12:00" size="16" aria-label="received since";
            input type="text" name="until" value=(v(&q.until)) placeholder="until" size="12" aria-label="received until";
            button type="submit" { "Search" }
        }
    }
}
