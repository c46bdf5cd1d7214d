//! Where the fields of a URL template (`effect.url`, `effect.status_url`) stand, and what a
//! message may put there.
//!
//! When the template is parsed, a field may stand only in a path segment or a query value: in
//! the scheme, user, host or port the message would choose the host that receives the
//! provider's credentials. For each message (at intake, and again before each call), a path
//! segment that the message's values make `.`, `..` or empty is refused: values are
//! percent-encoded, so `/`, `?` and `#` stay inside their segment, but `.` and `..` need no
//! encoding and the URL's reader (and the provider's proxies) move the call to another path:
//! `/v1/accounts/{account}/payouts` with `".."` would call `/v1/payouts`.

use super::{Field, Part, Template, Vars};
pub use crate::domain::url_segment::{SegmentFault, segment_fault};

/// Where a field stands in a URL template when it may not stand there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Before the path: the scheme, user, password, host or port.
    BeforePath,
    /// The name of a query parameter.
    QueryName,
    /// The fragment (after `#`), which is never sent.
    Fragment,
}

/// A URL template that places a field where no field may stand. The message names the
/// placeholder, never the URL (its query may hold a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{{{placeholder}}} stands {}; a placeholder may stand only in a path segment or a query value", Place::describe(.place))]
pub struct PlacementError {
    /// The placeholder's name, as written between the braces.
    pub placeholder: String,
    /// Where it stands.
    pub place: Place,
}

impl Place {
    fn describe(&self) -> &'static str {
        match self {
            Place::BeforePath => {
                "in the scheme, user, host or port: the message would choose the host that receives the provider's credentials"
            }
            Place::QueryName => {
                "in a query parameter's name: the message would choose which parameter it sets"
            }
            Place::Fragment => "in the fragment, which is never sent",
        }
    }
}

/// A message whose values make a path segment of the request's URL unsafe: the call would
/// go to another path of the provider's API. Nothing is claimed, nothing is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("URL field {} is {:?}: {}", names(.fields), .value, SegmentFault::describe(.fault))]
pub struct UrlValueError {
    /// The fields that make the segment (usually one).
    pub fields: Vec<Field>,
    /// The segment as the message's values make it (before encoding), cut to 64 characters.
    pub value: String,
    /// Why it is refused.
    pub fault: SegmentFault,
}

fn names(fields: &[Field]) -> String {
    let names: Vec<String> = fields.iter().map(field_name).collect();
    names.join(" and ")
}

/// A field's name as a template writes it.
pub fn field_name(field: &Field) -> String {
    match field {
        Field::Key => "key".into(),
        Field::MessageId => "message_id".into(),
        Field::Tenant => "tenant".into(),
        Field::Consumer => "consumer".into(),
        Field::Payload(path) => path.join("."),
    }
}

/// The path segments of a URL template that hold fields, each as a template of its own: read
/// once, when the template is parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathFields {
    segments: Vec<Template>,
}

/// Where the walk through a URL template is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Zone {
    BeforePath,
    Path,
    QueryName,
    QueryValue,
    Fragment,
}

