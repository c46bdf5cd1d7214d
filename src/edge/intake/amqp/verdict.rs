//! What to do with one delivery, decided from its properties and the claimer's answer:
//! acknowledge, requeue after a pause, or dead-letter with a readable reason.

use super::*;
use crate::domain::claim::{IdError, validate_message_id, validate_tenant};
use crate::domain::schedule::parse_not_before;
use crate::provider::effect::http_template::Field;
use crate::provider::effect::http_template::url_segments::UrlValueError;

/// The message header asking for a scheduled send (docs/flow-control.md).
pub const NOT_BEFORE_HEADER: &str = "not-before";

/// What to do with one delivery.
pub(super) enum Verdict {
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
        /// The readable sentence for `claimd-reason`.
        sentence: String,
        /// The id as received, if any (for the record).
        message_id: Option<String>,
    },
}

/// A header's value as bytes, if it is a string (or a number, written in decimal).
pub(super) fn header_bytes(props: &BasicProperties, name: &str) -> Result<Option<Vec<u8>>, String> {
    let Some(value) = props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(name).cloned())
    else {
        return Ok(None);
    };
    Ok(Some(match value {
        AMQPValue::LongString(s) => s.as_bytes().to_vec(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes().to_vec(),
        AMQPValue::ByteArray(b) => b.as_slice().to_vec(),
        AMQPValue::ShortShortInt(n) => n.to_string().into_bytes(),
        AMQPValue::ShortShortUInt(n) => n.to_string().into_bytes(),
        AMQPValue::ShortInt(n) => n.to_string().into_bytes(),
        AMQPValue::ShortUInt(n) => n.to_string().into_bytes(),
        AMQPValue::LongInt(n) => n.to_string().into_bytes(),
        AMQPValue::LongUInt(n) => n.to_string().into_bytes(),
        AMQPValue::LongLongInt(n) => n.to_string().into_bytes(),
        AMQPValue::Void => return Ok(None),
        other => {
            return Err(format!(
                "header {name:?} holds a {:?}, not a string",
                other.get_type()
            ));
        }
    }))
}

/// The message id: the configured header when present, else the `message_id` property.
pub(super) fn message_id_of(props: &BasicProperties, header: &str) -> Result<Vec<u8>, String> {
    if !header.is_empty()
        && let Some(v) = header_bytes(props, header)?
    {
        return Ok(v);
    }
    Ok(props
        .message_id()
        .as_ref()
        .map(|s| s.as_str().as_bytes().to_vec())
        .unwrap_or_default())
}

/// How many tables or arrays deep `value` nests: 0 for a scalar, 1 for a table of scalars.
/// Iterative, so a deep value cannot overflow the stack here either.
pub(super) fn nesting(value: &AMQPValue) -> usize {
    let mut deepest = 0;
    let mut todo = vec![(value, 1)];
    while let Some((v, level)) = todo.pop() {
        match v {
            AMQPValue::FieldTable(t) => {
                deepest = deepest.max(level);
                todo.extend(t.inner().values().map(|v| (v, level + 1)));
            }
            AMQPValue::FieldArray(a) => {
                deepest = deepest.max(level);
                todo.extend(a.as_slice().iter().map(|v| (v, level + 1)));
            }
            _ => {}
        }
    }
    deepest
}

/// The headers nested more than [`MAX_HEADER_DEPTH`] levels deep (the `headers` table being
/// level 1), with their depth, in name order.
pub(super) fn too_deep_headers(props: &BasicProperties) -> Vec<(String, usize)> {
    let Some(headers) = props.headers().as_ref() else {
        return Vec::new();
    };
    headers
        .inner()
        .iter()
        .map(|(name, v)| (name.as_str().to_string(), 1 + nesting(v)))
        .filter(|(_, levels)| *levels > MAX_HEADER_DEPTH)
        .collect()
}

/// The sentence for headers nested too deep.
pub(super) fn depth_sentence(deep: &[(String, usize)]) -> String {
    let cut = lapin::types::parsing::MAX_NESTING_DEPTH;
    let each: Vec<String> = deep
        .iter()
        .map(|(name, levels)| {
            if *levels >= cut {
                format!("{name:?} ({cut} levels or more)")
            } else {
                format!("{name:?} ({levels} levels)")
            }
        })
        .collect();
    format!(
        "headers nest tables or arrays deeper than {MAX_HEADER_DEPTH} levels: {}; they are left out of this copy",
        each.join(", ")
    )
}

