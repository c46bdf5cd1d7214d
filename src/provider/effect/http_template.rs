//! Templates of the HTTP effect: `{key}`, `{message_id}`, `{tenant}`, `{consumer}` and payload
//! fields (`{amount}`, `{customer.id}`) in the URL, the status URL and the body. Each template
//! is parsed once, when the effect is built; rendering only looks values up. A payload that
//! lacks a field a template names is refused at intake ([`crate::provider::effect::Effect::validate`]),
//! never sent.

use serde_json::{Map, Value};

pub mod url_segments;

/// One thing a template can name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// The claim's idempotency key.
    Key,
    /// The message id.
    MessageId,
    /// The tenant (`""` when none).
    Tenant,
    /// The consumer's name.
    Consumer,
    /// A payload field: a dotted path into the JSON payload (`customer.id`, `items.0.sku`).
    Payload(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(Field),
}

/// A parsed template string. `{{` and `}}` stand for literal braces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

/// The values a template is rendered with.
#[derive(Debug, Clone, Copy)]
pub struct Vars<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// The message id.
    pub message_id: &'a str,
    /// The tenant.
    pub tenant: &'a str,
    /// The consumer.
    pub consumer: &'a str,
    /// The payload parsed as JSON, when a template needs payload fields.
    pub payload: Option<&'a Value>,
}

/// Why a template could not be rendered for a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The payload lacks a field the template names.
    #[error("the payload has no field {0:?}, which the request template needs")]
    Missing(String),
    /// The field is a JSON object or list where text is needed.
    #[error(
        "payload field {0:?} is an object or a list; the request template needs text or a number there"
    )]
    NotScalar(String),
    /// The template names payload fields and the payload is not a JSON object.
    #[error("the request template needs payload fields, and the payload is not a JSON object")]
    NotJson,
}

impl Template {
    /// Parses `text`. Names are letters, digits, `_`, `-` and `.` (a dotted path).
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => return Err("a '{' without a closing '}'".into()),
                        }
                    }
                    if name.is_empty()
                        || !name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                    {
                        return Err(format!(
                            "{{{}}} is not a field name (letters, digits, '_', '-', '.'; write {{{{ for a literal brace)",
                            name.escape_debug()
                        ));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field(match name.as_str() {
                        "key" => Field::Key,
                        "message_id" => Field::MessageId,
                        "tenant" => Field::Tenant,
                        "consumer" => Field::Consumer,
                        path => Field::Payload(path.split('.').map(str::to_string).collect()),
                    }));
                }
                '}' => return Err("a lone '}' (write }} for a literal)".into()),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Template { parts })
    }

    /// The fields the template names.
    pub fn fields(&self) -> impl Iterator<Item = &Field> {
        self.parts.iter().filter_map(|p| match p {
            Part::Field(f) => Some(f),
            Part::Text(_) => None,
        })
    }

    /// Whether the template names any payload field.
    pub fn needs_payload(&self) -> bool {
        self.fields().any(|f| matches!(f, Field::Payload(_)))
    }

    /// Renders with `vars`, every payload field standing for the sample text `p`: what
    /// configuration load checks a URL template with, before any payload exists.
    pub fn render_sample(&self, vars: &Vars<'_>, encode: fn(&str) -> String) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Field(Field::Payload(_)) => out.push_str(&encode("p")),
                Part::Field(f) => out.push_str(&encode(&text_of(f, vars).unwrap_or_default())),
            }
        }
        out
    }

    /// The template when it is exactly one field (`"{amount}"`): a JSON body keeps that
    /// field's JSON type.
    fn single_field(&self) -> Option<&Field> {
        match self.parts.as_slice() {
            [Part::Field(f)] => Some(f),
            _ => None,
        }
    }

    /// Renders to text, passing each value through `encode` (literal text is kept as written).
    pub fn render(
        &self,
        vars: &Vars<'_>,
        encode: fn(&str) -> String,
    ) -> Result<String, RenderError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Field(f) => out.push_str(&encode(&text_of(f, vars)?)),
            }
        }
        Ok(out)
    }
}

/// The value of a field as text.
fn text_of(field: &Field, vars: &Vars<'_>) -> Result<String, RenderError> {
    Ok(match value_of(field, vars)? {
        Value::String(s) => s,
        Value::Null => String::new(),
        v @ (Value::Number(_) | Value::Bool(_)) => v.to_string(),
        Value::Object(_) | Value::Array(_) => {
            let Field::Payload(path) = field else {
                unreachable!("only payload fields hold JSON")
            };
            return Err(RenderError::NotScalar(path.join(".")));
        }
    })
}

/// The value of a field as JSON.
fn value_of(field: &Field, vars: &Vars<'_>) -> Result<Value, RenderError> {
    Ok(match field {
        Field::Key => Value::from(vars.key),
        Field::MessageId => Value::from(vars.message_id),
        Field::Tenant => Value::from(vars.tenant),
        Field::Consumer => Value::from(vars.consumer),
        Field::Payload(path) => {
            let mut at = vars.payload.ok_or(RenderError::NotJson)?;
            if !at.is_object() {
                return Err(RenderError::NotJson);
            }
            for step in path {
                at = match at {
                    Value::Object(m) => m.get(step),
                    Value::Array(a) => step.parse::<usize>().ok().and_then(|i| a.get(i)),
                    _ => None,
                }
                .ok_or_else(|| RenderError::Missing(path.join(".")))?;
            }
            at.clone()
        }
    })
}

