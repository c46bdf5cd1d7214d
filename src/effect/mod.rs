//! Effects: the external call a claim stands for ([`http::HttpEffect`],
//! [`smtp::SmtpEffect`]), and the pure classification of what the provider answered.

pub mod http;
pub mod http_status;
pub mod http_template;
pub mod smtp;

use crate::claim::Claim;
use async_trait::async_trait;
use std::time::Duration;

/// Longest provider answer kept on a claim.
pub const MAX_RESPONSE_BYTES: usize = 4096;

/// What one call to the provider came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// `2xx`: the effect happened.
    Applied {
        /// Provider status.
        status: i32,
        /// Up to 4 KiB of the answer.
        response: String,
    },
    /// A permanent rejection (`4xx` other than 408/409/425/429): do not retry.
    Rejected {
        /// Provider status.
        status: i32,
        /// Up to 4 KiB of the answer.
        response: String,
    },
    /// `409`: the provider is still working on this key; ask again later.
    InProgress {
        /// Provider status.
        status: i32,
    },
    /// An answer that shows nothing was applied (`408`, `425`, `429`, `503`, connection
    /// refused): retry with the same key.
    NotApplied {
        /// Provider status, if it answered.
        status: Option<i32>,
        /// The provider's `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// What happened, without secrets.
        error: String,
    },
    /// The request may have taken effect (timeout after sending, dropped connection, `500`,
    /// `502`, `504`): never guessed (I6).
    Unknown {
        /// Provider status, if it answered.
        status: Option<i32>,
        /// What happened, without secrets.
        error: String,
    },
}

impl Outcome {
    /// Short name for history and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Applied { .. } => "applied",
            Outcome::Rejected { .. } => "rejected",
            Outcome::InProgress { .. } => "in_progress",
            Outcome::NotApplied { .. } => "not_applied",
            Outcome::Unknown { .. } => "unknown",
        }
    }

    /// The provider's status, when there was one.
    pub fn status(&self) -> Option<i32> {
        match self {
            Outcome::Applied { status, .. }
            | Outcome::Rejected { status, .. }
            | Outcome::InProgress { status } => Some(*status),
            Outcome::NotApplied { status, .. } | Outcome::Unknown { status, .. } => *status,
        }
    }
}

/// What the provider's status endpoint said about a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// The answer shows the effect exists (its status and, when configured, a body condition).
    Found {
        /// Provider status.
        status: i32,
        /// Up to 4 KiB of the answer.
        response: String,
        /// The provider's own id for the effect, when the effect says where it is in the answer.
        provider_id: Option<String>,
    },
    /// The answer has the configured "no record" shape: it never happened (as far as the
    /// provider knows now; see [`Effect::not_found_after`]).
    NotFound {
        /// Provider status.
        status: i32,
        /// What showed it (for the history).
        detail: String,
    },
    /// Anything else: no decision.
    Unknown {
        /// What happened.
        error: String,
    },
}

/// The class of a provider status code (docs/design.md and docs/decisions.md, "Status classification").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// `2xx`.
    Applied,
    /// `409`.
    InProgress,
    /// `408`, `425`, `429`, `503`: transient and provably not applied.
    NotApplied,
    /// Other `5xx` (and `1xx`/`3xx`, which a provider should never send): transient, maybe applied.
    Unknown,
    /// Any other `4xx`: permanent.
    Rejected,
}

/// Classifies an HTTP status. Pure; the table in `docs/decisions.md` mirrors it.
pub fn classify_status(status: u16) -> StatusClass {
    match status {
        200..=299 => StatusClass::Applied,
        409 => StatusClass::InProgress,
        408 | 425 | 429 | 503 => StatusClass::NotApplied,
        400..=499 => StatusClass::Rejected,
        _ => StatusClass::Unknown,
    }
}

/// Reads `Retry-After` given in seconds (the HTTP-date form is treated as absent), capped.
pub fn parse_retry_after(value: Option<&str>) -> Option<Duration> {
    let secs: u64 = value?.trim().parse().ok()?;
    Some(Duration::from_secs(secs.min(300)))
}

/// A side effect claimd performs for a claim.
#[async_trait]
pub trait Effect: Send + Sync + 'static {
    /// Performs the effect once, carrying `claim.idem_key`. Never panics on provider errors.
    async fn perform(&self, claim: &Claim) -> Outcome;

    /// Asks the provider whether the effect for this claim exists. `None` when the effect has
    /// no status endpoint.
    async fn lookup(&self, claim: &Claim) -> Option<Lookup>;

    /// Whether [`Effect::lookup`] can answer.
    fn can_reconcile(&self) -> bool;

    /// How long after the last call a "not found" may be trusted (a provider whose status
    /// search lags its writes answers "not found" for an effect it has just applied).
    fn not_found_after(&self) -> Duration {
        Duration::ZERO
    }

    /// Checks at start that the status endpoint answers "not found" for a key that cannot
    /// exist (a `404` from an endpoint that does not exist must not pass for "not applied").
    /// `Ok(Some(warning))` when it could not tell or is configured to only warn; `Err(why)`
    /// when the start must stop. Default: nothing to check.
    async fn probe_status(&self) -> Result<Option<String>, String> {
        Ok(None)
    }

    /// Checks, before anything is claimed, that this effect can use the payload (an email
    /// needs a recipient, say). `Err` carries a readable sentence; intake refuses the message
    /// with it (HTTP `422`, broker dead-letter) and nothing is committed. Default: any payload.
    fn validate(&self, payload: &[u8], content_type: &str) -> Result<(), String> {
        let _ = (payload, content_type);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_the_class_the_contract_gives() {
        for s in 100..=599u16 {
            let want = match s {
                200..=299 => StatusClass::Applied,
                409 => StatusClass::InProgress,
                408 | 425 | 429 | 503 => StatusClass::NotApplied,
                400..=499 => StatusClass::Rejected,
                _ => StatusClass::Unknown,
            };
            assert_eq!(classify_status(s), want, "status {s}");
        }
        assert_eq!(classify_status(400), StatusClass::Rejected);
        assert_eq!(classify_status(500), StatusClass::Unknown);
    }

    #[test]
    fn retry_after_in_seconds_is_honoured_and_capped() {
        assert_eq!(parse_retry_after(Some("3")), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_retry_after(Some("100000")),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            parse_retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        assert_eq!(parse_retry_after(None), None);
    }
}
