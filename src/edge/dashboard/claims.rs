//! The console's claim pages: `GET /claims` (search results, filtered and paged by a keyset
//! cursor, as `GET /v1/claims`) and `GET /claims/{consumer}/{message_id}` (one claim: its
//! facts, the provider's answer, its payload, its history, the commands and, signed in, the
//! actions that apply). Handlers read the store; the `render_*` functions are pure.

use super::actions::{Target, claim_forms};
use super::commands::commands_for_claim;
use super::layout::{search_form, shell};
use super::text::human_secs;
use super::text::visible;
use super::{PageSession, html_page};
use crate::domain::claim::{Claim, ClaimState};
use crate::domain::operator_role::Identity;
use crate::edge::AppState;
use crate::edge::http::claims::{PayloadView, TenantQuery, claim_with_history, exposure_of};
use crate::edge::http::problem::{problem, store_down};
use crate::edge::http::session::Session;
use crate::ops::claim_query::{ClaimQuery, PageError, claim_path};
use crate::ops::operator_command::{ClaimRef, OperatorCommands};
use crate::store::read_replica::ReadFrom;
use crate::store::{ClaimCursor, ClaimEvent};
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use maud::{Markup, html};

/// Claims per page of search results.
pub const PAGE_SIZE: u32 = 25;

fn page_session(state: &AppState, session: Option<Extension<Session>>) -> Option<PageSession> {
    session.map(|Extension(s)| PageSession::of(state, s))
}

fn fmt_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A claim's state as a person reads it: `stuck` for a started claim past its lease.
pub fn shown_state(c: &Claim, now: DateTime<Utc>) -> &'static str {
    if c.is_stuck(now) {
        "stuck"
    } else if c.is_scheduled() {
        "scheduled"
    } else if c.waits_in_line() {
        "waiting in line"
    } else {
        c.state.as_str()
    }
}

fn badge(state: &str) -> Markup {
    let class = match state {
        "needs_attention" => "attention",
        "stuck" | "failed" => "stuck",
        "completed" => "done",
        _ => "",
    };
    html! { span class={ "badge " (class) } { (state) } }
}

/// `GET /claims?q=&consumer=&state=&tenant=&since=&until=&cursor=`: search results.
pub async fn search(
    State(state): State<AppState>,
    session: Option<Extension<Session>>,
    who: Option<Extension<Identity>>,
    Query(q): Query<ClaimQuery>,
) -> Response {
    // On the read replica when there is one ([store] read_url): searching never loads the
    // primary.
    let reader = match state.reads.reader().await {
        Ok(r) => r,
        Err(e) => return store_down(e),
    };
    let page = match q.page(reader.store.as_ref(), PAGE_SIZE).await {
        Ok(p) => p,
        Err(PageError::Query(e)) => {
            return problem(StatusCode::BAD_REQUEST, "bad search", &e.to_string());
        }
        Err(PageError::Store(e)) => return store_down(e),
    };
    let consumers = state.config.consumer_names();
    let session = page_session(&state, session);
    let mut claims = page.claims;
    crate::ops::exposure::shown_claims(&state.config, &mut claims, exposure_of(&who));
    let found = Found {
        claims: &claims,
        next: page.next,
        now: page.now,
        read_from: state.reads.has_replica().then_some(&reader.from),
    };
    html_page(
        StatusCode::OK,
        render_search(&q, &consumers, &found, session.as_ref()),
    )
}

/// A page of search results, as read.
#[derive(Debug)]
pub struct Found<'a> {
    /// The claims, newest first.
    pub claims: &'a [Claim],
    /// Where the next page starts.
    pub next: Option<ClaimCursor>,
    /// The database's time they were read at.
    pub now: DateTime<Utc>,
    /// Where they were read, with a read replica (`[store] read_url`): the replica and its
    /// lag, or the primary because the replica could not be read. `None`: no replica.
    pub read_from: Option<&'a ReadFrom>,
}

