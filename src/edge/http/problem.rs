//! Errors as `application/problem+json` (RFC 9457), for every route.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// An `application/problem+json` answer.
pub fn problem(status: StatusCode, title: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r
}

/// A `503` for a store that could not be read (with `Retry-After` when it was only busy); a
/// `400` when it refused the request's input as data it cannot hold (a retry would fail
/// again).
pub fn store_down(e: crate::store::StoreError) -> Response {
    if e.is_bad_input() {
        tracing::info!(error = %e, "store refused a value of the request");
        return problem(
            StatusCode::BAD_REQUEST,
            "bad input",
            &format!(
                "the claim store cannot hold a value of this request ({e}); nothing was changed: fix the request, do not retry it"
            ),
        );
    }
    if let crate::store::StoreError::Busy(why) = &e {
        let mut r = problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            &format!("{why}; nothing was read: retry"),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    }
    tracing::warn!(error = %e, "store read failed");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "store unavailable",
        "the claim store could not be read; retry",
    )
}

/// An HTML answer with `status`: every HTML answer (the page, `/signin`, the action pages)
/// carries the same CSP, framing and caching headers.
pub fn html_page(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; \
             frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
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

/// `400`, problem+json, naming the parameter; nothing was read or changed.
pub fn bad_parameter(e: &crate::ops::params::ParamError) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "bad parameter",
        &format!("{e}; nothing was changed"),
    )
}

/// [`crate::ops::params::texts`], answered: the `400` to return when any holds a NUL.
pub fn refusal<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Response> {
    crate::ops::params::texts(fields)
        .err()
        .map(|e| bad_parameter(&e))
}
