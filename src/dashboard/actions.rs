//! Acting from the page: resolve or redrive one parked claim, or every parked claim of a
//! consumer whose reason starts with some text. Every action is shown before it is taken: the
//! page's forms post to `/actions/preview`, which lists exactly the claims that will change
//! and how; its confirm button posts that list to `/actions/apply`, which acts on each claim
//! through the same fenced store transitions as `claimd claims resolve|redrive`, recorded in
//! the history as `page:<name>` (the name given at sign-in).
//!
//! Only a signed-in browser acts (the forms carry the session's CSRF token, checked by the
//! admin check before these handlers run); a page opened with the bearer header or without an
//! admin token stays read-only. Apply acts on the claims the person saw, not on a filter run
//! again: claims that moved meanwhile are reported as not actionable, not changed.

use crate::claim::ClaimState;
use crate::http::session::Session;
use crate::http::state::AppState;
use crate::store::ClaimFilter;
use axum::Form;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

/// The most claims one bulk action takes (a larger set: narrow the reason, or repeat).
pub const BULK_LIMIT: u32 = 200;

/// What an action does to each claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Settle as `completed` (the provider has the effect).
    Complete,
    /// Settle as `failed` (it does not and will not).
    Fail,
    /// Back to `started` for the next sweep, same key.
    Redrive,
}

impl Action {
    fn parse(s: &str) -> Option<Action> {
        match s {
            "complete" => Some(Action::Complete),
            "fail" => Some(Action::Fail),
            "redrive" => Some(Action::Redrive),
            _ => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Action::Complete => "complete",
            Action::Fail => "fail",
            Action::Redrive => "redrive",
        }
    }
    fn describe(self) -> &'static str {
        match self {
            Action::Complete => "resolve as completed (the provider has the effect)",
            Action::Fail => "resolve as failed (the provider does not have it and never will)",
            Action::Redrive => {
                "redrive: back to started, sent again with the same key by the next sweep"
            }
        }
    }
}

/// One claim, as the forms carry it: `consumer`, tab, `tenant`, tab, `message_id` (none of the
/// three can hold a tab).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Consumer.
    pub consumer: String,
    /// Tenant (empty: none).
    pub tenant: String,
    /// Message id.
    pub message_id: String,
}

impl Target {
    /// The form value.
    pub fn encode(&self) -> String {
        format!("{}\t{}\t{}", self.consumer, self.tenant, self.message_id)
    }
    fn decode(s: &str) -> Option<Target> {
        let mut p = s.splitn(3, '\t');
        Some(Target {
            consumer: p.next()?.to_string(),
            tenant: p.next()?.to_string(),
            message_id: p.next()?.to_string(),
        })
    }
    fn label(&self) -> String {
        if self.tenant.is_empty() {
            format!("{}/{}", self.consumer, self.message_id)
        } else {
            format!(
                "{}/{} (tenant {})",
                self.consumer, self.message_id, self.tenant
            )
        }
    }
}

/// A posted action form: `action`, `note`, `claim` (repeated) or `consumer` + `reason` for a
/// bulk selection. Repeated fields rule out a derived struct.
#[derive(Debug, Default)]
struct Posted {
    action: Option<Action>,
    note: String,
    claims: Vec<Target>,
    consumer: Option<String>,
    reason: String,
}

impl Posted {
    fn read(fields: Vec<(String, String)>) -> Posted {
        let mut p = Posted::default();
        for (k, v) in fields {
            match k.as_str() {
                "action" => p.action = Action::parse(&v),
                "note" => p.note = v.trim().to_string(),
                "claim" => p.claims.extend(Target::decode(&v)),
                "consumer" if !v.is_empty() => p.consumer = Some(v),
                "reason" => p.reason = v.trim().to_string(),
                _ => {}
            }
        }
        p
    }
}

fn page(status: StatusCode, title: &str, body: maud::Markup) -> Response {
    let html = maud::html! {
        (maud::DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "claimd: " (title) }
                style { (maud::PreEscaped(super::render::CSS)) }
            }
            body { main { section { h2 { (title) } (body) } } }
        }
    };
    (status, Html(html.into_string())).into_response()
}

fn refuse(why: &str) -> Response {
    page(
        StatusCode::BAD_REQUEST,
        "Nothing was done",
        maud::html! { p.error { (why) } p { a href="/" { "Back to the page" } } },
    )
}

fn read_only() -> Response {
    page(
        StatusCode::FORBIDDEN,
        "Sign in to act",
        maud::html! {
            p { "Actions from the page need a signed-in browser (" a href="/signin" { "/signin" }
                "); with a bearer token, use " code { "POST /v1/claims/{consumer}/{id}/resolve|redrive" } "." }
        },
    )
}

/// What both steps check first: a signed-in person, an action, and a note for a resolve.
fn admit(
    session: Option<Extension<Session>>,
    fields: Vec<(String, String)>,
) -> Result<(Session, Posted, Action), Box<Response>> {
    let Some(Extension(session)) = session else {
        return Err(Box::new(read_only()));
    };
    let p = Posted::read(fields);
    let Some(action) = p.action else {
        return Err(Box::new(refuse(
            "Choose an action: complete, fail or redrive.",
        )));
    };
    if action != Action::Redrive && p.note.is_empty() {
        return Err(Box::new(refuse(
            "A resolve needs a note: what the provider shows for the claim's key.",
        )));
    }
    Ok((session, p, action))
}

