//! Bearer tokens: the admin token guards the operations routes and the page, the intake token
//! guards intake; both compared in constant time.

use super::problem::problem;
use super::state::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

/// Compares two secrets in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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

fn bearer_ok(expected: &str, req: &Request) -> bool {
    if expected.is_empty() {
        return true;
    }
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => {
            bearer_token(v.as_bytes()).is_some_and(|got| constant_time_eq(got, expected.as_bytes()))
        }
        // None, or two Authorization headers: which one counts would be a guess.
        _ => false,
    }
}

/// Lets a request through only with the admin token (when one is configured).
pub async fn require_admin(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if bearer_ok(&state.config.http.admin_token, &req) {
        next.run(req).await
    } else {
        unauthorized()
    }
}

/// Lets a request through only with the intake token (when one is configured).
pub async fn require_intake(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if bearer_ok(&state.config.http.intake_token, &req) {
        next.run(req).await
    } else {
        unauthorized()
    }
}

fn unauthorized() -> Response {
    let mut r = problem(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "this route needs Authorization: Bearer <token>",
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(constant_time_eq(b"", b""));
    }

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
