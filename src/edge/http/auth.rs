//! Bearer tokens: the intake tokens guard intake, compared in constant time (the operations
//! routes and the page are guarded by `operator_auth`, with the helpers here). The intake token speaks for every tenant; a
//! tenant's token (`[http] tenant_tokens`) only for requests that name its own tenant.
//!
//! A route whose token is empty (allowed on a loopback listener) answers only requests that name
//! this machine ([`super::guard`]): `Host` a loopback name or one of `[http] allowed_hosts`
//! (else `421`), and on changes no foreign `Origin` (else `403`). Wrong tokens are logged with
//! the client's address, at most one line per [`super::guard::LOG_EVERY`].

use super::problem::problem;
use crate::domain::constant_time::constant_time_eq;
use crate::edge::AppState;
use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{RawPathParams, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

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
    req.get::<crate::edge::http::server::Peer>().map(|p| p.0)
}

/// For a route without a token: the refusal of a request that does not name this machine (see
/// the module); `None` lets it through. `token` names the empty key, for the answer.
pub(super) fn refused_unless_local(
    state: &AppState,
    req: &Request,
    token: &str,
) -> Option<Response> {
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
pub(super) fn wrong_token_log(state: &AppState, req: &Request, which: &str) {
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

/// The bearer token of a request with exactly one `Authorization` header.
pub(super) fn sole_bearer(req: &Request) -> Option<&[u8]> {
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => bearer_token(v.as_bytes()),
        // None, or two Authorization headers: which one counts would be a guess.
        _ => None,
    }
}

/// Lets a request through only with an intake token, when any is configured: the all-tenant
/// `intake_token` for any tenant, a `[http] tenant_tokens` token only with its own tenant in
/// the consumer's tenant header (else `403`, decided before anything is read, so the answer
/// is the same whether a claim exists or not).
pub async fn require_intake(
    State(state): State<AppState>,
    params: Result<RawPathParams, RawPathParamsRejection>,
    req: Request,
    next: Next,
) -> Response {
    let http = &state.config.http;
    if http.intake_is_open() {
        return match refused_unless_local(&state, &req, "intake_token") {
            None => next.run(req).await,
            Some(refused) => refused,
        };
    }
    let token = sole_bearer(&req);
    // Both comparisons always run: the time taken does not tell which kind of token matched.
    let all_tenants = !http.intake_token.is_empty()
        && token.is_some_and(|t| constant_time_eq(t, http.intake_token.as_bytes()));
    let tenant = token.and_then(|t| http.tenant_tokens.tenant_of(t));
    if all_tenants {
        return next.run(req).await;
    }
    let Some(tenant) = tenant else {
        wrong_token_log(&state, &req, "intake token");
        return unauthorized(if http.tenant_tokens.is_empty() {
            "this route needs Authorization: Bearer <intake_token>"
        } else {
            "this route needs Authorization: Bearer <intake_token>, or a tenant's token from [http] tenant_tokens"
        });
    };
    let consumer = params
        .ok()
        .and_then(|p| {
            p.iter()
                .find(|(k, _)| *k == "consumer")
                .map(|(_, v)| v.to_string())
        })
        .unwrap_or_default();
    let header = tenant_header(&state, &consumer);
    match other_tenant(tenant, header, req.headers().get_all(header).iter()) {
        None => next.run(req).await,
        Some(detail) => {
            if let Some(unlogged) = state.guard.bearer_log.due() {
                tracing::warn!(
                    peer = ?peer_of(req.extensions()),
                    path = req.uri().path(),
                    tenant,
                    unlogged,
                    "refused a tenant's intake token used without its own tenant"
                );
            }
            problem(StatusCode::FORBIDDEN, "another tenant", &detail)
        }
    }
}

/// Why a request made with `tenant`'s token may not go on, from the values of its tenant
/// header `header`: none sent (that names the claims of no tenant), or one that is not
/// `tenant`. `None` when every value is `tenant`.
fn other_tenant<'v>(
    tenant: &str,
    header: &str,
    values: impl Iterator<Item = &'v HeaderValue>,
) -> Option<String> {
    let mut any = false;
    for v in values {
        any = true;
        if v.as_bytes() != tenant.as_bytes() {
            let sent: String = String::from_utf8_lossy(v.as_bytes())
                .chars()
                .take(100)
                .collect();
            return Some(format!(
                "this token is tenant {tenant:?}'s ([http] tenant_tokens) and {header} {sent:?} names another tenant: a tenant's token submits and reads only its own tenant's messages; nothing was read or recorded"
            ));
        }
    }
    (!any).then(|| {
        format!(
            "this token is tenant {tenant:?}'s ([http] tenant_tokens): send {header}: {tenant}. A request without {header} names the messages of no tenant, which only the all-tenant intake_token reaches; nothing was read or recorded"
        )
    })
}

pub(super) fn unauthorized(detail: &str) -> Response {
    let mut r = problem(StatusCode::UNAUTHORIZED, "unauthorized", detail);
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// Tenant header name for `consumer` (configurable, `Tenant-Id` by default).
pub fn tenant_header<'s>(state: &'s AppState, consumer: &str) -> &'s str {
    state
        .claimer
        .consumer(consumer)
        .map(|c| c.config.tenant_header.as_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("Tenant-Id")
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

    #[test]
    fn a_tenant_token_goes_on_only_with_its_own_tenant() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(other_tenant("acme", "Tenant-Id", [v("acme")].iter()), None);
        assert_eq!(
            other_tenant("acme", "Tenant-Id", [v("acme"), v("acme")].iter()),
            None
        );
        let other = other_tenant("acme", "Tenant-Id", [v("globex")].iter()).unwrap();
        assert!(
            other.contains(r#"tenant "acme"'s"#) && other.contains(r#"Tenant-Id "globex""#),
            "{other}"
        );
        let mixed = other_tenant("acme", "X-Tenant", [v("acme"), v("globex")].iter()).unwrap();
        assert!(mixed.contains(r#"X-Tenant "globex""#), "{mixed}");
        // Tenant ids are exact bytes: another case is another tenant.
        assert!(other_tenant("acme", "Tenant-Id", [v("ACME")].iter()).is_some());
        let missing = other_tenant("acme", "Tenant-Id", [].iter()).unwrap();
        assert!(missing.contains("send Tenant-Id: acme"), "{missing}");
    }
}
