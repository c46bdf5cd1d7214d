//! What every broker intake (RabbitMQ, NATS JetStream) decides the same way about one message:
//! the checks before claiming (id, tenant, size, `not-before`) and the reading of the claimer's
//! answer, as a `Verdict`: acknowledge, requeue after a pause, or dead-letter with a
//! sentence a person can act on. Each intake carries the verdict out in its broker's terms.
//! Without a broker intake in the build (neither `amqp` nor `nats`) only [`DeadLetterReason`] is used.

#![cfg_attr(not(any(feature = "amqp", feature = "nats")), allow(dead_code))]

use crate::config::ConsumerConfig;
use crate::domain::claim::{IdError, validate_message_id, validate_tenant};
use crate::domain::schedule::parse_not_before;
use crate::domain::trace_context::TraceParent;
use crate::engine::claimer::{Accepted, Delivery, SubmitError};
use crate::provider::effect::http_template::Field;
use crate::provider::effect::http_template::url_segments::UrlValueError;
use std::time::Duration;
use tracing::{debug, error};

/// Log lines show at most this many characters of a message id (ids are refused over 255, but
/// a header can carry any length: the rest is cut, with the full length noted).
pub const LOGGED_ID_CHARS: usize = 128;

/// Pause before requeueing after a store failure, so a down database is not hammered.
pub(crate) const STORE_RETRY_DELAY: Duration = Duration::from_secs(1);
/// Pause before requeueing when the consumer was busy (it already waited `intake_wait`).
pub(crate) const BUSY_RETRY_DELAY: Duration = Duration::from_millis(200);

/// Why a broker message was dead-lettered (the reason class; the message carries a sentence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeadLetterReason {
    /// Neither the configured header nor the broker's own id field carried an id.
    MissingMessageId,
    /// The id is too long or contains a character outside visible ASCII.
    InvalidMessageId,
    /// The tenant header is too long or contains a character outside visible ASCII.
    InvalidTenant,
    /// The body is over `[http] max_body_bytes`.
    BodyTooLarge,
    /// The id was already used with a different payload.
    PayloadMismatch,
    /// The consumer's effect cannot use the payload (an email without a recipient).
    UnusablePayload,
    /// The content type cannot be stored and sent on (a control character).
    InvalidContentType,
    /// The rendered idempotency key is longer than the provider accepts.
    KeyTooLong,
    /// A header nests tables or arrays too deep (AMQP).
    HeadersTooDeep,
    /// The `not-before` header is neither an RFC 3339 time nor a duration, or too far ahead.
    InvalidNotBefore,
    /// The priority (AMQP `priority` property, NATS `Message-Priority` header) is not an
    /// integer from -100 to 100.
    InvalidPriority,
    /// Delivered more times than `max_deliver` without being acknowledged (NATS): claimd was
    /// stopped or killed while holding it each time, and it has no claim.
    DeliveryLimit,
    /// The header section could not be read in full: bytes that are not UTF-8, lines that
    /// are not `Name: value` (NATS).
    UnreadableHeaders,
}

impl DeadLetterReason {
    /// The name used in counts and the `dead_letters` table.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::MissingMessageId => "missing_message_id",
            DeadLetterReason::InvalidMessageId => "invalid_message_id",
            DeadLetterReason::InvalidTenant => "invalid_tenant",
            DeadLetterReason::BodyTooLarge => "body_too_large",
            DeadLetterReason::PayloadMismatch => "payload_mismatch",
            DeadLetterReason::UnusablePayload => "unusable_payload",
            DeadLetterReason::InvalidContentType => "invalid_content_type",
            DeadLetterReason::KeyTooLong => "key_too_long",
            DeadLetterReason::HeadersTooDeep => "headers_too_deep",
            DeadLetterReason::InvalidNotBefore => "invalid_not_before",
            DeadLetterReason::InvalidPriority => "invalid_priority",
            DeadLetterReason::DeliveryLimit => "delivery_limit",
            DeadLetterReason::UnreadableHeaders => "unreadable_headers",
        }
    }
}

/// What to do with one delivery.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// The claim is committed or the message is a duplicate.
    Ack,
    /// Nothing was committed, for a reason that may pass.
    Requeue {
        /// Pause before requeueing.
        delay: Duration,
        /// Why, for the log.
        why: String,
    },
    /// Bad input.
    DeadLetter {
        /// The class.
        reason: DeadLetterReason,
        /// The readable sentence the dead letter carries.
        sentence: String,
        /// The id as received, if any (for the record).
        message_id: Option<String>,
    },
}

impl Verdict {
    fn dead(reason: DeadLetterReason, sentence: String, message_id: &Option<String>) -> Verdict {
        Verdict::DeadLetter {
            reason,
            sentence,
            message_id: message_id.clone(),
        }
    }
}

/// A message id as log lines show it: whole up to [`LOGGED_ID_CHARS`] characters, else cut
/// there with the full length noted (a header can carry an id of any length).
pub fn id_for_log(id: &str) -> std::borrow::Cow<'_, str> {
    match id.char_indices().nth(LOGGED_ID_CHARS) {
        None => id.into(),
        Some((end, _)) => format!("{}… ({} bytes in all)", &id[..end], id.len()).into(),
    }
}