/// Parses a payload as JSON, refusing a key given twice in one object: readers disagree on
/// which one counts (serde_json keeps the last, many validators the first), so
/// `{"amount":5,"amount":999999}` checked as 5 upstream would be sent as 999999. The error
/// names the key.
pub fn parse_payload(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice::<UniqueKeys>(bytes)?;
    serde_json::from_slice(bytes)
}

/// Walks a JSON document, failing on the first object that holds a key twice.
struct UniqueKeys;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeys)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(UniqueKeys)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                let shown: String = key.chars().take(64).collect();
                return Err(serde::de::Error::custom(format_args!(
                    "the key {shown:?} appears twice in one object"
                )));
            }
            map.next_value::<UniqueKeys>()?;
            seen.insert(key);
        }
        Ok(UniqueKeys)
    }
}

/// A body template: the configured table with every string parsed as a [`Template`].
#[derive(Debug, Clone, PartialEq)]
pub enum BodyTemplate {
    /// A table.
    Object(Vec<(String, BodyTemplate)>),
    /// A list.
    Array(Vec<BodyTemplate>),
    /// A string, rendered.
    Text(Template),
    /// A number, boolean or null, kept.
    Literal(Value),
}

impl BodyTemplate {
    /// Parses every string of `value`; errors name the path (`metadata.order`).
    pub fn parse(value: &Value) -> Result<BodyTemplate, String> {
        Self::parse_at(value, "")
    }

    fn parse_at(value: &Value, at: &str) -> Result<BodyTemplate, String> {
        let join = |k: &str| {
            if at.is_empty() {
                k.to_string()
            } else {
                format!("{at}.{k}")
            }
        };
        Ok(match value {
            Value::Object(m) => BodyTemplate::Object(
                m.iter()
                    .map(|(k, v)| Ok((k.clone(), Self::parse_at(v, &join(k))?)))
                    .collect::<Result<_, String>>()?,
            ),
            Value::Array(a) => BodyTemplate::Array(
                a.iter()
                    .enumerate()
                    .map(|(i, v)| Self::parse_at(v, &join(&i.to_string())))
                    .collect::<Result<_, _>>()?,
            ),
            Value::String(s) => {
                BodyTemplate::Text(Template::parse(s).map_err(|e| format!("{}: {e}", join("")))?)
            }
            v => BodyTemplate::Literal(v.clone()),
        })
    }

    /// Every string template in the body.
    pub fn templates(&self) -> Vec<&Template> {
        match self {
            BodyTemplate::Object(m) => m.iter().flat_map(|(_, v)| v.templates()).collect(),
            BodyTemplate::Array(a) => a.iter().flat_map(BodyTemplate::templates).collect(),
            BodyTemplate::Text(t) => vec![t],
            BodyTemplate::Literal(_) => Vec::new(),
        }
    }

    /// Renders to JSON. A string that is exactly one field takes the field's JSON value.
    pub fn render(&self, vars: &Vars<'_>) -> Result<Value, RenderError> {
        Ok(match self {
            BodyTemplate::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| Ok((k.clone(), v.render(vars)?)))
                    .collect::<Result<Map<_, _>, RenderError>>()?,
            ),
            BodyTemplate::Array(a) => {
                Value::Array(a.iter().map(|v| v.render(vars)).collect::<Result<_, _>>()?)
            }
            BodyTemplate::Text(t) => match t.single_field() {
                Some(f) => value_of(f, vars)?,
                None => Value::String(t.render(vars, |s| s.to_string())?),
            },
            BodyTemplate::Literal(v) => v.clone(),
        })
    }
}

/// Encodes a JSON object as `application/x-www-form-urlencoded`, nested the way Stripe reads
/// it: `{"metadata": {"k": "v"}, "items": [{"price": "p"}]}` becomes
/// `metadata[k]=v&items[0][price]=p`. Null becomes an empty value.
pub fn form_encode(value: &Value) -> String {
    let mut pairs = Vec::new();
    flatten("", value, &mut pairs);
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", form_component(k), form_component(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    let name = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}[{k}]")
        }
    };
    match value {
        Value::Object(m) => m.iter().for_each(|(k, v)| flatten(&name(k), v, out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| flatten(&name(&i.to_string()), v, out)),
        Value::String(s) => out.push((prefix.to_string(), s.clone())),
        Value::Null => out.push((prefix.to_string(), String::new())),
        v => out.push((prefix.to_string(), v.to_string())),
    }
}

