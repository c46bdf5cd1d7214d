//! Reading a NATS message's headers into a verdict, and writing a dead letter's headers.

use super::Ctx;
use crate::domain::trace_context::TRACEPARENT;
use crate::edge::intake::refusal::{
    DeadLetterReason, Received, STORE_RETRY_DELAY, Verdict, delivery_of, verdict_of,
};
use crate::store::sealing::fingerprint_matches;
use async_nats::HeaderMap;

/// The header asking for a scheduled send (docs/flow-control.md); matched in any case.
pub const NOT_BEFORE_HEADER: &str = "Not-Before";
/// The header giving a message's priority (docs/flow-control.md, "Priorities").
pub const PRIORITY_HEADER: &str = crate::domain::priority::HEADER;
/// The header a dead letter carries with a readable sentence saying why.
pub const REASON_HEADER: &str = "Claimd-Reason";
/// The header a dead letter carries with the reason class (`payload_mismatch`, ...).
pub const REASON_CODE_HEADER: &str = "Claimd-Reason-Code";
/// The header a dead letter carries with the subject the original was published on.
pub const ORIGINAL_SUBJECT_HEADER: &str = "Claimd-Original-Subject";
/// Where a dead letter carries the original's id header (`Nats-Msg-Id` is JetStream's
/// deduplication id: kept under its own name, the dead letter could be dropped as a duplicate).
pub const ORIGINAL_MESSAGE_ID_HEADER: &str = "Claimd-Original-Msg-Id";

/// The value of header `name` (compared without case), if present: one value, or an error
/// when the header is repeated with different values.
pub(super) fn header_bytes(
    headers: Option<&HeaderMap>,
    name: &str,
) -> Result<Option<Vec<u8>>, String> {
    let Some(headers) = headers else {
        return Ok(None);
    };
    let mut found: Option<&str> = None;
    for (n, values) in headers.iter() {
        if !AsRef::<str>::as_ref(n).eq_ignore_ascii_case(name) {
            continue;
        }
        for v in values {
            match found {
                Some(f) if f != v.as_str() => {
                    return Err(format!("header {name:?} appears with different values"));
                }
                _ => found = Some(v.as_str()),
            }
        }
    }
    Ok(found.map(|v| v.as_bytes().to_vec()))
}

/// The id as received, for the record of a message refused before its id was checked.
fn shown_id(headers: Option<&HeaderMap>, name: &str) -> Option<String> {
    header_bytes(headers, name)
        .ok()
        .flatten()
        .map(|id| String::from_utf8_lossy(&id).into_owned())
}

/// Decides, claiming when the input is good. `delivered`: how many times the server has
/// delivered this message (1 the first time).
pub(super) async fn judge(
    ctx: &Ctx,
    headers: Option<&HeaderMap>,
    payload: &bytes::Bytes,
    delivered: i64,
) -> Verdict {
    let c = &ctx.config;
    if let Ok(Some(what)) = header_bytes(headers, super::UNREADABLE_HEADERS) {
        // Which header a broken line was meant to be is unknown: it may have been the tenant.
        return Verdict::DeadLetter {
            reason: DeadLetterReason::UnreadableHeaders,
            sentence: format!(
                "the headers cannot be read in full ({}); the readable ones are kept in this copy",
                String::from_utf8_lossy(&what)
            ),
            message_id: shown_id(headers, &ctx.nats.message_id_header),
        };
    }
    let content_type = match header_bytes(headers, "Content-Type") {
        Ok(v) => v.unwrap_or_default(),
        Err(why) => {
            return Verdict::DeadLetter {
                reason: DeadLetterReason::InvalidContentType,
                sentence: format!("the content type cannot be read: {why}"),
                message_id: shown_id(headers, &ctx.nats.message_id_header),
            };
        }
    };
    let received = Received {
        consumer: c,
        id: header_bytes(headers, &ctx.nats.message_id_header).map(Option::unwrap_or_default),
        id_field: format!("message id (header {:?})", ctx.nats.message_id_header),
        tenant: if c.tenant_header.is_empty() {
            Ok(Vec::new())
        } else {
            header_bytes(headers, &c.tenant_header).map(Option::unwrap_or_default)
        },
        body: payload.clone(),
        max_body_bytes: ctx.max_body_bytes,
        content_type,
        not_before: header_bytes(headers, NOT_BEFORE_HEADER),
        priority: header_bytes(headers, PRIORITY_HEADER),
        trace_parent: header_bytes(headers, TRACEPARENT).ok().flatten(),
    };
    let shown_id = received.shown_id();
    let delivery = match delivery_of(received) {
        Ok(d) => d,
        Err(refused) => return refused,
    };
    let limit = i64::from(ctx.nats.max_deliver);
    if delivered > limit {
        // Held and never acknowledged that many times: claiming it again may be what stops
        // the worker. Unless its claim committed with this payload (then this is a duplicate),
        // set it aside. Another payload under that id is a conflict (I5): submitted, it is
        // counted on the claim and dead-lettered `payload_mismatch`, never acknowledged.
        let tenant = String::from_utf8_lossy(&delivery.tenant);
        let id = String::from_utf8_lossy(&delivery.message_id);
        return match ctx.claimer.store().get(&c.name, &tenant, &id).await {
            Ok(Some(claim)) if fingerprint_matches(&claim.fingerprint, &delivery.payload) => {
                Verdict::Ack
            }
            Ok(Some(_)) => verdict_of(
                &c.name,
                ctx.claimer.submit(delivery).await,
                shown_id,
                "Content-Type header",
            ),
            Ok(None) => Verdict::DeadLetter {
                reason: DeadLetterReason::DeliveryLimit,
                sentence: format!(
                    "delivered {delivered} times without an acknowledgement (max_deliver {limit}): claimd stopped or was killed while holding it each time, and it has no claim"
                ),
                message_id: shown_id,
            },
            Err(e) => Verdict::Requeue {
                delay: STORE_RETRY_DELAY,
                why: format!("cannot look the claim up: {e}"),
            },
        };
    }
    verdict_of(
        &c.name,
        ctx.claimer.submit(delivery).await,
        shown_id,
        "Content-Type header",
    )
}

