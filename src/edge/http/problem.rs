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