/// One name or value of a form body: unreserved characters kept, space as `+`, the rest
/// percent-encoded (brackets included, which form decoders read back).
pub fn form_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b' ' => out.push('+'),
            b if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'*') => {
                out.push(b as char)
            }
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Percent-encodes a key for use inside a URL path.
pub fn encode_path_segment(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vars(payload: &Value) -> Vars<'_> {
        Vars {
            key: "pay:acme:7",
            message_id: "7",
            tenant: "acme",
            consumer: "pay",
            payload: Some(payload),
        }
    }

    #[test]
    fn text_templates_name_reserved_and_payload_fields() {
        let p = json!({"amount": 1200, "customer": {"id": "cus 1/2"}});
        let t =
            Template::parse("/v1/customers/{customer.id}/pay?ref={message_id}&k={key}").unwrap();
        assert!(t.needs_payload());
        assert_eq!(
            t.render(&vars(&p), encode_path_segment).unwrap(),
            "/v1/customers/cus%201%2F2/pay?ref=7&k=pay%3Aacme%3A7"
        );
        let braces = Template::parse("{{literal}} {tenant}").unwrap();
        assert_eq!(
            braces.render(&vars(&p), |s| s.into()).unwrap(),
            "{literal} acme"
        );
        assert!(Template::parse("{unclosed").is_err());
        assert!(Template::parse("{bad name}").is_err());
        assert!(Template::parse("lone }").is_err());
    }

    #[test]
    fn a_missing_field_or_a_payload_that_is_not_an_object_is_an_error() {
        let t = Template::parse("{amount}").unwrap();
        let p = json!({"currency": "eur"});
        assert_eq!(
            t.render(&vars(&p), |s| s.into()),
            Err(RenderError::Missing("amount".into()))
        );
        let list = json!([1]);
        assert_eq!(
            t.render(&vars(&list), |s| s.into()),
            Err(RenderError::NotJson)
        );
        let nested = json!({"amount": {"value": 1}});
        assert_eq!(
            t.render(&vars(&nested), |s| s.into()),
            Err(RenderError::NotScalar("amount".into()))
        );
    }

    #[test]
    fn json_bodies_keep_field_types_and_form_bodies_nest_like_stripe() {
        let body = BodyTemplate::parse(&json!({
            "amount": "{amount}",
            "currency": "eur",
            "idempotency_key": "{key}",
            "note": "order {message_id}",
            "confirm": true,
            "metadata": {"claimd_key": "{key}"},
            "items": [{"sku": "{sku}"}]
        }))
        .unwrap();
        let p = json!({"amount": 1200, "sku": "a b&c"});
        let rendered = body.render(&vars(&p)).unwrap();
        assert_eq!(rendered["amount"], json!(1200));
        assert_eq!(rendered["note"], json!("order 7"));
        assert_eq!(rendered["metadata"]["claimd_key"], json!("pay:acme:7"));
        let form = form_encode(&rendered);
        for pair in [
            "amount=1200",
            "confirm=true",
            "metadata%5Bclaimd_key%5D=pay%3Aacme%3A7",
            "items%5B0%5D%5Bsku%5D=a+b%26c",
        ] {
            assert!(form.split('&').any(|p| p == pair), "{pair} in {form}");
        }
        assert_eq!(
            body.render(&vars(&json!({"amount": 1}))),
            Err(RenderError::Missing("sku".into()))
        );
    }

    #[test]
    fn a_payload_with_a_key_twice_is_refused_naming_the_key() {
        let e = parse_payload(br#"{"amount":5,"amount":999999}"#).unwrap_err();
        assert!(e.to_string().contains("\"amount\" appears twice"), "{e}");
        let e = parse_payload(br#"{"customer":{"id":"a","id":"b"},"n":1}"#).unwrap_err();
        assert!(e.to_string().contains("\"id\""), "nested objects too: {e}");
        let e = parse_payload(br#"[{"k":1},{"k":2,"k":3}]"#).unwrap_err();
        assert!(e.to_string().contains("\"k\""), "{e}");
        // The same key in two objects is no duplicate.
        let v = parse_payload(br#"{"a":{"k":1},"b":{"k":2},"l":[1,2.5,null,true,"s"]}"#).unwrap();
        assert_eq!(v["b"]["k"], json!(2));
        assert!(parse_payload(b"{not json").is_err());
    }

    #[test]
    fn a_url_template_with_payload_fields_renders_a_sample_at_load() {
        let t =
            Template::parse("https://api.example/v1/customers/{customer_id}/pay/{key}").unwrap();
        let empty = json!({});
        let sample = Vars {
            payload: None,
            ..vars(&empty)
        };
        assert_eq!(
            t.render_sample(&sample, encode_path_segment),
            "https://api.example/v1/customers/p/pay/pay%3Aacme%3A7"
        );
    }

    #[test]
    fn template_errors_do_not_repeat_the_text() {
        for bad in [
            "https://x/?sig=hunter2&{unclosed",
            "https://x/?sig=hunter2&{bad name}",
            "https://x/?sig=hunter2}",
        ] {
            let e = Template::parse(bad).unwrap_err();
            assert!(!e.contains("hunter2"), "{e}");
        }
    }
}
