//! Reading what an HTTP provider answered: the body read whole up to [`MAX_READ_BYTES`]
//! (then cut to what is kept), the status classified into an [`Outcome`], and transport errors
//! described without secrets or recognised as "not processed" (HTTP/2).

use super::{
    MAX_READ_BYTES, MAX_RESPONSE_BYTES, Outcome, StatusClass, classify_status_with,
    parse_retry_after,
};
use crate::store::truncate;
use bytes::Bytes;

/// An answer's body, read up to [`MAX_READ_BYTES`].
pub(super) enum Read {
    /// All of it.
    Whole(Bytes),
    /// It is longer: its first [`MAX_READ_BYTES`].
    TooLong(Bytes),
}

/// Reads an answer's body, at most [`MAX_READ_BYTES`] of it (a provider's object with its
/// expansions is easily more than what is stored, and must be read whole to be read by value;
/// a body without end must not take the worker's memory).
pub(super) async fn read_bounded(mut response: reqwest::Response) -> reqwest::Result<Read> {
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_READ_BYTES {
            let room = MAX_READ_BYTES - body.len();
            body.extend_from_slice(&chunk[..room]);
            return Ok(Read::TooLong(body.freeze()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Read::Whole(body.freeze()))
}

/// What the provider's answer comes to: its status classified, its body kept whole (up to
/// [`MAX_READ_BYTES`]) when `by_value` reads a `2xx` by its content, else up to 4 KiB.
pub(super) async fn outcome_of(
    response: reqwest::Response,
    not_applied: &[u16],
    by_value: bool,
) -> Outcome {
    let status = response.status().as_u16();
    let retry_after = parse_retry_after(
        response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()),
    );
    let class = classify_status_with(status, not_applied);
    let status_i = i32::from(status);
    let whole = by_value && class == StatusClass::Applied;
    let body = match read_bounded(response).await {
        Ok(Read::Whole(b)) if whole => String::from_utf8_lossy(&b).into_owned(),
        Ok(Read::TooLong(_)) if whole => {
            // The effect happened or not by what the answer says, and it cannot be read
            // whole: no decision (the sweeper asks the status endpoint or a person).
            return Outcome::Unknown {
                status: Some(status_i),
                error: format!(
                    "provider answered {status} with an answer longer than {} KiB, not read: the outcome is unknown",
                    MAX_READ_BYTES / 1024
                ),
            };
        }
        Ok(Read::Whole(b) | Read::TooLong(b)) => {
            truncate(&String::from_utf8_lossy(&b), MAX_RESPONSE_BYTES)
        }
        Err(e) => format!("(answer unreadable: {})", describe(&e)),
    };
    match class {
        StatusClass::Applied => Outcome::Applied {
            status: status_i,
            response: body,
        },
        StatusClass::Rejected => Outcome::Rejected {
            status: status_i,
            response: body,
        },
        StatusClass::InProgress => Outcome::InProgress { status: status_i },
        StatusClass::NotApplied => Outcome::NotApplied {
            status: Some(status_i),
            retry_after,
            error: format!("provider answered {status}: {}", truncate(&body, 200)),
        },
        StatusClass::Unknown => Outcome::Unknown {
            status: Some(status_i),
            error: format!("provider answered {status}: {}", truncate(&body, 200)),
        },
    }
}

/// Whether an HTTP/2 provider said that it did not process the request: it refused the
/// stream (`REFUSED_STREAM`, RFC 9113 section 8.7), or it is closing the connection gracefully
/// (`GOAWAY` with `NO_ERROR`) and the request's stream came after the last one it will
/// process. The same two answers reqwest's own retry layer treats as safe to send again.
pub(super) fn never_processed(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            let reason = h2.reason();
            return h2.is_remote()
                && ((h2.is_reset() && reason == Some(h2::Reason::REFUSED_STREAM))
                    || (h2.is_go_away() && reason == Some(h2::Reason::NO_ERROR)));
        }
        source = s.source();
    }
    false
}

/// A transport error, described without the URL (which may carry credentials).
pub(super) fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "failed reading the answer"
    } else {
        "connection failed"
    };
    let mut detail = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}: {detail}")
    }
}
