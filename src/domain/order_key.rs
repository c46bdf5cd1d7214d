//! Order keys (`order_key` of a consumer, docs/flow-control.md): the template that names the
//! entity a message is about (`{order_id}`, `{tenant}:{customer}`), rendered once at intake
//! from the payload's top-level JSON fields, the tenant and the message id. Claims of one
//! consumer and tenant whose keys are equal run one at a time, in the order they joined the
//! line. Pure: parsing and rendering only.

use std::fmt;
use std::str::FromStr;

/// The longest order key stored, in bytes: a key is compared and indexed, never sent.
pub const MAX_ORDER_KEY_BYTES: usize = 512;

/// A parsed `order_key` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderKeyTemplate {
    text: String,
    parts: Vec<Part>,
    /// The setting it came from, for messages (`order_key`, `effect.rate_limit_key`).
    setting: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    /// A top-level field of the JSON payload.
    Field(String),
    Tenant,
    MessageId,
}

/// Why a template is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{` without its `}`, or a `}` without its `{`.
    #[error("{0:?}: unbalanced braces (write a field as {{field}})")]
    Braces(String),
    /// `{}`.
    #[error("{0:?}: an empty {{}} names no field")]
    EmptyField(String),
    /// No placeholder: every claim of the consumer would wait for every other.
    #[error(
        "{0:?} names no field: every message would share one key; name the entity, e.g. \"{{order_id}}\""
    )]
    Constant(String),
}

/// Why a message has no order key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The payload is not a JSON object.
    #[error("{setting} {template:?} needs a JSON object payload to read {{{field}}} from")]
    NotJson {
        /// The setting.
        setting: &'static str,
        /// The template.
        template: String,
        /// The first field it reads.
        field: String,
    },
    /// The field is missing or null.
    #[error("{setting} {template:?}: the payload has no field {field:?}")]
    Missing {
        /// The setting.
        setting: &'static str,
        /// The template.
        template: String,
        /// The field.
        field: String,
    },
    /// The field is an object or an array.
    #[error(
        "{setting} {template:?}: field {field:?} is an object or array; it must be a string, number or boolean"
    )]
    NotScalar {
        /// The setting.
        setting: &'static str,
        /// The template.
        template: String,
        /// The field.
        field: String,
    },
    /// The rendered key is too long.
    #[error("the {setting} of this message is {len} bytes; the limit is {MAX_ORDER_KEY_BYTES}")]
    TooLong {
        /// The setting.
        setting: &'static str,
        /// Its length.
        len: usize,
    },
}

impl FromStr for OrderKeyTemplate {
    type Err = TemplateError;

    fn from_str(text: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match (rest.find('{'), rest.find('}')) {
                (None, None) => {
                    parts.push(Part::Literal(rest.to_string()));
                    break;
                }
                (Some(open), close) if close.is_none_or(|c| c > open) => {
                    if open > 0 {
                        parts.push(Part::Literal(rest[..open].to_string()));
                    }
                    let after = &rest[open + 1..];
                    let end = after
                        .find('}')
                        .ok_or_else(|| TemplateError::Braces(text.into()))?;
                    let name = &after[..end];
                    if name.contains('{') {
                        return Err(TemplateError::Braces(text.into()));
                    }
                    parts.push(match name.trim() {
                        "" => return Err(TemplateError::EmptyField(text.into())),
                        "tenant" => Part::Tenant,
                        "message_id" => Part::MessageId,
                        field => Part::Field(field.to_string()),
                    });
                    rest = &after[end + 1..];
                }
                _ => return Err(TemplateError::Braces(text.into())),
            }
        }
        if parts.iter().all(|p| matches!(p, Part::Literal(_))) {
            return Err(TemplateError::Constant(text.into()));
        }
        Ok(OrderKeyTemplate {
            text: text.to_string(),
            parts,
            setting: "order_key",
        })
    }
}

impl fmt::Display for OrderKeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl OrderKeyTemplate {
    /// The same template, named `setting` in its messages (it is `order_key` by default).
    pub fn for_setting(mut self, setting: &'static str) -> Self {
        self.setting = setting;
        self
    }

