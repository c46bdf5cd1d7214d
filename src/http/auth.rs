//! Bearer tokens: the admin token guards the operations routes and the page, the intake token
//! guards intake; both compared in constant time. A browser signed in on `/signin` passes the
//! admin check with its session cookie instead ([`super::session`]), and must then send the
//! session's CSRF token with anything that changes state.
//!
//! A route whose token is empty (allowed on a loopback listener) answers only requests that name
//! this machine ([`super::guard`]): `Host` a loopback name or one of `[http] allowed_hosts`
//! (else `421`), and on changes no foreign `Origin` (else `403`). Wrong tokens are logged with
//! the client's address, at most one line per [`super::guard::LOG_EVERY`].

use super::constant_time::constant_time_eq;
use super::problem::problem;
use super::session::{self, Session};
use super::state::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The token of an `Authorization: Bearer <token>` value. The scheme is case-insensitive
/// (RFC 9110 §11.1: `bearer`, `BEARER`) and may be followed by several spaces.
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at(value.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// The client address of a request (the TCP peer), when the listener recorded it.
pub fn peer_of(req: &axum::http::Extensions) -> Option<std::net::SocketAddr> {
    req.get::<crate::server::Peer>().map(|p| p.0)
}

/// For a route without a token: the refusal of a request that does not name this machine (see
/// the module); `None` lets it through. `token` names the empty key, for the answer.
fn refused_unless_local(state: &AppState, req: &Request, token: &str) -> Option<Response> {
    let allowed = &state.config.http.allowed_hosts;
    let hosts: Vec<_> = req.headers().get_all(header::HOST).iter().collect();
    let host = match hosts.as_slice() {
        [] => req.uri().authority().map(|a| a.as_str().to_string()),
        [one] => Some(String::from_utf8_lossy(one.as_bytes()).into_owned()),
        // Two Host headers: which one a proxy or a browser meant is a guess.
        _ => Some(String::new()),
    };
    // No Host at all (HTTP/1.0 by hand) is no browser: nothing to rebind.
    if let Some(host) = host
        && !super::guard::host_allowed(&host, allowed)
    {
        refused_log(state, req, "Host", &host);
        return Some(problem(
            StatusCode::MISDIRECTED_REQUEST,
            "host not allowed",
            &format!(
                "[http] {token} is empty, so this route answers only requests to a loopback name (localhost, 127.0.0.1, [::1]) or to one of [http] allowed_hosts; Host {host:?} is neither (a web page reaching this port through DNS rebinding sends its own name)"
            ),
        ));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        for origin in req.headers().get_all(header::ORIGIN) {
            let origin = String::from_utf8_lossy(origin.as_bytes());
            if !super::guard::origin_allowed(&origin, allowed) {
                refused_log(state, req, "Origin", &origin);
                return Some(problem(
                    StatusCode::FORBIDDEN,
                    "origin not allowed",
                    &format!(
                        "[http] {token} is empty, so this route takes changes only from pages on a loopback name or one of [http] allowed_hosts; Origin {origin:?} is neither (another site's page cannot make this request)"
                    ),
                ));
            }
        }
    }
    None
}

fn refused_log(state: &AppState, req: &Request, what: &str, value: &str) {
    if let Some(unlogged) = state.guard.host_log.due() {
        let value: String = value.chars().take(100).collect();
        tracing::warn!(
            peer = ?peer_of(req.extensions()),
            header = what,
            value,
            unlogged,
            "refused a request to a route without a token: it names another host"
        );
    }
}

/// Logs a wrong bearer token (at most one line per period, with the client's address).
fn wrong_token_log(state: &AppState, req: &Request, which: &str) {
    if req.headers().get(header::AUTHORIZATION).is_none() {
        return;
    }
    if let Some(unlogged) = state.guard.bearer_log.due() {
        tracing::warn!(
            peer = ?peer_of(req.extensions()),
            path = req.uri().path(),
            unlogged,
            "refused a wrong {which}; {unlogged} more refused since the last such line"
        );
    }
}

fn bearer_ok(expected: &str, req: &Request) -> bool {
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => {
            bearer_token(v.as_bytes()).is_some_and(|got| constant_time_eq(got, expected.as_bytes()))
        }
        // None, or two Authorization headers: which one counts would be a guess.
        _ => false,
    }
}

/// The session a request's cookie holds, when it is valid for `secret`.
fn session_of(secret: &str, req: &Request) -> Option<Session> {
    let cookies = req.headers().get(header::COOKIE)?.to_str().ok()?;
    let value = session::cookie_value(cookies, session::COOKIE)?;
    Session::verify(secret, value, chrono::Utc::now().timestamp())
}

/// The largest form body read to find its `csrf` field.
const FORM_LIMIT: usize = 64 * 1024;

/// Lets a request through only with the admin token (when one is configured), or with a
/// signed-in browser's session cookie; a browser that is not signed in is sent to `/signin`.
/// A cookie-authenticated request that is not `GET`/`HEAD` needs the session's CSRF token, in
/// the `X-CSRF-Token` header or a `csrf` form field. The [`Session`] is handed to the route as
/// a request extension.
pub async fn require_admin(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let secret = &state.config.http.admin_token;
    if secret.is_empty() {
        return match refused_unless_local(&state, &req, "admin_token") {
            None => next.run(req).await,
            Some(refused) => refused,
        };
    }
    if bearer_ok(secret, &req) {
        return next.run(req).await;
    }
    let Some(session) = session_of(secret, &req) else {
        wrong_token_log(&state, &req, "admin token");
        let wants_html = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/html"));
        if wants_html && req.method() == Method::GET {
            return (StatusCode::SEE_OTHER, [(header::LOCATION, "/signin")]).into_response();
        }
        return unauthorized(
            "this route needs Authorization: Bearer <admin_token> (a browser signs in at /signin)",
        );
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
                    return forbidden("the form is over 64 KiB");
                };
                let token = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&bytes)
                    .ok()
                    .and_then(|fields| fields.into_iter().find(|(k, _)| k == "csrf"))
                    .map(|(_, v)| v);
                req = Request::from_parts(parts, axum::body::Body::from(bytes));
                token
            }
            None => None,
        };
        if !token.is_some_and(|t| session.csrf_ok(secret, &t)) {
            return forbidden(
                "a signed-in browser must send the page's CSRF token (X-CSRF-Token header or csrf form field) with this request; reload the page",
            );
        }
    }
    req.extensions_mut().insert(session);
    next.run(req).await
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

/// Lets a request through only with the intake token (when one is configured).
pub async fn require_intake(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let token = &state.config.http.intake_token;
    if token.is_empty() {
        return match refused_unless_local(&state, &req, "intake_token") {
            None => next.run(req).await,
            Some(refused) => refused,
        };
    }
    if bearer_ok(token, &req) {
        next.run(req).await
    } else {
        wrong_token_log(&state, &req, "intake token");
        unauthorized("this route needs Authorization: Bearer <intake_token>")
    }
}

fn unauthorized(detail: &str) -> Response {
    let mut r = problem(StatusCode::UNAUTHORIZED, "unauthorized", detail);
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for v in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "bEaReR   s3cret",
        ] {
            assert_eq!(bearer_token(v.as_bytes()), Some(&b"s3cret"[..]), "{v}");
        }
        for v in ["Basic s3cret", "Bearers3cret", "Bearer ", "s3cret", ""] {
            assert_eq!(bearer_token(v.as_bytes()), None, "{v}");
        }
    }
}
