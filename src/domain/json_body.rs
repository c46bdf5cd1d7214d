//! A body that declares JSON must be JSON: intake refuses (HTTP `400`, AMQP and NATS
//! dead-letter) a message whose content type is `application/json` or a `+json` type and whose
//! body is not UTF-8, does not parse or nests more than [`MAX_DEPTH`] levels deep, before
//! anything is claimed. Passed on, the provider would refuse it at best, after the claim was
//! acknowledged; other content types are passed on as they are.

/// A body that declares JSON and is not JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the body is not valid JSON ({content_type} declares JSON): {detail}")]
pub struct NotJson {
    /// The content type as sent (its media type only, lowercase).
    pub content_type: String,
    /// Where the parse failed (`key must be a string at line 1 column 2`).
    pub detail: String,
}

/// The media type of `content_type` (parameters left out), lowercase, when it is JSON:
/// `application/json`, or a type with the `+json` suffix (`application/problem+json`).
pub fn json_media_type(content_type: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(content_type).ok()?;
    let media = text
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let (kind, sub) = media.split_once('/')?;
    let json =
        (kind == "application" && sub == "json") || (!kind.is_empty() && sub.ends_with("+json"));
    json.then_some(media)
}

/// How many levels deep arrays and objects may nest in a body that declares JSON: serde_json's
/// own limit, the one every route that parses JSON (CloudEvents, the operator's actions) meets.
pub const MAX_DEPTH: usize = 127;

/// `Err` when `content_type` declares JSON and `body` is not JSON: not UTF-8 (RFC 8259), not
/// parsing, or nesting deeper than [`MAX_DEPTH`].
pub fn check(content_type: &[u8], body: &[u8]) -> Result<(), NotJson> {
    let Some(media) = json_media_type(content_type) else {
        return Ok(());
    };
    let refused = |detail: String| NotJson {
        content_type: media.clone(),
        detail,
    };
    // A string's bytes are not checked by every parse: checked here for the whole body.
    if let Err(e) = std::str::from_utf8(body) {
        return Err(refused(format!(
            "it is not UTF-8 (JSON text must be): invalid byte at offset {}",
            e.valid_up_to()
        )));
    }
    // Parsed without building the value, through `deserialize_any` so the parser's nesting
    // limit applies (`IgnoredAny` skips a value without it, at any depth).
    serde_json::from_slice::<Skipped>(body)
        .map(|_| ())
        .map_err(|e| {
            let text = e.to_string();
            refused(if text.starts_with("recursion limit exceeded") {
                format!("it nests arrays and objects more than {MAX_DEPTH} levels deep ({text})")
            } else {
                text
            })
        })
}

/// A JSON value read and kept nowhere.
struct Skipped;

impl<'de> serde::Deserialize<'de> for Skipped {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Skip)
    }
}

struct Skip;

impl<'de> serde::de::Visitor<'de> for Skip {
    type Value = Skipped;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_unit<E>(self) -> Result<Skipped, E> {
        Ok(Skipped)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Skipped, A::Error> {
        while seq.next_element::<Skipped>()?.is_some() {}
        Ok(Skipped)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Skipped, A::Error> {
        while map.next_entry::<Skipped, Skipped>()?.is_some() {}
        Ok(Skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_application_json_or_a_json_suffix_whatever_the_case_and_parameters() {
        assert_eq!(
            json_media_type(b"application/json").as_deref(),
            Some("application/json")
        );
        assert_eq!(
            json_media_type(b"Application/JSON; charset=utf-8").as_deref(),
            Some("application/json")
        );
        assert_eq!(
            json_media_type(b"application/vnd.api+json").as_deref(),
            Some("application/vnd.api+json")
        );
        for other in [
            &b"text/plain"[..],
            b"application/x-www-form-urlencoded",
            b"application/jsonp",
            b"json",
            b"",
            b"\xff/json",
        ] {
            assert_eq!(json_media_type(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_body_that_declares_json_and_is_not_is_refused_with_where_it_failed() {
        let e = check(b"application/json", b"{not json").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the body is not valid JSON (application/json declares JSON): key must be a string at line 1 column 2"
        );
        assert!(check(b"application/json", b"").is_err(), "an empty body");
        assert!(check(b"application/merge-patch+json", b"nope").is_err());
        assert_eq!(check(b"application/json", br#"{"amount": 100}"#), Ok(()));
        assert_eq!(check(b"application/json", b" [1, 2] \n"), Ok(()));
        assert_eq!(
            check(b"text/plain", b"{not json"),
            Ok(()),
            "not declared JSON"
        );
        assert_eq!(check(b"", b"{not json"), Ok(()), "no content type");
    }

    #[test]
    fn json_that_is_not_utf8_or_nests_past_the_limit_is_refused_saying_so() {
        let e = check(b"application/json", b"{\"a\":\"caf\xe9\"}").unwrap_err();
        assert!(
            e.detail.contains("not UTF-8") && e.detail.contains("offset 9"),
            "{e}"
        );
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(
            check(b"application/json", deep(MAX_DEPTH).as_bytes()),
            Ok(())
        );
        let e = check(b"application/json", deep(10_000).as_bytes()).unwrap_err();
        assert!(e.detail.contains("more than 127 levels deep"), "{e}");
        assert!(check(b"application/json", deep(MAX_DEPTH + 1).as_bytes()).is_err());
        // A lone surrogate escape is no character: refused, as by every other route.
        assert!(check(b"application/json", br#"{"a":"\ud800"}"#).is_err());
        let mixed = br#"{"a":[1,-2,3.5,true,null,{"b":"\u00e9"}],"c":{}}"#;
        assert_eq!(check(b"application/json", mixed), Ok(()));
    }
}