/// `POST /actions/preview`: what the action would do, to which claims, with a confirm button.
pub async fn preview(
    State(state): State<AppState>,
    session: Option<Extension<Session>>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let (session, mut p, action) = match admit(session, fields) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    if let Some(consumer) = p.consumer.clone() {
        let filter = ClaimFilter {
            state: Some(ClaimState::NeedsAttention),
            consumer: Some(consumer),
            stuck: false,
            since: None,
            limit: BULK_LIMIT + 1,
        };
        let parked = match state.claimer.store().list(&filter).await {
            Ok(c) => c,
            Err(e) => return crate::http::problem::store_down(e),
        };
        p.claims = parked
            .into_iter()
            .filter(|c| c.last_error.as_deref().unwrap_or("").starts_with(&p.reason))
            .map(|c| Target {
                consumer: c.consumer,
                tenant: c.tenant,
                message_id: c.message_id,
            })
            .collect();
    }
    if p.claims.is_empty() {
        return refuse("No parked claim matches: nothing would change.");
    }
    if p.claims.len() > BULK_LIMIT as usize {
        return refuse(&format!(
            "Over {BULK_LIMIT} claims match: narrow the reason, or act on them in parts."
        ));
    }
    let csrf = session.csrf(&state.config.http.admin_token);
    let n = p.claims.len();
    page(
        StatusCode::OK,
        "Confirm",
        maud::html! {
            p {
                "This will " strong { (action.describe()) } " for " strong { (n) " claim" @if n != 1 { "s" } }
                ", recorded as " code { "page:" (session.name) } @if !p.note.is_empty() { " with the note “" (p.note) "”" } "."
            }
            ul { @for t in &p.claims { li { code { (t.label()) } } } }
            form method="post" action="/actions/apply" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="action" value=(action.name());
                input type="hidden" name="note" value=(p.note);
                @for t in &p.claims { input type="hidden" name="claim" value=(t.encode()); }
                button type="submit" { "Confirm: " (action.name()) " " (n) }
                " " a href="/" { "Cancel" }
            }
        },
    )
}

/// `POST /actions/apply`: acts on each listed claim and says what happened to each.
pub async fn apply(
    State(state): State<AppState>,
    session: Option<Extension<Session>>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let (session, p, action) = match admit(session, fields) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    if p.claims.is_empty() || p.claims.len() > BULK_LIMIT as usize {
        return refuse("No claims, or too many, in the form: start again from the page.");
    }
    let actor = format!("page:{}", session.name);
    let store = state.claimer.store();
    let mut rows = Vec::new();
    for t in &p.claims {
        let outcome = match action {
            Action::Complete | Action::Fail => {
                let to = if action == Action::Complete {
                    ClaimState::Completed
                } else {
                    ClaimState::Failed
                };
                store
                    .resolve(&t.consumer, &t.tenant, &t.message_id, to, &actor, &p.note)
                    .await
            }
            Action::Redrive => {
                store
                    .redrive(&t.consumer, &t.tenant, &t.message_id, &actor)
                    .await
            }
        };
        let said = match outcome {
            Ok(Some(Ok(c))) => format!("now {} (attempt {})", c.state, c.attempt),
            Ok(Some(Err(s))) => format!("not changed: it is {s} now"),
            Ok(None) => "not changed: no such claim any more".to_string(),
            Err(e) => format!("not changed: the store failed ({e})"),
        };
        tracing::info!(actor = %actor, action = action.name(), claim = %t.label(), result = %said, "operator page action");
        rows.push((t.label(), said));
    }
    page(
        StatusCode::OK,
        "Done",
        maud::html! {
            table {
                thead { tr { th { "claim" } th { "result" } } }
                tbody { @for (who, said) in &rows { tr { td { code { (who) } } td { (said) } } } }
            }
            p { a href="/" { "Back to the page" } }
        },
    )
}

/// The forms on a parked claim's card: resolve (with a note) or redrive, each to the preview.
pub fn claim_forms(target: &Target, csrf: &str) -> maud::Markup {
    maud::html! {
        form.act method="post" action="/actions/preview" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="claim" value=(target.encode());
            select name="action" aria-label="action" {
                option value="complete" { "resolve: completed" }
                option value="fail" { "resolve: failed" }
                option value="redrive" { "redrive" }
            }
            input type="text" name="note" placeholder="note: what the provider shows (required to resolve)" size="40";
            button type="submit" { "Review…" }
        }
    }
}

/// The bulk form: every parked claim of a consumer whose reason starts with some text.
pub fn bulk_form(consumers: &[String], csrf: &str) -> maud::Markup {
    maud::html! {
        form.act.bulk method="post" action="/actions/preview" {
            input type="hidden" name="csrf" value=(csrf);
            "All parked claims of "
            select name="consumer" aria-label="consumer" { @for c in consumers { option value=(c) { (c) } } }
            " whose reason starts with "
            input type="text" name="reason" placeholder="(any reason)" size="24";
            " → "
            select name="action" aria-label="action" {
                option value="redrive" { "redrive" }
                option value="complete" { "resolve: completed" }
                option value="fail" { "resolve: failed" }
            }
            input type="text" name="note" placeholder="note (required to resolve)" size="28";
            button type="submit" { "Review…" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_round_trip_through_the_form() {
        let t = Target {
            consumer: "payments".into(),
            tenant: "".into(),
            message_id: "-odd id:1".into(),
        };
        assert_eq!(Target::decode(&t.encode()), Some(t));
        assert_eq!(Target::decode("no-tabs"), None);
    }

    #[test]
    fn a_posted_form_reads_repeated_claims_and_the_action() {
        let p = Posted::read(vec![
            ("action".into(), "fail".into()),
            ("note".into(), "  cancelled ".into()),
            ("claim".into(), "p\t\ta".into()),
            ("claim".into(), "p\tt\tb".into()),
            ("csrf".into(), "x".into()),
        ]);
        assert_eq!(p.action, Some(Action::Fail));
        assert_eq!(p.note, "cancelled");
        assert_eq!(p.claims.len(), 2);
        assert_eq!(p.claims[1].tenant, "t");
    }
}
