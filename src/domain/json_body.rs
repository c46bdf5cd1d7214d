//! A body that declares JSON must be JSON: intake refuses (HTTP `400`, AMQP dead-letter) a
//! message whose content type is `application/json` or a `+json` type and whose body does not
//! parse, before anything is claimed. Passed on, the provider would refuse it at best, after
//! the claim was acknowledged; other content types are passed on as they are.

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

/// `Err` when `content_type` declares JSON and `body` does not parse as JSON.
pub fn check(content_type: &[u8], body: &[u8]) -> Result<(), NotJson> {
    let Some(media) = json_media_type(content_type) else {
        return Ok(());
    };
    // Parsed without building the value: only whether it is JSON matters here.
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map(|_| ())
        .map_err(|e| NotJson {
            content_type: media,
            detail: e.to_string(),
        })
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
}
