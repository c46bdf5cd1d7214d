//! `GET /signin`, `POST /signin` and `POST /signout`: the operator page's sign-in (see
//! [`super::session`] for the cookie). The form takes a person's account name and credential
//! (`claimd operators add`), checked against the stored hash; or, break-glass, any name and
//! the admin token (an admin, `admin-token` in the audit, the name given kept in claims'
//! histories). A wrong name or credential is answered `401` with the form again and no cookie.
//! Tries are throttled per client address ([`super::guard::Throttle`]: a few at once, then one
//! every couple of seconds; over that, `429` + `Retry-After` without looking at the
//! credential), and wrong ones are logged with the address, one line per period. Every
//! sign-in, refused sign-in and sign-out is a line of the operator audit. Signing out needs the
//! session's CSRF token, like any change.

use super::operator_auth::refused_sign_in;
use super::session::{self, SESSION_TTL, Session, SessionOf};
use crate::domain::constant_time::constant_time_eq;
use crate::domain::operator_role::{Identity, IdentitySource, Role};
use crate::edge::AppState;
use crate::edge::http::server::Peer;
use crate::ops::accounts;
use crate::ops::audit::{self, AuditAction, AuditResult, Origin, Record};
use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

/// The sign-in form's fields.
#[derive(Debug, Deserialize)]
pub struct SignIn {
    /// The account's name (with the admin token: who signs in, kept in claims' histories).
    #[serde(default)]
    pub name: String,
    /// The account's credential, or the admin token.
    pub token: String,
}

