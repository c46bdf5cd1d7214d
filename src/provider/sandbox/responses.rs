//! The sandbox's answers: problem+json errors, JSON and byte bodies, and the checks on the
//! key header and the key in a path.

use super::*;

/// The key if the header is 1–255 visible ASCII characters.
pub(super) fn valid_key(value: &HeaderValue) -> Option<String> {
    let bytes = value.as_bytes();
    let ok = !bytes.is_empty() && bytes.len() <= 255 && bytes.iter().all(|b| b.is_ascii_graphic());
    // Visible ASCII only, so the conversion cannot fail.
    ok.then(|| String::from_utf8_lossy(bytes).into_owned())
}

pub(super) fn key_reused(key: &str) -> Response<Full<Bytes>> {
    problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Idempotency-Key Reused",
        format!("Idempotency-Key {key:?} was already used with a different request body"),
    )
}

/// Decode `%XX` escapes; `None` when the result is not valid UTF-8 or an escape is malformed.
pub(super) fn percent_decode(input: &str) -> Option<String> {
    if !input.contains('%') {
        return Some(input.to_owned());
    }
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

pub(super) fn bytes_response(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

pub(super) fn json_response<T: Serialize + ?Sized>(
    status: StatusCode,
    value: &T,
) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(body) => bytes_response(status, Bytes::from(body)),
        Err(error) => {
            tracing::debug!(%error, "sandbox could not serialize a response");
            let mut response = bytes_response(StatusCode::INTERNAL_SERVER_ERROR, Bytes::new());
            response.headers_mut().remove(header::CONTENT_TYPE);
            response
        }
    }
}

pub(super) fn problem(status: StatusCode, title: &str, detail: String) -> Response<Full<Bytes>> {
    let body = json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = json_response(status, &body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

pub(super) fn method_not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut response = problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method Not Allowed",
        format!("use {allow}"),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

/// The object the sandbox makes for an effect: its id, the key, the path, `status`
/// (`succeeded`, or `processing` when asked), `created` (seconds since 1970), and the request's
/// top-level `amount` and `currency` when it has them (for `claimd reconcile --ledger`).
pub(super) fn effect_object(
    id: u64,
    key: &str,
    path: &str,
    request: &[u8],
    processing: bool,
) -> Value {
    let mut object = json!({
        "id": format!("eff_{id}"),
        "key": key,
        "status": if processing { pending::PROCESSING } else { "succeeded" },
        "path": path,
        "created": Utc::now().timestamp(),
    });
    // Only a JSON object body is read; the common case (no amount) costs one scan.
    if request.windows(8).any(|w| w == b"\"amount\"")
        && let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(request)
    {
        for field in ["amount", "currency"] {
            if let Some(v) = body.get(field) {
                object[field] = v.clone();
            }
        }
    }
    object
}
