//! Whether a path segment of a provider's URL, as a message's values make it, would send the
//! call to another path: `.`, `..` (also percent-encoded, any number of times) or empty. HTTP
//! intake checks it against the parsed URL template; a producer's enqueue against the segments
//! the consumers' registry holds ([`registry_fault`]), the same rule as the PostgreSQL
//! function `claimd.enqueue_bytes` (migration 0018).

use serde_json::Value;

/// What makes a path segment unsafe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentFault {
    /// `.` or `..`, also percent-encoded (`%2e`, `.%2E`, `%252e`...), alone or between `/`.
    Dot,
    /// Nothing: `//`, which proxies merge.
    Empty,
}

impl SegmentFault {
    /// The sentence a refusal ends with.
    pub fn describe(&self) -> &'static str {
        match self {
            SegmentFault::Dot => {
                "a dot segment ('.' or '..', also percent-encoded), which would send the call to another path of the provider's API"
            }
            SegmentFault::Empty => {
                "an empty path segment ('//'), which proxies merge, sending the call to another path of the provider's API"
            }
        }
    }
}

/// What makes `segment` (a path segment as the values make it, before encoding) unsafe, if
/// anything: empty, or `.` or `..` as it is or once percent-decoded, any number of times
/// (a provider's proxy may decode what claimd encoded), alone or between `/` or `\`.
pub fn segment_fault(segment: &str) -> Option<SegmentFault> {
    if segment.is_empty() {
        return Some(SegmentFault::Empty);
    }
    let mut form = segment.as_bytes().to_vec();
    loop {
        if form
            .split(|b| matches!(b, b'/' | b'\\'))
            .any(|piece| piece == b"." || piece == b"..")
        {
            return Some(SegmentFault::Dot);
        }
        // Each round is shorter than the one before, so this ends.
        let decoded = percent_decode(&form);
        if decoded == form {
            return None;
        }
        form = decoded;
    }
}

/// `%XX` decoded; anything else (a `%` without two hex digits) kept as it is.
fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(hi * 16 + lo);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// The values a registry segment's `{"field": ...}` parts name.
#[derive(Debug, Clone, Copy)]
pub struct SegmentIds<'a> {
    /// The idempotency key the claim would carry.
    pub key: &'a str,
    /// The message id.
    pub message_id: &'a str,
    /// The tenant (`""`: none).
    pub tenant: &'a str,
    /// The consumer's name.
    pub consumer: &'a str,
}

/// Checks the path segments a registry entry holds (a JSON array of
/// `{"fields": "a and b", "parts": [...]}`, a part being literal text, `{"field": name}` or
/// `{"payload": [steps]}`) as a message's values make them; the refusal's text when one is
/// unsafe: `URL field account.id is '..': a dot segment ...`. A segment whose payload field is
/// missing, or is an object or an array, is not this check's business and passes (the call's
/// own rendering reports it), as does every payload field of a payload that is not a JSON
/// object.
pub fn registry_fault(
    segments: &Value,
    ids: &SegmentIds<'_>,
    payload: Option<&Value>,
) -> Option<String> {
    let doc = payload.filter(|d| d.is_object());
    'segments: for seg in segments.as_array().into_iter().flatten() {
        let mut rendered = String::new();
        for part in seg
            .get("parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(text) = part.as_str() {
                rendered.push_str(text);
            } else if let Some(field) = part.get("field").and_then(Value::as_str) {
                rendered.push_str(match field {
                    "key" => ids.key,
                    "message_id" => ids.message_id,
                    "tenant" => ids.tenant,
                    _ => ids.consumer,
                });
            } else {
                let Some(mut at) = doc else {
                    continue 'segments;
                };
                for step in part
                    .get("payload")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let step = step.as_str().unwrap_or_default();
                    let next = match at {
                        Value::Object(o) => o.get(step),
                        Value::Array(a) => array_index(step).and_then(|i| a.get(i)),
                        _ => None,
                    };
                    let Some(next) = next else { continue 'segments };
                    at = next;
                }
                match at {
                    Value::Object(_) | Value::Array(_) => continue 'segments,
                    Value::Null => {}
                    Value::String(s) => rendered.push_str(s),
                    other => rendered.push_str(&other.to_string()),
                }
            }
        }
        if let Some(fault) = segment_fault(&rendered) {
            let fields = seg
                .get("fields")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let shown: String = rendered.chars().take(64).collect();
            return Some(format!(
                "URL field {fields} is '{}': {}",
                shown.replace('\'', "''"),
                fault.describe()
            ));
        }
    }
    None
}

