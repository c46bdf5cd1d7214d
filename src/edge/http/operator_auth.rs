//! Who is asking, and may they: the check in front of the operations routes and the operator
//! page. A request is recognised as an [`Identity`] by, in order:
//!
//! 1. `Authorization: Bearer <admin_token>`: the break-glass admin (`admin-token` in the
//!    audit);
//! 2. `Authorization: Bearer <name>:<credential>`: an operator account, its credential checked
//!    against its hash (throttled per client address like the sign-in form; a verified
//!    credential is remembered for a few minutes so scripts do not pay for PBKDF2 on every
//!    request);
//! 3. the session cookie of a signed-in browser ([`super::session`]), which must carry the
//!    session's CSRF token on anything that changes state;
//! 4. with neither an admin token nor a session secret configured: the open local identity, for
//!    requests that name this machine only ([`super::auth`]).
//!
//! An account is read from the store on every request: a disabled account is refused at once,
//! and its current role applies. A change is then allowed only when the role may do it
//! ([`Role::may`]); a refusal is `403` and is recorded in the operator audit. The route gets
//! the [`Identity`] and the request's [`Origin`] as request extensions (and the [`Session`]
//! for a browser), to record what it does.

use super::auth::{refused_unless_local, sole_bearer, unauthorized, wrong_token_log};
use super::problem::{problem, store_down};
use super::session::{self, Session};
use crate::domain::constant_time::constant_time_eq;
use crate::domain::operator_role::{Action, Identity, IdentitySource, Role, valid_name};
use crate::edge::AppState;
use crate::ops::accounts::{self, Refusal};
use crate::ops::audit::{self, AuditAction, AuditResult, Origin, Record};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// What a change needs: an action a role may be allowed, or the admin role (a change that
/// names no action of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// The role must be allowed this action.
    Action(Action),
    /// Only an admin.
    Admin,
}

impl Needs {
    /// Whether `role` has what is needed.
    pub fn allows(self, role: Role) -> bool {
        match self {
            Needs::Action(a) => role.may(a),
            Needs::Admin => role == Role::Admin,
        }
    }

    fn audit_action(self) -> AuditAction {
        match self {
            Needs::Action(a) => AuditAction::Act(a),
            Needs::Admin => AuditAction::Request,
        }
    }
}

/// What a change to `path` needs (`page_action`: the `action` field of the page's form).
pub fn needs(path: &str, page_action: Option<&str>) -> Needs {
    let act = |a| Needs::Action(a);
    if path.starts_with("/actions/") {
        return act(match page_action {
            Some("redrive") => Action::Redrive,
            _ => Action::Resolve,
        });
    }
    if path.starts_with("/v1/operators") {
        return act(Action::ManageAccounts);
    }
    if path == "/v1/erasures" {
        return act(Action::Erase);
    }
    if path.starts_with("/v1/keys") || path.ends_with("/rotate") {
        return act(Action::RotateKeys);
    }
    match path.rsplit('/').next() {
        Some("resolve") => act(Action::Resolve),
        Some("redrive") => act(Action::Redrive),
        Some("cancel") => act(Action::Cancel),
        Some("erase") => act(Action::Erase),
        _ => Needs::Admin,
    }
}

/// The client's address as the audit keeps it.
pub fn origin_of(ext: &axum::http::Extensions) -> Origin {
    super::auth::peer_of(ext).map_or(Origin::Unknown, Origin::Address)
}

/// `name:credential` from a bearer token, when it has that shape.
fn account_bearer(token: &[u8]) -> Option<(&str, &str)> {
    let (name, cred) = std::str::from_utf8(token).ok()?.split_once(':')?;
    (valid_name(name) && !cred.is_empty()).then_some((name, cred))
}

/// The largest form body read to find its `csrf` field.
const FORM_LIMIT: usize = 64 * 1024;

/// Lets a request through only for a recognised [`Identity`] (see the module) whose role
/// allows what it asks; a browser that is not signed in is sent to `/signin`.
pub async fn require_admin(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let origin = origin_of(req.extensions());
    let http = &state.config.http;
    let bearer = sole_bearer(&req).map(<[u8]>::to_vec);
    let admin_token = !http.admin_token.is_empty()
        && bearer
            .as_deref()
            .is_some_and(|b| constant_time_eq(b, http.admin_token.as_bytes()));
    let mut req = req;
    let identity = if admin_token {
        Identity::admin_token()
    } else if let Some((name, cred)) = bearer.as_deref().and_then(account_bearer) {
        match bearer_identity(&state, name, cred, &origin).await {
            Ok(id) => id,
            Err(refused) => return refused,
        }
    } else if http.session_key().is_empty() {
        if let Some(refused) = refused_unless_local(&state, &req, "admin_token") {
            return refused;
        }
        Identity {
            name: "local".into(),
            role: Role::Admin,
            source: IdentitySource::Local,
        }
    } else {
        match session_identity(&state, req).await {
            Ok((id, s, r)) => {
                req = r;
                req.extensions_mut().insert(s);
                id
            }
            Err(refused) => return refused,
        }
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let (r, page_action) = page_action(req).await;
        req = r;
        let needed = needs(req.uri().path(), page_action.as_deref());
        if !needed.allows(identity.role) {
            return refuse_role(&state, &identity, &origin, needed, req.uri().path()).await;
        }
    }
    req.extensions_mut().insert(identity);
    req.extensions_mut().insert(origin);
    next.run(req).await
}

