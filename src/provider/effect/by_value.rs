//! Reading an outcome by value ([`ValueOutcomes`]): the value at a JSON pointer in the
//! provider's object decides completed, pending, needs attention or failed; a value no list
//! names is unknown. Pure, so every shape is tested here. The same reading serves the call's
//! own answer, a status lookup's "found" answer and a provider event's object.

use crate::provider::effect::settings::ValueOutcomes;
use crate::store::truncate;
use serde_json::Value;

/// What a mapped value says of the effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Done.
    Completed,
    /// Accepted by the provider, not final: never sent again, asked again later.
    Pending,
    /// A person or the customer must act.
    NeedsAttention,
    /// It will not happen.
    Failed,
}

impl Verdict {
    /// The name in history lines and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Completed => "completed",
            Verdict::Pending => "pending",
            Verdict::NeedsAttention => "needs_attention",
            Verdict::Failed => "failed",
        }
    }
}

/// What one object says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The verdict, or `None` when the value is missing or no list names it (unknown).
    pub verdict: Option<Verdict>,
    /// The value as written (strings without quotes), when there is one.
    pub value: Option<String>,
    /// The provider's id of the object, when `id_pointer` finds one.
    pub provider_id: Option<String>,
    /// The provider's reason, when `reason_pointer` finds one (at most 500 bytes).
    pub reason: Option<String>,
}

impl Reading {
    /// One sentence for a person: what the provider said and what claimd made of it.
    pub fn describe(&self, map: &ValueOutcomes) -> String {
        let value = self.value.as_deref().unwrap_or("nothing");
        let mut text = match self.verdict {
            Some(_) => format!("provider says {} = {value}", map.pointer),
            None if self.value.is_none() => format!(
                "provider's answer has no {}: the outcome is unknown",
                map.pointer
            ),
            None => format!(
                "provider says {} = {value}, which [effect.outcome] does not map: the outcome is unknown",
                map.pointer
            ),
        };
        if let Some(reason) = &self.reason {
            text.push_str(": ");
            text.push_str(reason);
        }
        text
    }
}

/// Reads one object (already located in its answer or event).
pub fn read(map: &ValueOutcomes, object: &Value) -> Reading {
    let text = |pointer: &str| -> Option<String> {
        if pointer.is_empty() {
            return None;
        }
        match object.pointer(pointer)? {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        }
    };
    let value = text(&map.pointer);
    let verdict = value.as_deref().and_then(|v| {
        let has = |list: &[String]| list.iter().any(|x| x == v);
        if has(&map.completed) {
            Some(Verdict::Completed)
        } else if has(&map.pending) {
            Some(Verdict::Pending)
        } else if has(&map.needs_attention) {
            Some(Verdict::NeedsAttention)
        } else if has(&map.failed) {
            Some(Verdict::Failed)
        } else {
            None
        }
    });
    Reading {
        verdict,
        value: value.map(|v| truncate(&v, 200)),
        provider_id: text(&map.id_pointer).map(|v| truncate(&v, 255)),
        reason: text(&map.reason_pointer).map(|v| truncate(&v, 500)),
    }
}

/// Reads an answer's body: the object at `object_pointer` (empty: the whole body). A body that
/// is not JSON, or has no such object, reads as unknown.
pub fn read_body(map: &ValueOutcomes, body: &str, object_pointer: &str) -> Reading {
    let json: Option<Value> = serde_json::from_str(body).ok();
    let object = json.as_ref().and_then(|j| {
        if object_pointer.is_empty() {
            Some(j)
        } else {
            j.pointer(object_pointer)
        }
    });
    match object {
        Some(o) => read(map, o),
        None => Reading {
            verdict: None,
            value: None,
            provider_id: None,
            reason: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe() -> ValueOutcomes {
        ValueOutcomes {
            pointer: "/status".into(),
            completed: vec!["succeeded".into()],
            pending: vec!["processing".into(), "requires_capture".into()],
            needs_attention: vec!["requires_action".into()],
            failed: vec!["requires_payment_method".into(), "canceled".into()],
            id_pointer: "/id".into(),
            reason_pointer: "/last_payment_error/message".into(),
            ..Default::default()
        }
    }

    #[test]
    fn each_listed_value_has_its_verdict_and_an_unlisted_one_is_unknown() {
        let m = stripe();
        for (status, verdict) in [
            ("succeeded", Some(Verdict::Completed)),
            ("processing", Some(Verdict::Pending)),
            ("requires_capture", Some(Verdict::Pending)),
            ("requires_action", Some(Verdict::NeedsAttention)),
            ("requires_payment_method", Some(Verdict::Failed)),
            ("canceled", Some(Verdict::Failed)),
            ("requires_confirmation", None),
        ] {
            let body = format!(r#"{{"id":"pi_1","status":"{status}"}}"#);
            let r = read_body(&m, &body, "");
            assert_eq!(r.verdict, verdict, "{status}");
            assert_eq!(r.provider_id.as_deref(), Some("pi_1"));
            assert_eq!(r.value.as_deref(), Some(status));
        }
    }

    #[test]
    fn a_missing_value_or_a_body_that_is_not_json_is_unknown_never_completed() {
        let m = stripe();
        for body in ["", "<html>", "{}", r#"{"status":null}"#, "[1,2]"] {
            assert_eq!(read_body(&m, body, "").verdict, None, "{body}");
        }
        let r = read_body(&m, r#"{"data":[]}"#, "/data/0");
        assert_eq!(r.verdict, None);
        assert!(r.describe(&m).contains("unknown"));
    }

    #[test]
    fn the_object_is_found_in_a_search_answer_and_the_reason_is_kept() {
        let m = stripe();
        let body = r#"{"data":[{"id":"pi_9","status":"requires_payment_method",
            "last_payment_error":{"message":"Your card was declined."}}]}"#;
        let r = read_body(&m, body, "/data/0");
        assert_eq!(r.verdict, Some(Verdict::Failed));
        assert_eq!(r.provider_id.as_deref(), Some("pi_9"));
        assert_eq!(
            r.describe(&m),
            "provider says /status = requires_payment_method: Your card was declined."
        );
    }

    #[test]
    fn numbers_and_booleans_compare_as_written() {
        let m = ValueOutcomes {
            pointer: "/paid".into(),
            completed: vec!["true".into()],
            failed: vec!["false".into()],
            ..Default::default()
        };
        assert_eq!(
            read_body(&m, r#"{"paid":true}"#, "").verdict,
            Some(Verdict::Completed)
        );
        assert_eq!(
            read_body(&m, r#"{"paid":false}"#, "").verdict,
            Some(Verdict::Failed)
        );
    }

    #[test]
    fn a_table_is_checked_before_it_is_used() {
        assert!(stripe().check().is_ok());
        let mut twice = stripe();
        twice.failed.push("processing".into());
        assert_eq!(twice.check().unwrap_err().0, "failed");
        let mut no_pointer = stripe();
        no_pointer.pointer = String::new();
        assert_eq!(no_pointer.check().unwrap_err().0, "pointer");
        let mut bad = stripe();
        bad.id_pointer = "id".into();
        assert_eq!(bad.check().unwrap_err().0, "id_pointer");
        let mut none_completes = stripe();
        none_completes.completed.clear();
        assert_eq!(none_completes.check().unwrap_err().0, "completed");
    }
}