pub(crate) fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A readable sentence for a refused id or tenant.
pub(crate) fn id_sentence(e: &IdError, field: &str) -> String {
    match e {
        IdError::Missing(_) => format!("the message has no {field}"),
        IdError::TooLong { len, .. } => format!(
            "the {field} is {len} characters long; the limit is {}",
            crate::domain::claim::MAX_MESSAGE_ID_LEN
        ),
        IdError::NotVisibleAscii { position, .. } => format!(
            "the {field} contains a space, control or non-ASCII character at position {position}; it must be 1-255 visible ASCII characters"
        ),
    }
}

/// One broker message as an intake read it, before any check. A header that could not be
/// read at all (the wrong type) is an `Err` with the reason.
pub(crate) struct Received<'a> {
    /// The consumer it is for.
    pub consumer: &'a ConsumerConfig,
    /// The message id's bytes (empty: none).
    pub id: Result<Vec<u8>, String>,
    /// Where the id is read from, as the sentence names it.
    pub id_field: String,
    /// The tenant's bytes (empty: none).
    pub tenant: Result<Vec<u8>, String>,
    /// The body.
    pub body: bytes::Bytes,
    /// `[http] max_body_bytes`.
    pub max_body_bytes: usize,
    /// The content type's bytes (empty: none).
    pub content_type: Vec<u8>,
    /// The `not-before` header's bytes, if present.
    pub not_before: Result<Option<Vec<u8>>, String>,
    /// The priority as text (the NATS header's bytes; the AMQP property in decimal), if
    /// present.
    pub priority: Result<Option<Vec<u8>>, String>,
    /// The producer's `traceparent` header's bytes, if present and readable (one that does
    /// not parse is ignored).
    pub trace_parent: Option<Vec<u8>>,
}

impl Received<'_> {
    /// The id as received, for the record and the log (`None`: none, or unreadable).
    pub fn shown_id(&self) -> Option<String> {
        self.id
            .as_ref()
            .ok()
            .filter(|id| !id.is_empty())
            .map(|id| lossy(id))
    }
}

/// The delivery to submit, or the verdict on a message refused before claiming. Records the
/// id in the current span's `message_id` field.
pub(crate) fn delivery_of(r: Received<'_>) -> Result<Delivery, Verdict> {
    let c = r.consumer;
    let raw_id = match &r.id {
        Ok(id) => id.clone(),
        Err(why) => {
            return Err(Verdict::dead(
                DeadLetterReason::InvalidMessageId,
                format!("the message id cannot be read: {why}"),
                &None,
            ));
        }
    };
    let shown = r.shown_id();
    tracing::Span::current().record(
        "message_id",
        shown.as_deref().map(id_for_log).as_deref().unwrap_or(""),
    );
    if let Err(e) = validate_message_id(&raw_id) {
        let reason = if matches!(e, IdError::Missing(_)) {
            DeadLetterReason::MissingMessageId
        } else {
            DeadLetterReason::InvalidMessageId
        };
        return Err(Verdict::dead(reason, id_sentence(&e, &r.id_field), &shown));
    }
    let tenant = match r.tenant {
        Ok(t) => t,
        Err(why) => {
            return Err(Verdict::dead(
                DeadLetterReason::InvalidTenant,
                format!("the tenant cannot be read: {why}"),
                &shown,
            ));
        }
    };
    if let Err(e) = validate_tenant(&tenant) {
        let field = format!("tenant (header {:?})", c.tenant_header);
        return Err(Verdict::dead(
            DeadLetterReason::InvalidTenant,
            id_sentence(&e, &field),
            &shown,
        ));
    }
    if r.body.len() > r.max_body_bytes {
        let sentence = format!(
            "the body is {} bytes, over the limit of {} bytes ([http] max_body_bytes)",
            r.body.len(),
            r.max_body_bytes
        );
        return Err(Verdict::dead(
            DeadLetterReason::BodyTooLarge,
            sentence,
            &shown,
        ));
    }
    let not_before = match r.not_before {
        Ok(None) => None,
        Ok(Some(v)) => {
            let text = String::from_utf8_lossy(&v);
            parse_not_before("the not-before header", &text, chrono::Utc::now()).map_err(|e| {
                Verdict::dead(DeadLetterReason::InvalidNotBefore, e.to_string(), &shown)
            })?
        }
        Err(why) => {
            return Err(Verdict::dead(
                DeadLetterReason::InvalidNotBefore,
                format!("the not-before header cannot be read: {why}"),
                &shown,
            ));
        }
    };
    let priority = match r.priority {
        Ok(None) => crate::domain::priority::DEFAULT,
        Ok(Some(v)) => crate::domain::priority::parse(&v)
            .map_err(|e| Verdict::dead(DeadLetterReason::InvalidPriority, e.to_string(), &shown))?,
        Err(why) => {
            return Err(Verdict::dead(
                DeadLetterReason::InvalidPriority,
                format!("the priority cannot be read: {why}"),
                &shown,
            ));
        }
    };
    Ok(Delivery {
        consumer: c.name.clone(),
        tenant,
        message_id: raw_id,
        payload: r.body,
        content_type: r.content_type,
        not_before,
        trace_parent: r.trace_parent.as_deref().and_then(TraceParent::parse),
        priority,
    })
}

