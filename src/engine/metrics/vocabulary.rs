//! The label values each labelled counter is created with at start ([`super::Metrics::init_consumers`]).
//! Values outside these lists still count; they appear at their first event.

/// The `status_class` label of a provider status: `2xx`, `4xx`, `5xx` or `none` (no answer).
pub fn status_class(status: Option<i32>) -> String {
    match status {
        Some(s) => format!("{}xx", s / 100),
        None => "none".into(),
    }
}

/// `claimd_messages_refused_total{reason}`.
pub const REFUSED: &[&str] = &[
    "bad_id",
    "bad_content_type",
    "bad_payload",
    "busy",
    "key_too_long",
    "unsafe_url_value",
    "store_unavailable",
    "body_budget",
];
/// `claimd_dead_lettered_total{reason}` (the broker intake's dead-letter reasons).
pub const DEAD_LETTERED: &[&str] = &[
    "missing_message_id",
    "invalid_message_id",
    "invalid_tenant",
    "body_too_large",
    "payload_mismatch",
    "unusable_payload",
    "invalid_content_type",
    "key_too_long",
    "headers_too_deep",
    "invalid_not_before",
    "delivery_limit",
    "unreadable_headers",
];
/// `claimd_reconcile_outcomes_total{reason}`.
pub const LOOKUPS: &[&str] = &["found", "not_found", "unknown"];
/// `claimd_claims_settled_total{state}`.
pub const SETTLED: &[&str] = &["completed", "pending", "failed", "needs_attention"];
/// `claimd_effect_attempts_total{outcome,status_class}`: the pairs an alert on the
/// provider's error rate divides by.
pub const ATTEMPTS: &[(&str, &str)] = &[
    ("applied", "2xx"),
    ("rejected", "4xx"),
    ("not_applied", "5xx"),
    ("unknown", "5xx"),
    ("unknown", "none"),
];
/// `claimd_sweeper_claims_total{action}`.
pub const SWEEP_ACTIONS: &[&str] = &["redrive", "resend", "reconcile", "park", "fail"];
/// `claimd_destination_state{state}`.
pub const BREAKER_STATES: &[&str] = &["closed", "open", "probing"];
/// `claimd_destination_held_total{reason}`.
pub const HELD: &[&str] = &["open", "probing", "pace"];
