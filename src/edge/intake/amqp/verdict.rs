//! What to do with one delivery, decided from its properties and the claimer's answer:
//! acknowledge, requeue after a pause, or dead-letter with a readable reason.

use super::frame_guard::{TOO_DEEP_HEADER, UNREADABLE_HEADER};
use super::*;
use crate::domain::trace_context::TRACEPARENT;
use crate::edge::intake::refusal::{Received, delivery_of, lossy, verdict_of};

/// The message header asking for a scheduled send (docs/flow-control.md).
pub const NOT_BEFORE_HEADER: &str = "not-before";

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
/// level 1), each as `"name" (N levels)`: those the broker guard took out and named in
/// [`TOO_DEEP_HEADER`], then any still in the table.
pub(super) fn too_deep_headers(props: &BasicProperties) -> Vec<String> {
    let Some(headers) = props.headers().as_ref() else {
        return Vec::new();
    };
    let mut deep: Vec<String> = marker(props, TOO_DEEP_HEADER).into_iter().collect();
    deep.extend(
        headers
            .inner()
            .iter()
            .map(|(name, v)| (name.as_str(), 1 + nesting(v)))
            .filter(|(_, levels)| *levels > MAX_HEADER_DEPTH)
            .map(|(name, levels)| format!("{name:?} ({levels} levels)")),
    );
    deep
}

/// The headers still in the table that nest too deep, by name (left out of a dead letter).
pub(super) fn too_deep_names(props: &BasicProperties) -> Vec<String> {
    let Some(headers) = props.headers().as_ref() else {
        return Vec::new();
    };
    headers
        .inner()
        .iter()
        .filter(|(_, v)| 1 + nesting(v) > MAX_HEADER_DEPTH)
        .map(|(name, _)| name.as_str().to_string())
        .collect()
}

/// The text of one of the broker guard's headers, when present.
fn marker(props: &BasicProperties, name: &str) -> Option<String> {
    match props.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    }
}

/// The sentence for headers nested too deep.
pub(super) fn depth_sentence(deep: &[String]) -> String {
    format!(
        "headers nest tables or arrays deeper than {MAX_HEADER_DEPTH} levels: {}; they are left out of this copy",
        deep.join(", ")
    )
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
    let received = Received {
        consumer: c,
        id: message_id_of(props, &ctx.amqp.message_id_header),
        id_field,
        tenant: if c.tenant_header.is_empty() {
            Ok(Vec::new())
        } else {
            header_bytes(props, &c.tenant_header).map(Option::unwrap_or_default)
        },
        body: d.data.clone().into(),
        max_body_bytes: ctx.max_body_bytes,
        content_type: props
            .content_type()
            .as_ref()
            .map(|s| s.as_str().as_bytes().to_vec())
            .unwrap_or_default(),
        not_before: header_bytes(props, NOT_BEFORE_HEADER),
        // The message's own property (0-255), capped at claimd's highest (100): a RabbitMQ
        // producer may use the whole range, and a message is never refused for it.
        priority: Ok(props
            .priority()
            .map(|p| p.min(100).to_string().into_bytes())),
        trace_parent: header_bytes(props, TRACEPARENT).ok().flatten(),
    };
    let shown_id = received.shown_id();
    let delivery = match delivery_of(received) {
        Ok(delivery) => delivery,
        Err(refused) => return refused,
    };
    // Which header could not be read is unknown here: it may have been the tenant. Checked
    // after the id, so a message whose id is bad as well is refused for its id.
    if let Some(what) = marker(props, UNREADABLE_HEADER) {
        return Verdict::DeadLetter {
            reason: DeadLetterReason::UnreadableHeaders,
            sentence: format!(
                "the headers cannot be read in full ({what}); the readable ones are kept in this copy"
            ),
            message_id: shown_id,
        };
    }
    verdict_of(
        &c.name,
        ctx.claimer.submit(delivery).await,
        shown_id,
        "content_type property",
    )
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
        // What the broker guard says of a header it took out.
        h.insert(
            TOO_DEEP_HEADER.into(),
            AMQPValue::LongString("\"cut\" (2000 levels)".into()),
        );
        let props = BasicProperties::default().with_headers(h);
        let deep = too_deep_headers(&props);
        assert_eq!(deep, vec!["\"cut\" (2000 levels)", "\"deep\" (33 levels)"]);
        assert_eq!(too_deep_names(&props), vec!["deep"]);
        assert_eq!(
            depth_sentence(&deep),
            "headers nest tables or arrays deeper than 32 levels: \"cut\" (2000 levels), \"deep\" (33 levels); they are left out of this copy"
        );
    }
}
