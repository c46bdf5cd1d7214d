//! Reading a status endpoint's answer: found, not found or unknown, from the status code and a
//! condition on the JSON body ([`StatusCheck`]), with the provider's id when found. Pure, so
//! every shape is tested here. A `404` means "not found" only when the configuration says so:
//! a search endpoint that does not exist answers `404` too.

use super::{Lookup, MAX_RESPONSE_BYTES};
use crate::provider::effect::settings::StatusCheck;
use crate::store::truncate;
use serde_json::Value;

/// Classifies one answer of the status endpoint.
pub fn read_answer(check: &StatusCheck, status: u16, body: &[u8]) -> Lookup {
    let text = || truncate(&String::from_utf8_lossy(body), MAX_RESPONSE_BYTES);
    if (200..300).contains(&status) {
        let json: Option<Value> = serde_json::from_slice(body).ok();
        let needs_json = !check.found_pointer.is_empty() || !check.id_pointer.is_empty();
        if needs_json && json.is_none() {
            return Lookup::Unknown {
                error: format!(
                    "status endpoint answered {status} with a body that is not JSON: {}",
                    truncate(&text(), 200)
                ),
            };
        }
        let present = |pointer: &str| {
            json.as_ref()
                .and_then(|j| j.pointer(pointer))
                .filter(|v| !v.is_null())
        };
        if !check.found_pointer.is_empty() && present(&check.found_pointer).is_none() {
            return Lookup::NotFound {
                status: i32::from(status),
                detail: format!("{status} without {}", check.found_pointer),
            };
        }
        let provider_id = (!check.id_pointer.is_empty())
            .then(|| present(&check.id_pointer))
            .flatten()
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
        // Whole (as read, up to MAX_READ_BYTES): it may be read by value once more; it is
        // cut to MAX_RESPONSE_BYTES when stored.
        return Lookup::Found {
            status: i32::from(status),
            response: String::from_utf8_lossy(body).into_owned(),
            provider_id,
        };
    }
    if check.not_found_status.contains(&status) {
        return Lookup::NotFound {
            status: i32::from(status),
            detail: format!("status endpoint answered {status}"),
        };
    }
    Lookup::Unknown {
        error: format!(
            "status endpoint answered {status}, which is neither found nor the configured \"not found\" ({:?}): {}",
            check.not_found_status,
            truncate(&text(), 200)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search() -> StatusCheck {
        StatusCheck {
            not_found_status: vec![],
            found_pointer: "/data/0".into(),
            id_pointer: "/data/0/id".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_search_reads_the_list_and_a_missing_endpoint_is_unknown() {
        let found = read_answer(&search(), 200, br#"{"data":[{"id":"pi_1"}]}"#);
        assert!(
            matches!(&found, Lookup::Found { provider_id: Some(id), status: 200, .. } if id == "pi_1"),
            "{found:?}"
        );
        assert!(matches!(
            read_answer(&search(), 200, br#"{"object":"search_result","data":[]}"#),
            Lookup::NotFound { status: 200, .. }
        ));
        assert!(matches!(
            read_answer(
                &search(),
                404,
                br#"{"error":{"message":"Unrecognized request URL"}}"#
            ),
            Lookup::Unknown { .. }
        ));
        assert!(matches!(
            read_answer(&search(), 200, b"<html>"),
            Lookup::Unknown { .. }
        ));
        assert!(matches!(
            read_answer(&search(), 500, b""),
            Lookup::Unknown { .. }
        ));
    }

    #[test]
    fn the_default_reads_2xx_as_found_and_404_as_not_found() {
        let plain = StatusCheck::default();
        assert!(matches!(
            read_answer(&plain, 200, b"ok"),
            Lookup::Found {
                provider_id: None,
                ..
            }
        ));
        assert!(matches!(
            read_answer(&plain, 404, b""),
            Lookup::NotFound { status: 404, .. }
        ));
        assert!(matches!(
            read_answer(&plain, 401, b""),
            Lookup::Unknown { .. }
        ));
        let numeric_id = StatusCheck {
            id_pointer: "/id".into(),
            ..Default::default()
        };
        assert!(matches!(
            read_answer(&numeric_id, 200, br#"{"id":42}"#),
            Lookup::Found { provider_id: Some(id), .. } if id == "42"
        ));
    }
}
