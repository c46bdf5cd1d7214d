//! Requests the routes cannot read are refused in `application/problem+json`, as every other
//! refusal: a query value or name that is not UTF-8 once percent-decoded is a `400` naming the
//! parameter (a route would otherwise read it with U+FFFD in place of the bytes and answer as
//! if asked something else: a search for replacement characters), and the extractors' own
//! rejections (a path segment that is not UTF-8, a number out of range, a method the route
//! does not take), which axum answers in `text/plain` or with no body, are rewritten with the
//! same status and their text as the detail.

use super::problem::problem;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

/// The longest rejection text kept as a detail (axum's are one line).
const MAX_DETAIL_BYTES: usize = 4096;

/// The layer: the query checked before any route runs; the answer rewritten when it is a
/// rejection.
pub async fn problem_rejections(req: Request, next: Next) -> Response {
    if let Some(refused) = req.uri().query().and_then(query_not_utf8) {
        return refused;
    }
    let method = req.method().clone();
    as_problem(next.run(req).await, &method).await
}

/// A `400` when a parameter of `query` is not UTF-8 once percent-decoded (`+` is a space).
fn query_not_utf8(query: &str) -> Option<Response> {
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = match String::from_utf8(percent_decoded(name)) {
            Ok(n) => n,
            Err(_) => {
                return Some(bad_query(
                    "a parameter name of the query is not UTF-8 once percent-decoded",
                ));
            }
        };
        if std::str::from_utf8(&percent_decoded(value)).is_err() {
            return Some(bad_query(&format!(
                "{} is not UTF-8 once percent-decoded (percent-encode text as UTF-8)",
                name.chars().take(64).collect::<String>()
            )));
        }
    }
    None
}

fn bad_query(why: &str) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "bad parameter",
        &format!("{why}; nothing was read or changed"),
    )
}

/// `text` percent-decoded, `+` as a space (a `%` not followed by two hex digits is kept).
fn percent_decoded(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' => match (
                bytes.get(i + 1).and_then(|b| hex(*b)),
                bytes.get(i + 2).and_then(|b| hex(*b)),
            ) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// `response` in problem+json when it is an extractor's rejection: an error status with a
/// `text/plain` body, or a `405` without one. Other answers pass as they are.
async fn as_problem(response: Response, method: &axum::http::Method) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.as_bytes().to_vec());
    let plain = content_type
        .as_deref()
        .is_some_and(|ct| ct.starts_with(b"text/plain"));
    let bare_405 = status == StatusCode::METHOD_NOT_ALLOWED && content_type.is_none();
    if !plain && !bare_405 {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_DETAIL_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let detail = if bare_405 {
        let allowed = parts
            .headers
            .get(header::ALLOW)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        format!("this route does not take {method}; it takes {allowed}")
    } else if text.is_empty() {
        status.canonical_reason().unwrap_or("refused").to_string()
    } else {
        text
    };
    let title = status
        .canonical_reason()
        .unwrap_or("refused")
        .to_ascii_lowercase();
    let mut r = problem(status, &title, &format!("{detail}; nothing was changed"));
    // The rejection's other headers stay (`Allow` on a `405`, `Connection: close`).
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            r.headers_mut().append(name.clone(), value.clone());
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_refused_only_for_bytes_that_are_not_utf8() {
        assert_eq!(percent_decoded("a%20b+c%2"), b"a b c%2");
        assert_eq!(percent_decoded("%C3%A9%zz"), "é%zz".as_bytes());
        for good in ["q=caf%C3%A9", "q=%", "q=100%25&limit=5", "&&x", "q=a+b"] {
            assert!(query_not_utf8(good).is_none(), "{good}");
        }
        for bad in ["q=%ff%fe", "limit=1&tenant=%C3", "%ff=1"] {
            assert!(query_not_utf8(bad).is_some(), "{bad}");
        }
    }
}