/// A header value as NATS can carry it: one line of visible text.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The dead letter's headers: the original's (its id header under
/// [`ORIGINAL_MESSAGE_ID_HEADER`]), plus the reason sentence, the reason class and the
/// original subject.
pub(super) fn dead_letter_headers(
    original: Option<&HeaderMap>,
    id_header: &str,
    reason: DeadLetterReason,
    sentence: &str,
    subject: &str,
) -> HeaderMap {
    let mut out = HeaderMap::new();
    if let Some(h) = original {
        for (name, values) in h.iter() {
            let moved = AsRef::<str>::as_ref(name).eq_ignore_ascii_case(id_header)
                || AsRef::<str>::as_ref(name).eq_ignore_ascii_case("Nats-Msg-Id");
            for v in values {
                if moved {
                    out.append(ORIGINAL_MESSAGE_ID_HEADER, v.as_str());
                } else {
                    out.append(name.clone(), v.clone());
                }
            }
        }
    }
    out.insert(REASON_HEADER, one_line(sentence));
    out.insert(REASON_CODE_HEADER, reason.as_str());
    out.insert(ORIGINAL_SUBJECT_HEADER, one_line(subject));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_found_in_any_case_and_repeats_must_agree() {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", "pay-1");
        h.insert("tenant-id", "acme");
        assert_eq!(
            header_bytes(Some(&h), "nats-msg-id").unwrap(),
            Some(b"pay-1".to_vec())
        );
        assert_eq!(
            header_bytes(Some(&h), "Tenant-Id").unwrap(),
            Some(b"acme".to_vec())
        );
        assert_eq!(header_bytes(Some(&h), "Other").unwrap(), None);
        assert_eq!(header_bytes(None, "Other").unwrap(), None);
        h.append("Nats-Msg-Id", "pay-1");
        assert!(header_bytes(Some(&h), "Nats-Msg-Id").is_ok());
        h.append("Nats-Msg-Id", "pay-2");
        assert!(header_bytes(Some(&h), "Nats-Msg-Id").is_err());
    }

    #[test]
    fn a_dead_letter_keeps_the_headers_but_not_the_deduplication_id() {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", "pay-1");
        h.insert("Tenant-Id", "acme");
        let out = dead_letter_headers(
            Some(&h),
            "Nats-Msg-Id",
            DeadLetterReason::PayloadMismatch,
            "line one\r\nline two",
            "payments.in",
        );
        assert!(out.get("Nats-Msg-Id").is_none());
        assert_eq!(
            out.get(ORIGINAL_MESSAGE_ID_HEADER).unwrap().as_str(),
            "pay-1"
        );
        assert_eq!(out.get("Tenant-Id").unwrap().as_str(), "acme");
        assert_eq!(
            out.get(REASON_HEADER).unwrap().as_str(),
            "line one  line two"
        );
        assert_eq!(
            out.get(REASON_CODE_HEADER).unwrap().as_str(),
            "payload_mismatch"
        );
        assert_eq!(
            out.get(ORIGINAL_SUBJECT_HEADER).unwrap().as_str(),
            "payments.in"
        );
    }
}
