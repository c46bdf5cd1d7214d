//! CloudEvents 1.0 over HTTP: `POST /v1/events/{consumer}` takes an event in binary content
//! mode (attributes in `ce-` headers, the data as the body) or structured content mode
//! (`Content-Type: application/cloudevents+json`, the event as a JSON object), for a consumer
//! with `source = "http"`. docs/cloudevents.md is the user's page.
//!
//! The message id is the event's `source` and `id` joined by `|` (the spec: events with the
//! same `source` and `id` are the same event; `|` cannot appear in a URI-reference, so two
//! different pairs never give one id). The tenant is the extension attribute that
//! `cloudevents_tenant` names, or else the consumer's tenant header as on `/v1/messages`. The
//! answers are those of `POST /v1/messages/{consumer}`; an event missing required attributes
//! is refused with `400` naming them, a batch (`application/cloudevents-batch+json`) with
//! `415`.

use super::http::{
    not_before, read_body, repeated, submit_and_answer, tenant_of, trace_parent, unknown_consumer,
};
use crate::edge::AppState;
use crate::edge::http::problem::problem;
use crate::engine::claimer::Delivery;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use base64::Engine;

/// The attributes every event must have.
const REQUIRED: [&str; 4] = ["specversion", "id", "source", "type"];
/// Structured mode's media type.
const STRUCTURED: &str = "application/cloudevents+json";
/// Batched mode's media type (not taken: one event, one claim, one answer).
const BATCH: &str = "application/cloudevents-batch+json";

/// One event as claimd takes it.
#[derive(Debug, PartialEq, Eq)]
pub struct Event {
    /// The message id: `source|id`.
    pub message_id: String,
    /// The tenant attribute's value, when `cloudevents_tenant` names one and the event has it.
    pub tenant: Option<String>,
    /// The data, as the provider will receive it.
    pub data: Vec<u8>,
    /// The data's content type.
    pub content_type: Vec<u8>,
}

/// Why a request is not an event claimd takes.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// Neither mode's marks.
    #[error(
        "not a CloudEvent: no ce-specversion header (binary content mode) and the Content-Type is not {STRUCTURED} (structured content mode)"
    )]
    NotAnEvent,
    /// A batch.
    #[error(
        "{BATCH} (batched content mode) is not taken: send one event per request, so each has its own answer"
    )]
    Batch,
    /// Required attributes missing or empty.
    #[error("missing CloudEvents attributes: {}", .0.join(", "))]
    Missing(Vec<&'static str>),
    /// An attribute that is not what the spec says.
    #[error("{0}")]
    Invalid(String),
}

/// The event in `headers` and `body`; `tenant_attribute`: the extension attribute carrying
/// the tenant, if any.
pub fn event_of(
    headers: &HeaderMap,
    body: Vec<u8>,
    tenant_attribute: Option<&str>,
) -> Result<Event, EventError> {
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    if media == BATCH {
        return Err(EventError::Batch);
    }
    if media == STRUCTURED {
        return structured(&body, tenant_attribute);
    }
    if headers.contains_key("ce-specversion") {
        return binary(headers, body, tenant_attribute);
    }
    Err(EventError::NotAnEvent)
}

/// Binary content mode: `ce-<attribute>` headers (values percent-encoded), the body as data.
fn binary(
    headers: &HeaderMap,
    body: Vec<u8>,
    tenant_attribute: Option<&str>,
) -> Result<Event, EventError> {
    let attr = |name: &str| -> Result<Option<String>, EventError> {
        let h = format!("ce-{name}");
        let mut values = headers.get_all(h.as_str()).iter();
        let Some(v) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(EventError::Invalid(format!(
                "the {h} header appears more than once; send it once"
            )));
        }
        Ok(Some(percent_decoded(v.as_bytes(), &h)?))
    };
    let [id, source] = required(attr)?;
    let tenant = match tenant_attribute {
        Some(a) => attr(a)?,
        None => None,
    };
    Ok(Event {
        message_id: message_id(&source, &id)?,
        tenant,
        data: body,
        content_type: headers
            .get(header::CONTENT_TYPE)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default(),
    })
}