const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>claimd — sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:16px system-ui,sans-serif;margin:4rem auto;max-width:26rem;color:#1d2733}
h1{font-size:1.4rem}label{display:block;margin:1rem 0 .3rem}input[type=password]{width:100%;padding:.5rem;font:inherit}
button{margin-top:1rem;padding:.5rem 1.2rem;font:inherit}.error{color:#a11;margin:1rem 0}</style></head>
<body><h1>claimd operator page</h1>{message}
<form method="post" action="/signin"><label for="name">Your account name (recorded with what you do)</label>
<input id="name" name="name" type="text" autocomplete="username" pattern="[A-Za-z0-9._@-]{1,64}" required autofocus>
<label for="token">Your credential (from <code>claimd operators add</code>; break-glass: the admin token)</label>
<input id="token" name="token" type="password" autocomplete="current-password" required>
<button type="submit">Sign in</button></form>
<p>Signed in for 8 hours in this browser. Scripts send <code>Authorization: Bearer &lt;name&gt;:&lt;credential&gt;</code> instead.</p>
</body></html>"#;

fn page(status: StatusCode, message: &str) -> Response {
    super::problem::html_page(status, PAGE.replace("{message}", message))
}

fn see_other(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}

/// `GET /signin`: the form (or what to configure when neither an admin token nor a session
/// secret is).
pub async fn form(State(state): State<AppState>) -> Response {
    if state.config.http.session_key().is_empty() {
        return no_admin_token();
    }
    page(StatusCode::OK, "")
}

/// What `/signin` says when no admin token is configured: nothing to sign in with, so the
/// page stays read-only, and what to set to act from it.
fn no_admin_token() -> Response {
    super::problem::html_page(StatusCode::OK, NO_TOKEN_PAGE.to_string())
}

const NO_TOKEN_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>claimd — no admin token</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:16px system-ui,sans-serif;margin:4rem auto;max-width:34rem;color:#1d2733}h1{font-size:1.4rem}</style></head>
<body><h1>No sign-in on this worker</h1>
<p>This worker has neither <code>[http] admin_token</code> nor <code>[http] session_secret</code>, so nobody signs in: the
<a href="/">operator page</a> is open to whoever reaches this (loopback) listener, and read-only.</p>
<p>To resolve and redrive from the page, set an admin token (at least 16 characters) and start
the worker again, for example <code>admin_token = "${CLAIMD_ADMIN_TOKEN}"</code> under
<code>[http]</code> with <code>CLAIMD_ADMIN_TOKEN</code> set in its environment; or set a
<code>session_secret</code> (at least 32 characters) and add personal accounts with
<code>claimd operators add NAME --role ROLE</code>; then sign in here. Without the page, <code>claimd claims resolve|redrive</code> act from the command line.</p>
</body></html>"#;

/// `POST /signin`: checks the name and credential; sets the session cookie and goes to the
/// page.
pub async fn sign_in(
    State(state): State<AppState>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    form: Result<Form<SignIn>, FormRejection>,
) -> Response {
    let key = state.config.http.session_key().to_string();
    if key.is_empty() {
        return no_admin_token();
    }
    let peer = peer.map(|Extension(Peer(addr))| addr);
    let origin = peer.map_or(Origin::Unknown, Origin::Address);
    // Without a recorded address (the router called in-process) every try shares one bucket.
    let ip = peer.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip());
    if let Err(wait) = state.guard.signin.take(ip) {
        if let Some(unlogged) = state.guard.throttled_log.due() {
            tracing::warn!(
                ?peer,
                unlogged,
                "operator page sign-in throttled: too many tries from this address"
            );
        }
        let secs = wait.as_secs().max(1);
        let mut r = page(
            StatusCode::TOO_MANY_REQUESTS,
            &format!(
                r#"<p class="error" role="alert">Too many sign-in tries from your address: wait {secs} s.</p>"#
            ),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return r;
    }
    let Ok(Form(given)) = form else {
        return page(
            StatusCode::BAD_REQUEST,
            r#"<p class="error" role="alert">Enter your name and credential.</p>"#,
        );
    };
    let name = given.name.trim();
    if !session::valid_name(name) {
        return page(
            StatusCode::BAD_REQUEST,
            r#"<p class="error" role="alert">The name must be 1-64 letters, digits or ._@-</p>"#,
        );
    }
    let token = given.token.trim();
    let admin = &state.config.http.admin_token;
    let (who, of) = if !admin.is_empty() && constant_time_eq(token.as_bytes(), admin.as_bytes()) {
        let of = SessionOf {
            name,
            source: IdentitySource::AdminToken,
            role: Role::Admin,
        };
        (Identity::admin_token(), of)
    } else {
        match accounts::authenticate(state.claimer.store().as_ref(), name, token).await {
            Ok(Ok(who)) => (
                who,
                SessionOf {
                    name,
                    source: IdentitySource::Account,
                    role: Role::Viewer,
                },
            ),
            Ok(Err(refusal)) => {
                if let Some(unlogged) = state.guard.signin_log.due() {
                    tracing::warn!(
                        ?peer,
                        unlogged,
                        "operator page sign-in refused: wrong name or credential ({unlogged} more since the last such line)"
                    );
                }
                refused_sign_in(&state, name, &origin, refusal, "sign-in form").await;
                return page(
                    StatusCode::UNAUTHORIZED,
                    r#"<p class="error" role="alert">Wrong name or credential.</p>"#,
                );
            }
            Err(e) => return super::problem::store_down(e),
        }
    };
    let of = SessionOf {
        role: who.role,
        ..of
    };
    state.guard.signin.give_back(ip);
    let detail = if who.source == IdentitySource::AdminToken {
        format!("name given: {name}")
    } else {
        String::new()
    };
    audit::record_or_log(
        state.claimer.store().as_ref(),
        &Record {
            who: &who,
            action: AuditAction::SignIn,
            target: &who.name,
            origin: &origin,
            result: AuditResult::Done,
            detail: &detail,
        },
    )
    .await;
    let value = Session::issue(
        &key,
        chrono::Utc::now().timestamp(),
        SESSION_TTL,
        &session::new_nonce(),
        of,
    );
    let secure = headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let mut r = see_other("/");
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&value, secure)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// The sign-out form's field (the page's CSRF token).
#[derive(Debug, Deserialize)]
pub struct SignOut {
    /// The session's CSRF token.
    #[serde(default)]
    pub csrf: String,
}

/// `POST /signout`: clears the cookie and goes back to the form. Needs the session's CSRF
/// token (the page's form carries it, or `X-CSRF-Token`), so another site cannot sign a person
/// out; without a valid session there is nothing to clear.
pub async fn sign_out(
    State(state): State<AppState>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    form: Result<Form<SignOut>, FormRejection>,
) -> Response {
    let secret = state.config.http.session_key();
    if secret.is_empty() {
        return see_other("/");
    }
    let session = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|c| session::cookie_value(c, session::COOKIE))
        .and_then(|v| Session::verify(secret, v, chrono::Utc::now().timestamp()));
    let Some(session) = session else {
        return see_other("/signin");
    };
    let token = headers
        .get(session::CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| form.ok().map(|Form(f)| f.csrf));
    if !token.is_some_and(|t| session.csrf_ok(secret, &t)) {
        return super::problem::problem(
            StatusCode::FORBIDDEN,
            "missing or wrong CSRF token",
            "signing out needs the page's CSRF token (the Sign out button sends it); reload the page",
        );
    }
    let who = match session.source {
        IdentitySource::AdminToken => Identity::admin_token(),
        _ => Identity::account(&session.name, session.role),
    };
    let origin = peer.map_or(Origin::Unknown, |Extension(Peer(a))| Origin::Address(a));
    audit::record_or_log(
        state.claimer.store().as_ref(),
        &Record {
            who: &who,
            action: AuditAction::SignOut,
            target: &who.name,
            origin: &origin,
            result: AuditResult::Done,
            detail: "",
        },
    )
    .await;
    let mut r = see_other("/signin");
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie()) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}