/// A path step read as an array index as the SQL function reads it: `+`? and 1-9 digits.
fn array_index(step: &str) -> Option<usize> {
    let digits = step.strip_prefix('+').unwrap_or(step);
    (!digits.is_empty() && digits.len() <= 9 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ids() -> SegmentIds<'static> {
        SegmentIds {
            key: "pay:7",
            message_id: "7",
            tenant: "acme",
            consumer: "pay",
        }
    }

    fn registry() -> Value {
        json!([
            {"fields": "account.id", "parts": [{"payload": ["account", "id"]}]},
            {"fields": "message_id", "parts": [{"field": "message_id"}]},
            {"fields": "items.0", "parts": ["x-", {"payload": ["items", "0"]}]},
        ])
    }

    #[test]
    fn dot_and_empty_segments_are_named_with_their_field() {
        for (payload, id, want) in [
            (
                json!({"account": {"id": ".."}}),
                "7",
                "URL field account.id is '..': a dot segment",
            ),
            (
                json!({"account": {"id": "%2e%2E"}}),
                "7",
                "URL field account.id is '%2e%2E': a dot",
            ),
            (
                json!({"account": {"id": "x/../y"}}),
                "7",
                "URL field account.id is 'x/../y': a dot",
            ),
            (
                json!({"account": {"id": ""}}),
                "7",
                "URL field account.id is '': an empty path",
            ),
            (
                json!({"account": {"id": null}}),
                "7",
                "URL field account.id is '': an empty path",
            ),
            (
                json!({"account": {"id": "1"}}),
                "%252e",
                "URL field message_id is '%252e': a dot",
            ),
        ] {
            let ids = SegmentIds {
                message_id: id,
                ..ids()
            };
            let got = registry_fault(&registry(), &ids, Some(&payload));
            assert!(
                got.as_deref().is_some_and(|g| g.starts_with(want)),
                "{payload} {id}: {got:?}"
            );
        }
    }

    #[test]
    fn values_inside_their_segment_and_fields_not_there_pass() {
        for payload in [
            json!({"account": {"id": "a..b"}}),
            json!({"account": {"id": 12}}),
            json!({"account": {"id": {"nested": ".."}}}),
            json!({"account": "flat"}),
            json!({}),
            json!(["not", "an", "object"]),
            json!({"account": {"id": "1"}, "items": [".x"]}),
        ] {
            assert_eq!(
                registry_fault(&registry(), &ids(), Some(&payload)),
                None,
                "{payload}"
            );
        }
        assert_eq!(registry_fault(&registry(), &ids(), None), None);
        assert_eq!(registry_fault(&json!([]), &ids(), None), None);
    }

    #[test]
    fn array_steps_and_quotes_read_as_the_sql_function_reads_them() {
        let got = registry_fault(&registry(), &ids(), Some(&json!({"items": [".", "b"]})));
        assert_eq!(got, None, "x-. stays inside its segment");
        let reg = json!([{"fields": "items.+1", "parts": [{"payload": ["items", "+1"]}]}]);
        let got = registry_fault(&reg, &ids(), Some(&json!({"items": ["a", ".."]})));
        assert!(got.is_some_and(|g| g.starts_with("URL field items.+1 is '..'")));
        let reg = json!([{"fields": "name", "parts": [{"payload": ["name"]}, "/.."]}]);
        let got = registry_fault(&reg, &ids(), Some(&json!({"name": "o'k"})));
        assert!(got.is_some_and(|g| g.starts_with("URL field name is 'o''k/..'")));
    }

    #[test]
    fn decoding_goes_on_until_nothing_changes() {
        assert_eq!(segment_fault("%25252e"), Some(SegmentFault::Dot));
        assert_eq!(segment_fault("%2"), None);
        assert_eq!(segment_fault("a%2Fb"), None);
        assert_eq!(segment_fault("a%2F..%2Fb"), Some(SegmentFault::Dot));
        assert_eq!(segment_fault(""), Some(SegmentFault::Empty));
    }
}