impl PathFields {
    /// Reads where `template`'s fields stand; `Err` for the first one that stands outside a
    /// path segment or a query value. A template without `://` has every field before its
    /// path.
    pub fn of(template: &Template) -> Result<PathFields, PlacementError> {
        let mut zone = Zone::BeforePath;
        let mut scheme = String::new();
        let mut segment: Vec<Part> = Vec::new();
        let mut segments = Vec::new();
        let mut end_segment = |segment: &mut Vec<Part>| {
            let parts = std::mem::take(segment);
            if parts.iter().any(|p| matches!(p, Part::Field(_))) {
                segments.push(Template { parts });
            }
        };
        for part in &template.parts {
            match part {
                Part::Field(f) => {
                    let place = match zone {
                        Zone::Path => {
                            segment.push(part.clone());
                            continue;
                        }
                        Zone::QueryValue => continue,
                        Zone::BeforePath => Place::BeforePath,
                        Zone::QueryName => Place::QueryName,
                        Zone::Fragment => Place::Fragment,
                    };
                    return Err(PlacementError {
                        placeholder: field_name(f),
                        place,
                    });
                }
                Part::Text(text) => {
                    let mut literal = String::new();
                    for c in text.chars() {
                        zone = match (zone, c) {
                            (Zone::BeforePath, c) => {
                                scheme.push(c);
                                match scheme.split_once("://") {
                                    // The authority ends at the first '/', '\', '?' or '#'.
                                    Some((_, rest)) => match rest.find(['/', '\\', '?', '#']) {
                                        Some(i) => match rest.as_bytes()[i] {
                                            b'?' => Zone::QueryName,
                                            b'#' => Zone::Fragment,
                                            _ => Zone::Path,
                                        },
                                        None => Zone::BeforePath,
                                    },
                                    None => Zone::BeforePath,
                                }
                            }
                            // Readers of http(s) URLs take '\' for '/'.
                            (Zone::Path, '/' | '\\') => {
                                segment.push(Part::Text(std::mem::take(&mut literal)));
                                end_segment(&mut segment);
                                Zone::Path
                            }
                            (Zone::Path, '?') => Zone::QueryName,
                            (Zone::Path, '#') => Zone::Fragment,
                            (Zone::Path, c) => {
                                literal.push(c);
                                Zone::Path
                            }
                            (Zone::QueryName, '=') => Zone::QueryValue,
                            (Zone::QueryName | Zone::QueryValue, '&') => Zone::QueryName,
                            (Zone::QueryName | Zone::QueryValue, '#') => Zone::Fragment,
                            (z, _) => z,
                        };
                    }
                    if !literal.is_empty() {
                        segment.push(Part::Text(literal));
                    }
                    if zone != Zone::Path {
                        end_segment(&mut segment);
                    }
                }
            }
        }
        end_segment(&mut segment);
        Ok(PathFields { segments })
    }

    /// The segments as the registry of enqueued messages holds them, for the SQL function
    /// that checks an enqueued message as [`PathFields::check`] does (migration 0018): each
    /// `{"fields": "a and b", "parts": [...]}`, a part being literal text (a string),
    /// `{"field": "key"}` (or `message_id`, `tenant`, `consumer`) or `{"payload": [steps]}`.
    pub fn registry(&self) -> Vec<serde_json::Value> {
        use serde_json::json;
        self.segments
            .iter()
            .map(|segment| {
                let fields: Vec<Field> = segment.fields().cloned().collect();
                let parts: Vec<serde_json::Value> = segment
                    .parts
                    .iter()
                    .map(|part| match part {
                        Part::Text(t) => json!(t),
                        Part::Field(Field::Payload(path)) => json!({ "payload": path }),
                        Part::Field(f) => json!({ "field": field_name(f) }),
                    })
                    .collect();
                json!({ "fields": names(&fields), "parts": parts })
            })
            .collect()
    }

    /// Whether any path segment holds a payload field.
    pub fn needs_payload(&self) -> bool {
        self.segments.iter().any(Template::needs_payload)
    }