/// The `403` of a change the role may not make, recorded in the audit.
async fn refuse_role(
    state: &AppState,
    who: &Identity,
    origin: &Origin,
    needed: Needs,
    path: &str,
) -> Response {
    let why = format!("403 role {} may not", who.role);
    audit::record_or_log(
        state.claimer.store().as_ref(),
        &Record {
            who,
            action: needed.audit_action(),
            target: &target_of(path),
            origin,
            result: AuditResult::Refused(why),
            detail: path,
        },
    )
    .await;
    let what = match needed {
        Needs::Action(a) => a.as_str(),
        Needs::Admin => "this change",
    };
    problem(
        StatusCode::FORBIDDEN,
        "not allowed for your role",
        &format!(
            "{} has the role {}, which may not {what}; nothing was changed (an admin changes roles with claimd operators set-role)",
            who.name, who.role
        ),
    )
}

/// A route's path as an audit target: `consumer/message_id` for a claim's route.
fn target_of(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["", "v1", "claims", consumer, message_id, _verb] => {
            let dec = |s: &str| {
                serde_urlencoded::from_str::<Vec<(String, String)>>(&format!("x={s}"))
                    .ok()
                    .and_then(|v| v.into_iter().next())
                    .map_or_else(|| s.to_string(), |(_, v)| v)
            };
            format!("{}/{}", dec(consumer), dec(message_id))
        }
        _ => path.to_string(),
    }
}

/// The page form's `action` field (read only for the page's own `/actions/` forms), and the
/// request with its body put back.
async fn page_action(req: Request) -> (Request, Option<String>) {
    if !req.uri().path().starts_with("/actions/") || !is_form(&req) {
        return (req, None);
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, FORM_LIMIT).await else {
        return (Request::from_parts(parts, axum::body::Body::empty()), None);
    };
    let action = form_field(&bytes, "action");
    (
        Request::from_parts(parts, axum::body::Body::from(bytes)),
        action,
    )
}

fn form_field(bytes: &[u8], name: &str) -> Option<String> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(bytes)
        .ok()
        .and_then(|fields| fields.into_iter().find(|(k, _)| k == name))
        .map(|(_, v)| v)
}

/// An account's bearer credential: its identity, or the refusal (`401`, audited; `429` past
/// the throttle).
async fn bearer_identity(
    state: &AppState,
    name: &str,
    cred: &str,
    origin: &Origin,
) -> Result<Identity, Response> {
    let store = state.claimer.store();
    let account = store.operator(name).await.map_err(store_down)?;
    if let Some(a) = account.as_ref().filter(|a| a.active())
        && state.guard.verified.hit(name, cred, &a.credential_hash)
    {
        return Ok(Identity::account(&a.name, a.role));
    }
    let ip = match origin {
        Origin::Address(a) => a.ip(),
        _ => std::net::Ipv4Addr::UNSPECIFIED.into(),
    };
    if let Err(wait) = state.guard.signin.take(ip) {
        let mut r = problem(
            StatusCode::TOO_MANY_REQUESTS,
            "too many tries",
            "too many credential checks from your address; wait and try again",
        );
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(wait.as_secs().max(1)),
        );
        return Err(r);
    }
    match accounts::authenticate(store.as_ref(), name, cred).await {
        Ok(Ok(id)) => {
            state.guard.signin.give_back(ip);
            if let Some(a) = account {
                state.guard.verified.put(name, cred, a.credential_hash);
            }
            Ok(id)
        }
        Ok(Err(refusal)) => {
            refused_sign_in(state, name, origin, refusal, "bearer credential").await;
            Err(unauthorized(
                "wrong name or credential in Authorization: Bearer <name>:<credential>",
            ))
        }
        Err(e) => Err(store_down(e)),
    }
}

/// Records a refused sign-in (form or bearer) in the audit, under the name that was given.
pub async fn refused_sign_in(
    state: &AppState,
    name: &str,
    origin: &Origin,
    refusal: Refusal,
    how: &str,
) {
    let who = Identity::account(if valid_name(name) { name } else { "?" }, Role::Viewer);
    audit::record_or_log(
        state.claimer.store().as_ref(),
        &Record {
            who: &who,
            action: AuditAction::SignInRefused,
            target: &who.name,
            origin,
            result: AuditResult::Refused(format!("401 {}", refusal.as_str())),
            detail: how,
        },
    )
    .await;
}

