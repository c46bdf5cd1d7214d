//! Acting from the page: resolve or redrive one parked claim, or every parked claim of a
//! consumer whose reason starts with some text. Every action is shown before it is taken: the
//! page's forms post to `/actions/preview`, which lists exactly the claims that will change
//! and how; its confirm button posts that list to `/actions/apply`, which acts on each claim
//! through the same fenced store transitions as `claimd claims resolve|redrive`, recorded in
//! the history as `page:<name>` (the account's name; for the admin token, the name given at
//! sign-in), each claim acted on a line of the operator audit (`ops::audit`).
//!
//! Only a signed-in browser acts (the forms carry the session's CSRF token, checked by the
//! admin check before these handlers run); a page opened with the bearer header or without an
//! admin token stays read-only. Apply acts on the claims the person saw, not on a filter run
//! again: claims that moved meanwhile are reported as not actionable, not changed.

use crate::domain::operator_role::{Action as DomainAction, Identity};
use crate::edge::AppState;
use crate::edge::http::session::Session;
use crate::ops::audit::{AuditAction, AuditResult, Origin, Record, claim_target};
pub use crate::ops::operator_action::{Action, BULK_LIMIT, Target};
use crate::ops::operator_action::{act, select_parked};
use axum::Form;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::Response;

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
                style { (maud::PreEscaped(super::text::CSS)) }
            }
            body { main { section { h2 { (title) } (body) } } }
        }
    };
    super::html_page(status, html.into_string())
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
    let posted = fields.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    if let Err(e) = crate::ops::params::texts(posted) {
        return Err(Box::new(refuse(&format!("{e}; nothing was changed."))));
    }
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
    who: Option<Extension<crate::domain::operator_role::Identity>>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let (session, mut p, action) = match admit(session, fields) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    if let Some(consumer) = p.consumer.clone() {
        let selection =
            match select_parked(state.claimer.store().as_ref(), &consumer, &p.reason).await {
                Ok(s) => s,
                Err(e) => return crate::edge::http::problem::store_down(e),
            };
        if selection.more {
            return refuse(&format!(
                "Over {BULK_LIMIT} claims match: narrow the reason, or act on them in parts."
            ));
        }
        p.claims = selection.claims.iter().map(Target::of).collect();
    }
    if p.claims.is_empty() {
        return refuse("No parked claim matches: nothing would change.");
    }
    if p.claims.len() > BULK_LIMIT as usize {
        return refuse(&format!(
            "Over {BULK_LIMIT} claims match: narrow the reason, or act on them in parts."
        ));
    }
    let csrf = session.csrf(state.config.http.session_key());
    let n = p.claims.len();
    // What each claim is now, so the person confirms knowing the reason and the key.
    let mut now_shown = Vec::with_capacity(n);
    for t in &p.claims {
        let c = state
            .claimer
            .store()
            .get(&t.consumer, &t.tenant, &t.message_id)
            .await
            .ok()
            .flatten();
        let mut c = c.into_iter().collect::<Vec<_>>();
        crate::ops::exposure::shown_claims(
            &state.config,
            &mut c,
            crate::edge::http::claims::exposure_of(&who),
        );
        now_shown.push(c.pop());
    }
    page(
        StatusCode::OK,
        "Confirm",
        maud::html! {
            p {
                "This will " strong { (action.describe()) } " for " strong { (n) " claim" @if n != 1 { "s" } }
                ", recorded as " code { "page:" (session.name) } @if !p.note.is_empty() { " with the note “" (super::text::visible(&p.note)) "”" } "."
            }
            table {
                thead { tr { th { "claim" } th { "state" } th { "idempotency key" } th { "reason" } } }
                tbody {
                    @for (t, c) in p.claims.iter().zip(&now_shown) {
                        tr {
                            td { code { (super::text::visible(&t.label())) } }
                            @if let Some(c) = c {
                                td { (c.state) " (attempt " (c.attempt) ")" }
                                td { code { (super::text::visible(&c.idem_key)) } }
                                td.text { (super::text::visible(c.last_error.as_deref().unwrap_or("-"))) }
                            } @else {
                                td colspan="3" { "no such claim any more" }
                            }
                        }
                    }
                }
            }
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
    who: Option<Extension<Identity>>,
    origin: Option<Extension<Origin>>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let who = who.map_or_else(Identity::admin_token, |Extension(w)| w);
    let origin = origin.map_or(Origin::Unknown, |Extension(o)| o);
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
        let outcome = act(store.as_ref(), action, t, &actor, &p.note).await;
        let said = outcome.describe();
        let detail = format!("{} from the page; note: {}", action.verb(), p.note);
        crate::ops::audit::record_or_log(
            store.as_ref(),
            &Record {
                who: &who,
                action: AuditAction::Act(match action {
                    Action::Redrive => DomainAction::Redrive,
                    _ => DomainAction::Resolve,
                }),
                target: &claim_target(&t.consumer, &t.tenant, &t.message_id),
                origin: &origin,
                result: if outcome.done() {
                    AuditResult::Done
                } else {
                    AuditResult::Refused(said.clone())
                },
                detail: &detail,
            },
        )
        .await;
        tracing::info!(actor = %actor, action = action.name(), claim = %t.label(), result = %said, "operator page action");
        rows.push((t.label(), said));
    }
    page(
        StatusCode::OK,
        "Done",
        maud::html! {
            table {
                thead { tr { th { "claim" } th { "result" } } }
                tbody { @for (who, said) in &rows { tr { td { code { (super::text::visible(who)) } } td { (super::text::visible(said)) } } } }
            }
            p { a href="/" { "Back to the page" } }
        },
    )
}

/// The forms on a parked (or failed) claim: resolve (as completed or failed, with a note the
/// browser requires before sending) and redrive, each to the preview.
pub fn claim_forms(target: &Target, csrf: &str) -> maud::Markup {
    maud::html! {
        div.acts {
            form.act.resolve method="post" action="/actions/preview" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="claim" value=(target.encode());
                select name="action" aria-label="resolve as" {
                    option value="complete" { "resolve: completed" }
                    option value="fail" { "resolve: failed" }
                }
                input type="text" name="note" required placeholder="note: what the provider shows for its key" size="40" aria-label="note";
                button type="submit" { "Review…" }
            }
            form.act.redrive method="post" action="/actions/preview" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="claim" value=(target.encode());
                input type="hidden" name="action" value="redrive";
                button type="submit" { "Redrive (same key)…" }
            }
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
            input type="text" name="reason" placeholder="(empty: any reason)" size="24";
            " → "
            // No default: a bulk action is chosen, never taken by leaving the form as it was.
            select name="action" aria-label="action" required {
                option value="" disabled selected { "choose an action" }
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