/// Structured content mode: the event is a JSON object; `data` (JSON, or a string for a
/// non-JSON `datacontenttype`) or `data_base64` is the data.
fn structured(body: &[u8], tenant_attribute: Option<&str>) -> Result<Event, EventError> {
    let doc: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| EventError::Invalid(format!("the event is not JSON: {e}")))?;
    let Some(obj) = doc.as_object() else {
        return Err(EventError::Invalid(
            "the event is not a JSON object (structured content mode)".into(),
        ));
    };
    let text = |name: &str| -> Result<Option<String>, EventError> {
        match obj.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(EventError::Invalid(format!(
                "the attribute {name:?} must be a string, not {other}"
            ))),
        }
    };
    let [id, source] = required(text)?;
    let declared = text("datacontenttype")?;
    let (data, content_type) = match (obj.get("data_base64"), obj.get("data")) {
        (Some(_), Some(_)) => {
            return Err(EventError::Invalid(
                "the event has both data and data_base64; send one".into(),
            ));
        }
        (Some(b64), None) => {
            let b64 = b64
                .as_str()
                .ok_or_else(|| EventError::Invalid("data_base64 must be a string".into()))?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| EventError::Invalid(format!("data_base64 is not base64: {e}")))?;
            (bytes, declared.unwrap_or_default())
        }
        (None, Some(data)) => {
            let ct = declared.unwrap_or_else(|| "application/json".into());
            match data {
                serde_json::Value::String(s) if !is_json(&ct) => (s.clone().into_bytes(), ct),
                // JSON data as the producer wrote it, byte for byte: re-serialised, it could
                // differ from a redelivery's (member order, spaces) and read as a mismatch.
                _ => (raw_member(body, "data")?.into_bytes(), ct),
            }
        }
        (None, None) => (Vec::new(), declared.unwrap_or_default()),
    };
    let tenant = match tenant_attribute {
        Some(a) => text(a)?,
        None => None,
    };
    Ok(Event {
        message_id: message_id(&source, &id)?,
        tenant,
        data,
        content_type: content_type.into_bytes(),
    })
}

/// The required attributes, read with `read`: `Missing` naming every one absent or empty, the
/// version checked; then the `id` and the `source`.
fn required(
    read: impl Fn(&str) -> Result<Option<String>, EventError>,
) -> Result<[String; 2], EventError> {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for name in REQUIRED {
        match read(name)?.filter(|v| !v.is_empty()) {
            Some(v) => found.push(v),
            None => missing.push(name),
        }
    }
    if !missing.is_empty() {
        return Err(EventError::Missing(missing));
    }
    check_version(&found[0])?;
    Ok([found[1].clone(), found[2].clone()])
}

/// The text of member `name` of the JSON object `body`, exactly as written.
fn raw_member(body: &[u8], name: &str) -> Result<String, EventError> {
    let members: std::collections::HashMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_slice(body)
            .map_err(|e| EventError::Invalid(format!("the event is not JSON: {e}")))?;
    Ok(members
        .get(name)
        .map(|v| v.get().to_string())
        .unwrap_or_default())
}

fn is_json(content_type: &str) -> bool {
    let media = content_type.split(';').next().unwrap_or("").trim();
    media.eq_ignore_ascii_case("application/json") || media.to_ascii_lowercase().ends_with("+json")
}

fn check_version(v: &str) -> Result<(), EventError> {
    if v == "1.0" {
        Ok(())
    } else {
        Err(EventError::Invalid(format!(
            "specversion {v:?} is not taken: claimd reads CloudEvents 1.0"
        )))
    }
}

/// The message id of the event `id` from `source`: `source|id`.
pub fn message_id(source: &str, id: &str) -> Result<String, EventError> {
    if source.contains('|') {
        return Err(EventError::Invalid(format!(
            "source {source:?} contains '|', which a URI-reference cannot: claimd joins source and id with it"
        )));
    }
    let joined = format!("{source}|{id}");
    if let Err(e) = crate::domain::claim::validate_message_id(joined.as_bytes()) {
        return Err(EventError::Invalid(format!(
            "the event's source and id joined ({}) cannot be a message id: {e}",
            crate::edge::intake::refusal::id_for_log(&joined)
        )));
    }
    Ok(joined)
}

