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

/// A `503` for a store that could not be read.
pub fn store_down(e: crate::store::StoreError) -> Response {
    tracing::warn!(error = %e, "store read failed");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "store unavailable",
        "the claim store could not be read; retry",
    )
}