/// The identity of a session's account as it is now, or `None` when the session no longer
/// stands (the account disabled or gone, or an admin-token session without an admin token).
pub async fn session_identity_now(
    state: &AppState,
    s: &Session,
) -> Result<Option<Identity>, crate::store::StoreError> {
    match s.source {
        IdentitySource::AdminToken if !state.config.http.admin_token.is_empty() => {
            Ok(Some(Identity::admin_token()))
        }
        IdentitySource::Account => accounts::current(state.claimer.store().as_ref(), &s.name).await,
        _ => Ok(None),
    }
}

/// A browser's session: its identity, and the request (its body read back when the CSRF token
/// was in the form).
async fn session_identity(
    state: &AppState,
    req: Request,
) -> Result<(Identity, Session, Request), Response> {
    let key = state.config.http.session_key();
    let session = req
        .headers()
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|c| session::cookie_value(c, session::COOKIE))
        .and_then(|v| Session::verify(key, v, chrono::Utc::now().timestamp()));
    let identity = match &session {
        Some(s) => session_identity_now(state, s).await.map_err(store_down)?,
        None => None,
    };
    let (Some(session), Some(identity)) = (session, identity) else {
        wrong_token_log(state, &req, "admin token or credential");
        let wants_html = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/html"));
        if wants_html && req.method() == Method::GET {
            return Err((StatusCode::SEE_OTHER, [(header::LOCATION, "/signin")]).into_response());
        }
        return Err(unauthorized(
            "this route needs Authorization: Bearer <admin_token> or <name>:<credential> (a browser signs in at /signin)",
        ));
    };
    let mut req = req;
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let header_token = req
            .headers()
            .get(session::CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let token = match header_token {
            Some(t) => Some(t),
            None if is_form(&req) => {
                let (parts, body) = req.into_parts();
                let Ok(bytes) = axum::body::to_bytes(body, FORM_LIMIT).await else {
                    return Err(forbidden("the form is over 64 KiB"));
                };
                let token = form_field(&bytes, "csrf");
                req = Request::from_parts(parts, axum::body::Body::from(bytes));
                token
            }
            None => None,
        };
        if !token.is_some_and(|t| session.csrf_ok(key, &t)) {
            return Err(forbidden(
                "a signed-in browser must send the page's CSRF token (X-CSRF-Token header or csrf form field) with this request; reload the page",
            ));
        }
    }
    Ok((identity, session, req))
}

fn is_form(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"))
}

fn forbidden(detail: &str) -> Response {
    problem(StatusCode::FORBIDDEN, "missing or wrong CSRF token", detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_needs_its_action() {
        let n = |p| needs(p, None);
        assert_eq!(
            n("/v1/claims/pay/m1/resolve"),
            Needs::Action(Action::Resolve)
        );
        assert_eq!(
            n("/v1/claims/pay/m1/redrive"),
            Needs::Action(Action::Redrive)
        );
        assert_eq!(n("/v1/claims/pay/m1/cancel"), Needs::Action(Action::Cancel));
        assert_eq!(n("/v1/claims/pay/m1/erase"), Needs::Action(Action::Erase));
        assert_eq!(n("/v1/erasures"), Needs::Action(Action::Erase));
        assert_eq!(n("/v1/keys/rotate"), Needs::Action(Action::RotateKeys));
        assert_eq!(
            n("/v1/operators/ann"),
            Needs::Action(Action::ManageAccounts)
        );
        assert_eq!(n("/v1/something-new"), Needs::Admin);
        assert_eq!(
            needs("/actions/apply", Some("redrive")),
            Needs::Action(Action::Redrive)
        );
        assert_eq!(
            needs("/actions/apply", Some("complete")),
            Needs::Action(Action::Resolve)
        );
        assert!(!Needs::Admin.allows(Role::Operator));
        assert!(Needs::Action(Action::Cancel).allows(Role::Operator));
    }

    #[test]
    fn account_bearers_are_name_colon_credential() {
        assert_eq!(
            account_bearer(b"ann:s3cret:with:colons"),
            Some(("ann", "s3cret:with:colons"))
        );
        assert_eq!(account_bearer(b"no-colon"), None);
        assert_eq!(account_bearer(b"ann:"), None);
        assert_eq!(account_bearer(b"a n:x"), None);
    }

    #[test]
    fn claim_routes_name_their_claim_in_the_audit() {
        assert_eq!(target_of("/v1/claims/pay/m%201/resolve"), "pay/m 1");
        assert_eq!(target_of("/actions/apply"), "/actions/apply");
    }
}