/// A `ce-` header's value, percent-decoded (the HTTP binding encodes what is not printable
/// ASCII, `%` and `"`).
fn percent_decoded(raw: &[u8], name: &str) -> Result<String, EventError> {
    let bad = || {
        EventError::Invalid(format!(
            "the {name} header is not valid percent-encoded UTF-8"
        ))
    };
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            let hex = raw.get(i + 1..i + 3).ok_or_else(bad)?;
            let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// `POST /v1/events/{consumer}`
pub async fn post_event(
    State(state): State<AppState>,
    Path(consumer): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(refused) = unknown_consumer(&state, &consumer) {
        return refused;
    }
    let tenant_name = crate::edge::http::auth::tenant_header(&state, &consumer);
    for name in [
        tenant_name,
        header::CONTENT_TYPE.as_str(),
        "Not-Before",
        super::http::PRIORITY,
    ] {
        if let Some(refused) = repeated(&headers, name) {
            return refused;
        }
    }
    let not_before = match not_before(&headers) {
        Ok(at) => at,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "bad Not-Before", &detail),
    };
    let priority = match super::http::priority(&headers) {
        Ok(p) => p,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "bad Message-Priority", &detail),
    };
    let (body, share) = match read_body(&state, &consumer, &headers, body).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let attribute = state
        .claimer
        .consumer(&consumer)
        .and_then(|c| c.config.cloudevents_tenant.clone());
    let event = match event_of(&headers, body, attribute.as_deref()) {
        Ok(e) => e,
        Err(EventError::Batch) => {
            return problem(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "batched events",
                &EventError::Batch.to_string(),
            );
        }
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "not a CloudEvent claimd takes",
                &format!("{e}; nothing was recorded"),
            );
        }
    };
    let from_header = tenant_of(&state, &consumer, &headers);
    let tenant = match (event.tenant, attribute) {
        (Some(t), Some(a)) => {
            // A tenant's token is checked against the header: the event may not name another.
            if !from_header.is_empty() && from_header != t.as_bytes() {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "two tenants",
                    &format!(
                        "the event's {a} attribute names tenant {t:?} and the {tenant_name} header another; nothing was recorded"
                    ),
                );
            }
            t.into_bytes()
        }
        _ => from_header.to_vec(),
    };
    let delivery = Delivery {
        tenant,
        consumer,
        message_id: event.message_id.into_bytes(),
        payload: event.data.into(),
        content_type: event.content_type,
        not_before,
        trace_parent: trace_parent(&headers),
        priority,
    };
    submit_and_answer(&state, delivery, share, &headers).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn binary_mode_reads_ce_headers_and_the_body() {
        let e = event_of(
            &h(&[
                ("ce-specversion", "1.0"),
                ("ce-id", "A%2D234"),
                ("ce-source", "/orders"),
                ("ce-type", "order.paid"),
                ("ce-tenantid", "acme"),
                ("content-type", "application/json"),
            ]),
            br#"{"amount":1}"#.to_vec(),
            Some("tenantid"),
        )
        .unwrap();
        assert_eq!(e.message_id, "/orders|A-234");
        assert_eq!(e.tenant.as_deref(), Some("acme"));
        assert_eq!(e.data, br#"{"amount":1}"#);
        assert_eq!(e.content_type, b"application/json");
    }

    #[test]
    fn missing_attributes_are_named() {
        let e = event_of(
            &h(&[("ce-specversion", "1.0"), ("ce-type", "t")]),
            vec![],
            None,
        );
        assert_eq!(e, Err(EventError::Missing(vec!["id", "source"])));
        assert_eq!(
            e.unwrap_err().to_string(),
            "missing CloudEvents attributes: id, source"
        );
        let structured = h(&[(
            "content-type",
            "application/cloudevents+json; charset=utf-8",
        )]);
        let e = event_of(
            &structured,
            br#"{"specversion":"1.0","id":""}"#.to_vec(),
            None,
        );
        assert_eq!(e, Err(EventError::Missing(vec!["id", "source", "type"])));
        assert_eq!(event_of(&h(&[]), vec![], None), Err(EventError::NotAnEvent));
        let batch = h(&[("content-type", "application/cloudevents-batch+json")]);
        assert_eq!(
            event_of(&batch, b"[]".to_vec(), None),
            Err(EventError::Batch)
        );
    }

    #[test]
    fn structured_mode_takes_data_or_data_base64() {
        let ct = h(&[("content-type", "application/cloudevents+json")]);
        let base =
            r#""specversion":"1.0","id":"7","source":"https://shop.example/orders","type":"t""#;
        let json = event_of(
            &ct,
            format!(r#"{{{base},"data":{{"amount":1}}}}"#).into_bytes(),
            None,
        )
        .unwrap();
        assert_eq!(json.message_id, "https://shop.example/orders|7");
        assert_eq!(json.data, br#"{"amount":1}"#);
        let spaced = event_of(
            &ct,
            format!(r#"{{{base},"data": {{"b": 1, "a": 2}} }}"#).into_bytes(),
            None,
        )
        .unwrap();
        assert_eq!(spaced.data, br#"{"b": 1, "a": 2}"#, "kept as written");
        assert_eq!(json.content_type, b"application/json");
        let text = event_of(
            &ct,
            format!(r#"{{{base},"datacontenttype":"text/plain","data":"hi"}}"#).into_bytes(),
            None,
        )
        .unwrap();
        assert_eq!(
            (text.data.as_slice(), text.content_type.as_slice()),
            (&b"hi"[..], &b"text/plain"[..])
        );
        let b64 = event_of(
            &ct,
            format!(
                r#"{{{base},"datacontenttype":"application/octet-stream","data_base64":"AAE="}}"#
            )
            .into_bytes(),
            None,
        )
        .unwrap();
        assert_eq!(b64.data, vec![0, 1]);
        let v = event_of(
            &ct,
            br#"{"specversion":"0.3","id":"1","source":"s","type":"t"}"#.to_vec(),
            None,
        );
        assert!(matches!(v, Err(EventError::Invalid(m)) if m.contains("1.0")));
        assert!(message_id("a|b", "c").is_err());
        assert!(message_id("/orders", "a b").is_err());
        assert!(message_id("/orders", &"k".repeat(250)).is_err());
    }
}
