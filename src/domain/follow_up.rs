//! Follow-ups: the claim a settle creates for another consumer (docs/follow-ups.md). Its
//! message id is derived from the parent's, its payload rendered from a JSON template whose
//! placeholders point into the parent's payload and the provider's answer. Pure.

use crate::domain::claim::{IdError, validate_message_id};
use serde_json::Value;

/// A payload template that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FollowUpError {
    /// The template is not JSON.
    #[error("payload is not JSON: {0}")]
    NotJson(String),
    /// A `{{...}}` that is not one of the placeholders.
    #[error(
        "unknown placeholder {{{{{0}}}}} (use {{{{payload:/pointer}}}}, {{{{answer:/pointer}}}}, {{{{message_id}}}} or {{{{tenant}}}})"
    )]
    UnknownPlaceholder(String),
    /// A `{{` without its `}}`.
    #[error("unclosed '{{{{' in payload")]
    Unclosed,
    /// A pointer into a document names a field the document does not have.
    #[error("{0} has no value at {1:?}")]
    Missing(&'static str, String),
}

/// What a rendered template may read: the parent's payload, the provider's answer (each as
/// JSON, `None` when it is not JSON), the parent's message id and tenant.
#[derive(Debug, Clone, Copy)]
pub struct FollowUpSource<'a> {
    /// The parent claim's payload.
    pub payload: Option<&'a Value>,
    /// The provider's answer to the parent's call.
    pub answer: Option<&'a Value>,
    /// The parent claim's message id.
    pub message_id: &'a str,
    /// The parent claim's tenant.
    pub tenant: &'a str,
}

/// One placeholder of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Placeholder {
    Payload(String),
    Answer(String),
    MessageId,
    Tenant,
}

fn placeholder(inner: &str) -> Result<Placeholder, FollowUpError> {
    let inner = inner.trim();
    let pointer = |p: &str| p.is_empty() || p.starts_with('/');
    if let Some(p) = inner.strip_prefix("payload:").filter(|p| pointer(p)) {
        return Ok(Placeholder::Payload(p.to_string()));
    }
    if let Some(p) = inner.strip_prefix("answer:").filter(|p| pointer(p)) {
        return Ok(Placeholder::Answer(p.to_string()));
    }
    match inner {
        "message_id" => Ok(Placeholder::MessageId),
        "tenant" => Ok(Placeholder::Tenant),
        other => Err(FollowUpError::UnknownPlaceholder(other.to_string())),
    }
}

fn resolve(p: &Placeholder, src: &FollowUpSource<'_>) -> Result<Value, FollowUpError> {
    let at = |doc: Option<&Value>, what: &'static str, ptr: &str| {
        doc.and_then(|d| d.pointer(ptr))
            .cloned()
            .ok_or_else(|| FollowUpError::Missing(what, ptr.to_string()))
    };
    match p {
        Placeholder::Payload(ptr) => at(src.payload, "the payload", ptr),
        Placeholder::Answer(ptr) => at(src.answer, "the provider's answer", ptr),
        Placeholder::MessageId => Ok(Value::String(src.message_id.to_string())),
        Placeholder::Tenant => Ok(Value::String(src.tenant.to_string())),
    }
}

/// A string with its placeholders: literal text and placeholders in turn.
fn split(text: &str) -> Result<Vec<Result<String, Placeholder>>, FollowUpError> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            parts.push(Ok(rest[..open].to_string()));
        }
        let close = rest[open..].find("}}").ok_or(FollowUpError::Unclosed)? + open;
        parts.push(Err(placeholder(&rest[open + 2..close])?));
        rest = &rest[close + 2..];
    }
    if !rest.is_empty() {
        parts.push(Ok(rest.to_string()));
    }
    Ok(parts)
}

/// A parsed payload template: JSON whose strings may hold placeholders. A string that is one
/// placeholder alone takes the value it points to as it is (a number stays a number); one
/// with other text around takes its text (a string's own text, another value's JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct PayloadTemplate {
    template: Value,
}

impl std::str::FromStr for PayloadTemplate {
    type Err = FollowUpError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let template: Value =
            serde_json::from_str(s).map_err(|e| FollowUpError::NotJson(e.to_string()))?;
        check(&template)?;
        Ok(PayloadTemplate { template })
    }
}