    /// Checks the path segments `vars` make. A field the message lacks is not this check's
    /// business (rendering the template reports it) and passes here.
    pub fn check(&self, vars: &Vars<'_>) -> Result<(), UrlValueError> {
        for segment in &self.segments {
            let Ok(text) = segment.render(vars, |s| s.to_string()) else {
                continue;
            };
            if let Some(fault) = segment_fault(&text) {
                return Err(UrlValueError {
                    fields: segment.fields().cloned().collect(),
                    value: text.chars().take(64).collect(),
                    fault,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn layout(url: &str) -> Result<PathFields, PlacementError> {
        PathFields::of(&Template::parse(url).unwrap())
    }

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
    fn a_field_before_the_path_or_in_a_query_name_is_refused_at_load() {
        for (url, placeholder, place) in [
            ("http://{region}.example/v1", "region", Place::BeforePath),
            ("http://h:{port}/", "port", Place::BeforePath),
            ("{scheme}://h/", "scheme", Place::BeforePath),
            ("https://{user}:pw@h/", "user", Place::BeforePath),
            ("https://h{suffix}/x", "suffix", Place::BeforePath),
            ("https://api.example{path}", "path", Place::BeforePath),
            ("h/{no_scheme}", "no_scheme", Place::BeforePath),
            ("https://h/x?{name}=1", "name", Place::QueryName),
            ("https://h/x?a=1&b{n}=2", "n", Place::QueryName),
            ("https://h/x#{frag}", "frag", Place::Fragment),
            ("https://h/x?a={ok}#{frag}", "frag", Place::Fragment),
        ] {
            let e = layout(url).unwrap_err();
            assert_eq!(
                (e.placeholder.as_str(), e.place),
                (placeholder, place),
                "{url}"
            );
        }
        let e = layout("http://{region}.example/v1")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("{region} stands in the scheme, user, host or port")
                && e.contains("the host that receives the provider's credentials"),
            "{e}"
        );
    }

    #[test]
    fn fields_in_path_segments_and_query_values_are_allowed() {
        for url in [
            "https://api.example/v1/accounts/{account}/payouts",
            "https://api.example/v1/{key}?customer={customer.id}&k={key}",
            "https://h:8443/x/acct_{id}-{n}/y",
            "https://h/x?a=1&b={v}=2",
            "https://h\\x\\{v}",
            "https://h",
        ] {
            assert!(layout(url).is_ok(), "{url}");
        }
        assert_eq!(layout("https://h/x?q={v}").unwrap(), PathFields::default());
    }

    #[test]
    fn dot_and_empty_segments_are_refused_however_they_are_written() {
        for bad in [
            ".",
            "..",
            "%2e",
            "%2E",
            "%2e%2e",
            ".%2E",
            "%2E.",
            "%252e%252e",
            "../x",
            "a/..",
            "..\\",
            "%2e%2e%2fadmin",
        ] {
            assert_eq!(segment_fault(bad), Some(SegmentFault::Dot), "{bad}");
        }
        assert_eq!(segment_fault(""), Some(SegmentFault::Empty));
        for good in [
            "acct_1",
            "...",
            "a.b",
            ".hidden",
            "v1.0",
            "%2",
            "%zz",
            "%2e%2e%2e",
            "cus 1/2",
            "a/b",
        ] {
            assert_eq!(segment_fault(good), None, "{good}");
        }
    }

    #[test]
    fn a_message_is_checked_segment_by_segment_naming_its_fields() {
        let l = layout("https://h/v1/accounts/{account}/payouts/{key}?note={note}").unwrap();
        assert!(l.needs_payload());
        let ok = json!({"account": "acct_1", "note": ".."});
        assert_eq!(l.check(&vars(&ok)), Ok(()), "a query value is no segment");
        let e = l
            .check(&vars(&json!({"account": "..", "note": ""})))
            .unwrap_err();
        assert_eq!(e.fault, SegmentFault::Dot);
        assert_eq!(
            e.to_string(),
            "URL field account is \"..\": a dot segment ('.' or '..', also percent-encoded), which would send the call to another path of the provider's API"
        );
        let e = l.check(&vars(&json!({"account": null}))).unwrap_err();
        assert_eq!(e.fault, SegmentFault::Empty, "null renders empty");
        // A missing field is reported by rendering, not here.
        assert_eq!(l.check(&vars(&json!({}))), Ok(()));
        // Two fields make one segment together; text around a field keeps it safe.
        let two = layout("https://h/{a}{b}/acct_{c}").unwrap();
        let e = two
            .check(&vars(&json!({"a": ".", "b": ".", "c": ".."})))
            .unwrap_err();
        assert!(
            e.to_string().starts_with("URL field a and b is \"..\""),
            "{e}"
        );
        assert_eq!(
            two.check(&vars(&json!({"a": "x", "b": ".", "c": ".."}))),
            Ok(())
        );
        // Ids are fields too.
        let id = layout("https://h/v1/{message_id}").unwrap();
        assert!(!id.needs_payload());
        let e = id
            .check(&Vars {
                message_id: "..",
                ..vars(&ok)
            })
            .unwrap_err();
        assert_eq!(e.fields, vec![Field::MessageId]);
    }
}