/// The search results page.
pub fn render_search(
    q: &ClaimQuery,
    consumers: &[String],
    found: &Found<'_>,
    session: Option<&PageSession>,
) -> String {
    let (next, now) = (found.next, found.now);
    let body = html! {
        main {
            (search_form(q, consumers))
            (super::replication::render_read_from(found.read_from))
            section {
                h2 { "Claims" @if q.cursor.is_some() { " (next page)" } }
                p.note {
                    "Newest first. A search text matches a message id, idempotency key or \
                    provider id that is it or starts with it, or a tenant that is it. Open a \
                    claim for its history and what can be done about it."
                }
                @if found.claims.is_empty() {
                    p.clear { "No claim matches." }
                } @else {
                    div.scroll {
                        table.results {
                            thead { tr { th { "claim" } th { "state" } th { "attempt" } th { "received" } th { "reason or answer" } } }
                            tbody {
                                @for c in found.claims {
                                    tr {
                                        td {
                                            a href=(claim_path(c)) { (c.consumer) " / " code { (visible(&c.message_id)) } }
                                            @if !c.tenant.is_empty() { br; span.sub { "tenant " (visible(&c.tenant)) } }
                                        }
                                        td { (badge(shown_state(c, now))) }
                                        td { (c.attempt) }
                                        td { (human_secs((now - c.received_utc).num_milliseconds() as f64 / 1000.0)) " ago" }
                                        td.text { (visible(&summary(c))) }
                                    }
                                }
                            }
                        }
                    }
                }
                p.more {
                    @if q.cursor.is_some() { a href={ "/claims?" (q.at(None)) } { "« first page" } " · " }
                    @if let Some(n) = next { a.next href={ "/claims?" (q.at(Some(&n))) } { "next page »" } }
                    @else { "end of the list" }
                }
            }
        }
    };
    shell("claimd: claims", html! { "search" }, session, false, body)
}

/// One line about a claim: its last error, else the provider's status and answer.
fn summary(c: &Claim) -> String {
    let mut s = c.last_error.clone().unwrap_or_default();
    if let Some(status) = c.provider_status {
        if !s.is_empty() {
            s.push_str(" · ");
        }
        s.push_str(&format!("provider {status}"));
        if let Some(r) = c.provider_response.as_deref().filter(|r| !r.is_empty()) {
            let r: String = r.chars().take(120).collect();
            s.push_str(": ");
            s.push_str(&r);
        }
    }
    s
}

/// `GET /claims/{consumer}/{message_id}?tenant=`: one claim's page.
pub async fn claim(
    State(state): State<AppState>,
    session: Option<Extension<Session>>,
    who: Option<Extension<Identity>>,
    Path((consumer, message_id)): Path<(String, String)>,
    Query(t): Query<TenantQuery>,
) -> Response {
    if let Some(refused) = crate::edge::http::problem::refusal([
        ("consumer", consumer.as_str()),
        ("message_id", &message_id),
        ("tenant", &t.tenant),
    ]) {
        return refused;
    }
    let store = state.claimer.store();
    let key = [consumer.as_str(), &t.tenant, &message_id];
    let found = claim_with_history(store.as_ref(), &state.config, key, exposure_of(&who)).await;
    let now = store.now().await;
    let session = page_session(&state, session);
    let commands = OperatorCommands::for_config(&state.config);
    match (found, now) {
        (Ok(Some((claim, history))), Ok(now)) => {
            let behind = match store.waiting_behind(&claim).await {
                Ok(head) => head,
                Err(e) => return store_down(e),
            };
            let (parent, children) = match store.family(claim.id).await {
                Ok(f) => crate::ops::claim_family::family_links(&f),
                Err(e) => return store_down(e),
            };
            let page = ClaimPage {
                claim: &claim,
                history: &history,
                behind: behind.as_ref(),
                parent: parent.as_ref(),
                children: &children,
            };
            html_page(
                StatusCode::OK,
                render_claim(&page, now, &commands, session.as_ref()),
            )
        }
        (Ok(None), _) => html_page(
            StatusCode::NOT_FOUND,
            shell(
                "claimd: no such claim",
                html! {},
                session.as_ref(),
                false,
                html! { main { section {
                    h2 { "No such claim" }
                    p { "No claim " code { (visible(&consumer)) " / " (visible(&message_id)) }
                        @if !t.tenant.is_empty() { " for tenant " code { (visible(&t.tenant)) } }
                        " (pruned by retention, or another tenant). " a href="/claims" { "Search" } }
                } } },
            ),
        ),
        (Err(e), _) | (_, Err(e)) => store_down(e),
    }
}

/// What one claim's page shows.
pub struct ClaimPage<'a> {
    /// The claim.
    pub claim: &'a Claim,
    /// Its history.
    pub history: &'a [ClaimEvent],
    /// Whom it waits behind in its order key's line, when it waits in one.
    pub behind: Option<&'a crate::store::LineHead>,
    /// The claim whose settle created it (docs/follow-ups.md), while stored.
    pub parent: Option<&'a crate::ops::claim_family::ClaimLink>,
    /// The claims its settles created.
    pub children: &'a [crate::ops::claim_family::ClaimLink],
}