fn check(v: &Value) -> Result<(), FollowUpError> {
    match v {
        Value::String(s) => split(s).map(|_| ()),
        Value::Array(items) => items.iter().try_for_each(check),
        Value::Object(map) => map.values().try_for_each(check),
        _ => Ok(()),
    }
}

fn render_value(v: &Value, src: &FollowUpSource<'_>) -> Result<Value, FollowUpError> {
    Ok(match v {
        Value::String(s) => {
            let parts = split(s)?;
            if let [Err(p)] = parts.as_slice() {
                return resolve(p, src);
            }
            let mut out = String::new();
            for part in parts {
                match part {
                    Ok(text) => out.push_str(&text),
                    Err(p) => match resolve(&p, src)? {
                        Value::String(text) => out.push_str(&text),
                        other => out.push_str(&other.to_string()),
                    },
                }
            }
            Value::String(out)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|i| render_value(i, src))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, i)| Ok((k.clone(), render_value(i, src)?)))
                .collect::<Result<_, FollowUpError>>()?,
        ),
        other => other.clone(),
    })
}

impl PayloadTemplate {
    /// The payload for `src`, as JSON text; [`FollowUpError::Missing`] names the first
    /// placeholder that points at nothing.
    pub fn render(&self, src: &FollowUpSource<'_>) -> Result<String, FollowUpError> {
        render_value(&self.template, src).map(|v| v.to_string())
    }

    /// The template itself, as JSON text: the payload of a child parked because a value was
    /// missing, so a person sees what was asked for.
    pub fn text(&self) -> String {
        self.template.to_string()
    }
}

/// The message id of a follow-up: the parent's, `:` and the step name; refused when longer
/// than a message id may be or not visible ASCII (the step's name is checked at load).
pub fn child_message_id(parent: &str, step: &str) -> Result<String, IdError> {
    let id = format!("{parent}:{step}");
    validate_message_id(id.as_bytes()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn source<'a>(payload: &'a Value, answer: &'a Value) -> FollowUpSource<'a> {
        FollowUpSource {
            payload: Some(payload),
            answer: Some(answer),
            message_id: "m-1",
            tenant: "acme",
        }
    }

    #[test]
    fn placeholders_take_values_whole_or_as_text() {
        let t: PayloadTemplate = r#"{"to":"{{payload:/email}}","charge":"{{answer:/id}}",
            "amount":"{{payload:/amount}}","note":"charge {{answer:/id}} of {{payload:/amount}} for {{message_id}}@{{tenant}}"}"#
            .parse()
            .unwrap();
        let (p, a) = (
            json!({"email": "a@b.c", "amount": 12}),
            json!({"id": "ch_9"}),
        );
        let out: Value = serde_json::from_str(&t.render(&source(&p, &a)).unwrap()).unwrap();
        assert_eq!(
            out,
            json!({"to": "a@b.c", "charge": "ch_9", "amount": 12,
                   "note": "charge ch_9 of 12 for m-1@acme"})
        );
    }

    #[test]
    fn a_missing_value_is_named() {
        let t: PayloadTemplate = r#"{"charge":"{{answer:/id}}"}"#.parse().unwrap();
        let (p, a) = (json!({}), json!({"other": 1}));
        assert_eq!(
            t.render(&source(&p, &a)),
            Err(FollowUpError::Missing(
                "the provider's answer",
                "/id".into()
            ))
        );
    }

    #[test]
    fn bad_templates_are_refused() {
        assert!(matches!(
            "{".parse::<PayloadTemplate>(),
            Err(FollowUpError::NotJson(_))
        ));
        assert_eq!(
            r#"{"a":"{{nope}}"}"#.parse::<PayloadTemplate>(),
            Err(FollowUpError::UnknownPlaceholder("nope".into()))
        );
        assert_eq!(
            r#"{"a":"{{payload:/x"}"#.parse::<PayloadTemplate>(),
            Err(FollowUpError::Unclosed)
        );
    }

    #[test]
    fn child_ids_append_the_step_and_keep_the_limit() {
        assert_eq!(child_message_id("m-1", "receipt").unwrap(), "m-1:receipt");
        assert!(matches!(
            child_message_id(&"x".repeat(250), "receipt"),
            Err(IdError::TooLong { .. })
        ));
    }
}