/// The verdict on the claimer's answer to a submitted message (`shown_id`: the id as
/// received, for the record; `content_type_field`: where the content type was read, as the
/// sentence names it).
pub(crate) fn verdict_of(
    consumer: &str,
    answer: Result<Accepted, SubmitError>,
    shown_id: Option<String>,
    content_type_field: &str,
) -> Verdict {
    use DeadLetterReason as R;
    let dead = |reason, sentence| Verdict::dead(reason, sentence, &shown_id);
    match answer {
        Ok(Accepted::New(_)) => Verdict::Ack,
        Ok(Accepted::Duplicate(claim)) => {
            debug!(state = %claim.state, "duplicate delivery; acknowledging");
            Verdict::Ack
        }
        Err(SubmitError::BadId(e)) => dead(R::InvalidMessageId, e.to_string()),
        Err(SubmitError::Conflict { claim, message_id }) => dead(
            R::PayloadMismatch,
            format!(
                "message id {message_id:?} was already used with a different payload (claim received {}, now {}); publish a new message under a new message id",
                claim.received_utc.to_rfc3339(),
                claim.state
            ),
        ),
        Err(SubmitError::BadContentType(why)) => dead(
            R::InvalidContentType,
            format!("the {content_type_field} cannot be used: {why}"),
        ),
        Err(e @ SubmitError::TenantNotKeyed { .. }) => dead(R::InvalidTenant, e.to_string()),
        Err(e @ SubmitError::KeyTooLong { .. }) => dead(R::KeyTooLong, e.to_string()),
        Err(SubmitError::NotJson(e)) => dead(R::UnusablePayload, e.to_string()),
        Err(SubmitError::UnsafeUrlValue(e)) => dead(
            unsafe_url_reason(&e),
            format!("the message cannot be sent by consumer {consumer:?}: {e}"),
        ),
        Err(SubmitError::BadPayload(why)) => dead(
            R::UnusablePayload,
            format!("the payload cannot be used by consumer {consumer:?}: {why}"),
        ),
        // Input the store refused as data it cannot hold fails again on every redelivery.
        Err(SubmitError::Store(e)) if e.is_bad_input() => dead(
            R::UnusablePayload,
            format!("the claim store cannot hold this message: {e}"),
        ),
        Err(SubmitError::Store(e)) => Verdict::Requeue {
            delay: STORE_RETRY_DELAY,
            why: format!("claim not committed: {e}"),
        },
        Err(e @ SubmitError::Busy(_)) => Verdict::Requeue {
            delay: BUSY_RETRY_DELAY,
            why: e.to_string(),
        },
        Err(e @ (SubmitError::Interrupted | SubmitError::NotReplicated(_))) => Verdict::Requeue {
            delay: STORE_RETRY_DELAY,
            why: e.to_string(),
        },
        Err(e @ SubmitError::ShuttingDown) => Verdict::Requeue {
            delay: Duration::ZERO,
            why: e.to_string(),
        },
        Err(e @ SubmitError::UnknownConsumer(_)) => {
            // Cannot happen: intake tasks exist only for configured consumers.
            error!(error = %e, "delivery for a consumer the claimer does not know");
            Verdict::Requeue {
                delay: STORE_RETRY_DELAY,
                why: e.to_string(),
            }
        }
    }
}

/// The dead-letter class of a message refused for a URL value: the class of whatever holds
/// it (a payload field, the tenant, else the message id, which the key is made of).
fn unsafe_url_reason(e: &UrlValueError) -> DeadLetterReason {
    if e.fields.iter().any(|f| matches!(f, Field::Payload(_))) {
        DeadLetterReason::UnusablePayload
    } else if e.fields.contains(&Field::Tenant) {
        DeadLetterReason::InvalidTenant
    } else {
        DeadLetterReason::InvalidMessageId
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_ids_are_cut_in_log_lines() {
        assert_eq!(id_for_log("order-1"), "order-1");
        let long = "k".repeat(100_000);
        let shown = id_for_log(&long);
        assert!(shown.starts_with(&"k".repeat(LOGGED_ID_CHARS)), "{shown}");
        assert!(shown.ends_with("… (100000 bytes in all)"), "{shown}");
        assert!(shown.len() < 200);
    }

    #[test]
    fn sentences_say_what_is_wrong() {
        let s = id_sentence(
            &validate_message_id(&[b'k'; 300]).unwrap_err(),
            "message id",
        );
        assert_eq!(s, "the message id is 300 characters long; the limit is 255");
        let s = id_sentence(&validate_message_id(b"a b").unwrap_err(), "message id");
        assert!(s.contains("position 1"), "{s}");
        assert_eq!(
            id_sentence(&validate_message_id(b"").unwrap_err(), "message id"),
            "the message has no message id"
        );
    }
}