/// One claim's page.
pub fn render_claim(
    page: &ClaimPage<'_>,
    now: DateTime<Utc>,
    commands: &OperatorCommands,
    session: Option<&PageSession>,
) -> String {
    let (c, history) = (page.claim, page.history);
    let state = shown_state(c, now);
    let lease = match (&c.lease_owner, c.lease_until) {
        (_, None) => "-".to_string(),
        (owner, Some(until)) => format!(
            "{} until {}{}",
            owner.as_deref().unwrap_or("nobody"),
            fmt_time(until),
            if until < now { " (expired)" } else { "" }
        ),
    };
    let payload = PayloadView::of(c);
    let mut facts: Vec<(&str, String)> = vec![
        ("consumer", c.consumer.clone()),
        (
            "tenant",
            if c.tenant.is_empty() {
                "-".into()
            } else {
                c.tenant.clone()
            },
        ),
        ("message id", c.message_id.clone()),
        ("idempotency key", c.idem_key.clone()),
        (
            "provider id",
            c.provider_id.clone().unwrap_or_else(|| "-".into()),
        ),
        ("attempt", c.attempt.to_string()),
        ("version", c.version.to_string()),
        ("lease", lease),
        (
            "received",
            format!(
                "{} ({} ago)",
                fmt_time(c.received_utc),
                human_secs((now - c.received_utc).num_milliseconds() as f64 / 1000.0)
            ),
        ),
        (
            "processed",
            c.processed_utc.map(fmt_time).unwrap_or_else(|| "-".into()),
        ),
        (
            "duplicates · mismatches · re-sent",
            format!(
                "{} · {} · {}",
                c.duplicate_count, c.mismatch_count, c.resent_count
            ),
        ),
        (
            "content type",
            if c.content_type.is_empty() {
                "-".into()
            } else {
                c.content_type.clone()
            },
        ),
    ];
    if let Some(at) = c.not_before {
        facts.insert(8, ("not before", fmt_time(at)));
    }
    if let Some(key) = &c.order_key {
        facts.insert(8, ("order key", key.clone()));
    }
    if let Some(h) = page.behind {
        let why = format!("{} ({}, attempt {})", h.message_id, h.state, h.attempt);
        facts.insert(9, ("waiting behind", why));
    }
    if let Some(p) = page.parent {
        facts.push(("follow-up of", p.to_string()));
    }
    for child in page.children {
        facts.push(("follow-up", child.to_string()));
    }
    let claim_ref = ClaimRef {
        consumer: &c.consumer,
        tenant: &c.tenant,
        message_id: &c.message_id,
    };
    let actionable = matches!(c.state, ClaimState::NeedsAttention | ClaimState::Failed);
    let body = html! {
        main {
            (search_form(&ClaimQuery::default(), &[]))
            section.claim {
                h2 { (c.consumer) " / " code { (visible(&c.message_id)) } " " (badge(state)) }
                @if let Some(e) = &c.last_error {
                    div.reason { strong { "reason: " } (visible(e)) }
                }
                div.split {
                    table.facts {
                        tbody { @for (k, v) in &facts { tr { th { (k) } td { (visible(v)) } } } }
                    }
                    div {
                        h3 { "Provider's answer" }
                        p { "status " strong { (c.provider_status.map(|s| s.to_string()).unwrap_or_else(|| "-".into())) }
                            @if c.reconciled { " (from its status endpoint)" } }
                        pre.answer { (visible(c.provider_response.as_deref().unwrap_or("(no answer recorded)"))) }
                        @if let Some(at) = c.erased_utc {
                            h3 { "Payload" }
                            p.erased { "Erased " (fmt_time(at)) ": the payload, the provider's answer and the error are gone; the claim still answers duplicates by its fingerprint and is never sent again." }
                        } @else {
                            h3 { "Payload (" (payload.bytes) " bytes" @if payload.truncated { ", first " (payload.text.len()) " shown" } ")" }
                            pre.payload { (payload.text) }
                        }
                    }
                }
            }
            section {
                h2 { "What to do" }
                div.cmds {
                    @for (when, cmd) in commands_for_claim(commands, claim_ref, state) {
                        span.when { (when) }
                        code { (visible(&cmd)) }
                    }
                }
                @if actionable {
                    @if let Some(s) = session {
                        (claim_forms(&Target::of(c), &s.csrf))
                    } @else {
                        p.note { a href="/signin" { "Sign in" } " to resolve or redrive it from this page." }
                    }
                }
            }
            section {
                h2 { "History (" (history.len()) ")" }
                div.scroll {
                    table.history {
                        thead { tr { th { "at (UTC)" } th { "attempt" } th { "actor" } th { "action" } th { "outcome" } th { "status" } th { "detail" } } }
                        tbody {
                            @for e in history {
                                tr {
                                    td { (e.at_utc.format("%Y-%m-%d %H:%M:%S%.3f")) }
                                    td { (e.attempt) }
                                    td { (visible(&e.actor)) }
                                    td { (e.action) }
                                    td { (e.outcome) }
                                    td { (e.provider_status.map(|s| s.to_string()).unwrap_or_default()) }
                                    td.text { (visible(e.detail.as_deref().unwrap_or(""))) }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    shell(
        &format!("claimd: {} {}", c.consumer, c.message_id),
        html! { "generated " (fmt_time(now)) " (database clock)" },
        session,
        false,
        body,
    )
}