pub(super) fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A readable sentence for a refused id or tenant.
pub(super) fn id_sentence(e: &IdError, field: &str) -> String {
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

/// Decides, claiming when the input is good.
pub(super) async fn judge(ctx: &Ctx, d: &AmqpDelivery) -> Verdict {
    let c = &ctx.config;
    let props = &d.properties;
    let id_field = if ctx.amqp.message_id_header.is_empty() {
        "message id (AMQP message_id property)".to_string()
    } else {
        format!(
            "message id (header {:?} or the AMQP message_id property)",
            ctx.amqp.message_id_header
        )
    };
    let deep = too_deep_headers(props);
    if !deep.is_empty() {
        let id = message_id_of(props, &ctx.amqp.message_id_header)
            .ok()
            .filter(|id| !id.is_empty())
            .map(|id| lossy(&id));
        return Verdict::DeadLetter {
            reason: DeadLetterReason::HeadersTooDeep,
            sentence: depth_sentence(&deep),
            message_id: id,
        };
    }
    let raw_id = match message_id_of(props, &ctx.amqp.message_id_header) {
        Ok(id) => id,
        Err(why) => {
            return Verdict::DeadLetter {
                reason: DeadLetterReason::InvalidMessageId,
                sentence: format!("the message id cannot be read: {why}"),
                message_id: None,
            };
        }
    };
    let shown_id = (!raw_id.is_empty()).then(|| lossy(&raw_id));
    tracing::Span::current().record(
        "message_id",
        shown_id.as_deref().map(id_for_log).as_deref().unwrap_or(""),
    );
    if let Err(e) = validate_message_id(&raw_id) {
        let reason = if matches!(e, IdError::Missing(_)) {
            DeadLetterReason::MissingMessageId
        } else {
            DeadLetterReason::InvalidMessageId
        };
        return Verdict::DeadLetter {
            reason,
            sentence: id_sentence(&e, &id_field),
            message_id: shown_id,
        };
    }
    let tenant = if c.tenant_header.is_empty() {
        Vec::new()
    } else {
        match header_bytes(props, &c.tenant_header) {
            Ok(t) => t.unwrap_or_default(),
            Err(why) => {
                return Verdict::DeadLetter {
                    reason: DeadLetterReason::InvalidTenant,
                    sentence: format!("the tenant cannot be read: {why}"),
                    message_id: shown_id,
                };
            }
        }
    };
    if let Err(e) = validate_tenant(&tenant) {
        return Verdict::DeadLetter {
            reason: DeadLetterReason::InvalidTenant,
            sentence: id_sentence(&e, &format!("tenant (header {:?})", c.tenant_header)),
            message_id: shown_id,
        };
    }
    if d.data.len() > ctx.max_body_bytes {
        return Verdict::DeadLetter {
            reason: DeadLetterReason::BodyTooLarge,
            sentence: format!(
                "the body is {} bytes, over the limit of {} bytes ([http] max_body_bytes)",
                d.data.len(),
                ctx.max_body_bytes
            ),
            message_id: shown_id,
        };
    }
    let content_type = props
        .content_type()
        .as_ref()
        .map(|s| s.as_str().as_bytes().to_vec())
        .unwrap_or_default();
    let not_before = match header_bytes(props, NOT_BEFORE_HEADER) {
        Ok(None) => None,
        Ok(Some(v)) => {
            let text = String::from_utf8_lossy(&v);
            match parse_not_before("the not-before header", &text, chrono::Utc::now()) {
                Ok(at) => at,
                Err(e) => {
                    return Verdict::DeadLetter {
                        reason: DeadLetterReason::InvalidNotBefore,
                        sentence: e.to_string(),
                        message_id: shown_id,
                    };
                }
            }
        }
        Err(why) => {
            return Verdict::DeadLetter {
                reason: DeadLetterReason::InvalidNotBefore,
                sentence: format!("the not-before header cannot be read: {why}"),
                message_id: shown_id,
            };
        }
    };
    let delivery = Delivery {
        consumer: c.name.clone(),
        tenant,
        message_id: raw_id,
        payload: d.data.clone().into(),
        content_type,
        not_before,
    };
    match ctx.claimer.submit(delivery).await {
        Ok(Accepted::New(_)) => Verdict::Ack,
        Ok(Accepted::Duplicate(claim)) => {
            debug!(state = %claim.state, "duplicate delivery; acknowledging");
            Verdict::Ack
        }
        Err(SubmitError::BadId(e)) => Verdict::DeadLetter {
            reason: DeadLetterReason::InvalidMessageId,
            sentence: e.to_string(),
            message_id: shown_id,
        },
        Err(SubmitError::Conflict { claim, message_id }) => Verdict::DeadLetter {
            reason: DeadLetterReason::PayloadMismatch,
            sentence: format!(
                "message id {message_id:?} was already used with a different payload (claim received {}, now {}); publish a new message under a new message id",
                claim.received_utc.to_rfc3339(),
                claim.state
            ),
            message_id: shown_id,
        },
        Err(SubmitError::BadContentType(why)) => Verdict::DeadLetter {
            reason: DeadLetterReason::InvalidContentType,
            sentence: format!("the content_type property cannot be used: {why}"),
            message_id: shown_id,
        },
        Err(e @ SubmitError::TenantNotKeyed { .. }) => Verdict::DeadLetter {
            reason: DeadLetterReason::InvalidTenant,
            sentence: e.to_string(),
            message_id: shown_id,
        },
        Err(e @ SubmitError::KeyTooLong { .. }) => Verdict::DeadLetter {
            reason: DeadLetterReason::KeyTooLong,
            sentence: e.to_string(),
            message_id: shown_id,
        },
        Err(SubmitError::NotJson(e)) => Verdict::DeadLetter {
            reason: DeadLetterReason::UnusablePayload,
            sentence: e.to_string(),
            message_id: shown_id,
        },
        Err(SubmitError::UnsafeUrlValue(e)) => Verdict::DeadLetter {
            reason: unsafe_url_reason(&e),
            sentence: format!("the message cannot be sent by consumer {:?}: {e}", c.name),
            message_id: shown_id,
        },
        Err(SubmitError::BadPayload(why)) => Verdict::DeadLetter {
            reason: DeadLetterReason::UnusablePayload,
            sentence: format!("the payload cannot be used by consumer {:?}: {why}", c.name),
            message_id: shown_id,
        },
        // Input the store refused as data it cannot hold fails again on every redelivery.
        Err(SubmitError::Store(e)) if e.is_bad_input() => Verdict::DeadLetter {
            reason: DeadLetterReason::UnusablePayload,
            sentence: format!("the claim store cannot hold this message: {e}"),
            message_id: shown_id,
        },
        Err(SubmitError::Store(e)) => Verdict::Requeue {
            delay: STORE_RETRY_DELAY,
            why: format!("claim not committed: {e}"),
        },
        Err(e @ SubmitError::Busy(_)) => Verdict::Requeue {
            delay: BUSY_RETRY_DELAY,
            why: e.to_string(),
        },
        Err(e @ SubmitError::Interrupted) => Verdict::Requeue {
            delay: STORE_RETRY_DELAY,
            why: e.to_string(),
        },
        Err(e @ SubmitError::ShuttingDown) => Verdict::Requeue {
            delay: Duration::ZERO,
            why: e.to_string(),
        },
        Err(e @ SubmitError::UnknownConsumer(_)) => {
            // Cannot happen: tasks exist only for configured consumers.
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
    fn ids_come_from_the_header_when_configured_else_the_property() {
        let mut h = FieldTable::default();
        h.insert("x-id".into(), AMQPValue::LongString("from-header".into()));
        let props = BasicProperties::default()
            .with_message_id("from-property".into())
            .with_headers(h);
        assert_eq!(message_id_of(&props, "x-id").unwrap(), b"from-header");
        assert_eq!(message_id_of(&props, "").unwrap(), b"from-property");
        assert_eq!(message_id_of(&props, "x-other").unwrap(), b"from-property");
        assert!(
            message_id_of(&BasicProperties::default(), "")
                .unwrap()
                .is_empty()
        );
        let mut n = FieldTable::default();
        n.insert("x-id".into(), AMQPValue::LongLongInt(42));
        let props = BasicProperties::default().with_headers(n);
        assert_eq!(message_id_of(&props, "x-id").unwrap(), b"42");
        let mut t = FieldTable::default();
        t.insert("x-id".into(), AMQPValue::Boolean(true));
        let props = BasicProperties::default().with_headers(t);
        assert!(message_id_of(&props, "x-id").is_err());
    }

    /// A table value nesting `levels` tables, alternating tables and arrays below the first.
    fn nested(levels: usize) -> AMQPValue {
        let mut v = AMQPValue::LongString("bottom".into());
        for level in 0..levels {
            v = if level % 2 == 0 {
                let mut t = FieldTable::default();
                t.insert("a".into(), v);
                AMQPValue::FieldTable(t)
            } else {
                AMQPValue::FieldArray(vec![v].into())
            };
        }
        v
    }

    #[test]
    fn headers_nested_past_the_limit_are_named_with_their_depth() {
        assert_eq!(nesting(&AMQPValue::Boolean(true)), 0);
        assert_eq!(nesting(&nested(5)), 5);
        let mut h = FieldTable::default();
        h.insert("ok".into(), nested(MAX_HEADER_DEPTH - 1));
        h.insert("deep".into(), nested(MAX_HEADER_DEPTH));
        h.insert(
            "cut".into(),
            nested(lapin::types::parsing::MAX_NESTING_DEPTH),
        );
        let props = BasicProperties::default().with_headers(h);
        let deep = too_deep_headers(&props);
        assert_eq!(
            deep,
            vec![
                (
                    "cut".to_string(),
                    lapin::types::parsing::MAX_NESTING_DEPTH + 1
                ),
                ("deep".to_string(), MAX_HEADER_DEPTH + 1)
            ]
        );
        assert_eq!(
            depth_sentence(&deep),
            "headers nest tables or arrays deeper than 32 levels: \"cut\" (100 levels or more), \"deep\" (33 levels); they are left out of this copy"
        );
    }

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