    /// The payload fields it reads, in order.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Field(f) => Some(f.as_str()),
            _ => None,
        })
    }

    /// The key of one message: its fields' values (a string as it is, a number or boolean as
    /// its JSON text), the tenant and the message id, between the template's literal text.
    pub fn render(
        &self,
        payload: &[u8],
        tenant: &str,
        message_id: &str,
    ) -> Result<String, RenderError> {
        let object = match self.fields().next() {
            None => None,
            Some(first) => Some(
                serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(payload)
                    .map_err(|_| RenderError::NotJson {
                        setting: self.setting,
                        template: self.text.clone(),
                        field: first.to_string(),
                    })?,
            ),
        };
        let mut key = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(l) => key.push_str(l),
                Part::Tenant => key.push_str(tenant),
                Part::MessageId => key.push_str(message_id),
                Part::Field(f) => {
                    let value = object.as_ref().and_then(|o| o.get(f));
                    match value {
                        None | Some(serde_json::Value::Null) => {
                            return Err(RenderError::Missing {
                                setting: self.setting,
                                template: self.text.clone(),
                                field: f.clone(),
                            });
                        }
                        Some(serde_json::Value::String(s)) => key.push_str(s),
                        Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                            key.push_str(&v.to_string())
                        }
                        Some(_) => {
                            return Err(RenderError::NotScalar {
                                setting: self.setting,
                                template: self.text.clone(),
                                field: f.clone(),
                            });
                        }
                    }
                }
            }
        }
        if key.len() > MAX_ORDER_KEY_BYTES {
            return Err(RenderError::TooLong {
                setting: self.setting,
                len: key.len(),
            });
        }
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> OrderKeyTemplate {
        s.parse().unwrap()
    }

    #[test]
    fn renders_fields_tenant_and_literals() {
        let body = br#"{"order_id": "o-42", "n": 7, "vip": true, "amount": 12.5}"#;
        assert_eq!(t("{order_id}").render(body, "", "m").unwrap(), "o-42");
        assert_eq!(
            t("{tenant}/order-{order_id}/{n}/{vip}")
                .render(body, "acme", "m")
                .unwrap(),
            "acme/order-o-42/7/true"
        );
        assert_eq!(
            t("{message_id}").render(b"not json", "", "m-1").unwrap(),
            "m-1"
        );
    }

    #[test]
    fn refuses_what_names_no_entity() {
        let body = br#"{"order_id": null, "items": [1], "o": {}}"#;
        assert!(matches!(
            t("{order_id}").render(body, "", "m"),
            Err(RenderError::Missing { .. })
        ));
        assert!(matches!(
            t("{customer}").render(body, "", "m"),
            Err(RenderError::Missing { .. })
        ));
        assert!(matches!(
            t("{items}").render(body, "", "m"),
            Err(RenderError::NotScalar { .. })
        ));
        assert!(matches!(
            t("{order_id}").render(b"[1]", "", "m"),
            Err(RenderError::NotJson { .. })
        ));
        let long = format!(r#"{{"k": "{}"}}"#, "x".repeat(600));
        assert!(matches!(
            t("{k}").render(long.as_bytes(), "", "m"),
            Err(RenderError::TooLong { len: 600, .. })
        ));
        let msg = t("{customer}")
            .render(body, "", "m")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("\"customer\""), "{msg}");
    }

    #[test]
    fn parses_only_real_templates() {
        for (text, want) in [
            ("orders", TemplateError::Constant("orders".into())),
            ("{order_id", TemplateError::Braces("{order_id".into())),
            ("order_id}", TemplateError::Braces("order_id}".into())),
            ("{a{b}}", TemplateError::Braces("{a{b}}".into())),
            ("{}", TemplateError::EmptyField("{}".into())),
        ] {
            assert_eq!(
                text.parse::<OrderKeyTemplate>().unwrap_err(),
                want,
                "{text}"
            );
        }
        assert_eq!(t("x-{a}-{b}").fields().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(t("{a}").to_string(), "{a}");
    }
}
