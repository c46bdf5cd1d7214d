//! Effects: the external call a claim stands for ([`http::HttpEffect`],
//! `smtp::SmtpEffect` with the `smtp` Cargo feature), and the pure classification of what the provider answered.

pub mod by_value;
pub mod http;
mod http_answer;
pub mod http_status;
pub mod http_template;
pub mod settings;
#[cfg(feature = "smtp")]
pub mod smtp;
pub mod sql;

use crate::domain::claim::Claim;
use async_trait::async_trait;
use std::time::Duration;

/// Longest provider answer kept on a claim.
pub const MAX_RESPONSE_BYTES: usize = 4096;

/// Longest provider answer read: a call's or a lookup's answer is read whole up to this, to
/// be read by value and for the provider's id, and only then cut to [`MAX_RESPONSE_BYTES`] to
/// be stored. A `2xx` read by its content that is longer is an unknown outcome.
pub const MAX_READ_BYTES: usize = 1024 * 1024;

/// How a [`Outcome::NotApplied`] error starts when the request could not even be built (a
/// claim missing a field its template names): nothing reached the provider, so it says
/// nothing about the provider's health.
pub const NOT_BUILT: &str = "could not build the request";

/// How a [`Outcome::NotApplied`] error starts when a value of the claim would send its call to
/// another path ([`http_template::url_segments::UrlValueError`]): nothing was sent, and as the
/// claim stands nothing ever can be.
pub const NOT_BUILT_URL_VALUE: &str = "could not build the request: URL field";

/// A message as intake received it, before anything is claimed: what an effect's request is
/// made from ([`Effect::check_message`]).
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    /// The idempotency key the claim would carry.
    pub key: &'a str,
    /// The message id.
    pub message_id: &'a str,
    /// The tenant (`""` when none).
    pub tenant: &'a str,
    /// The consumer's name.
    pub consumer: &'a str,
    /// The payload, verbatim.
    pub payload: &'a [u8],
    /// The content type.
    pub content_type: &'a str,
}

/// Why an effect cannot take a message ([`Effect::check_message`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// The payload cannot be used (a sentence; HTTP `422`).
    #[error("{0}")]
    Payload(String),
    /// A value would send the call to another path of the provider's API (HTTP `400`).
    #[error(transparent)]
    UrlValue(#[from] http_template::url_segments::UrlValueError),
}

/// The statuses that prove nothing was applied unless `effect.not_applied_status` says
/// otherwise, for a provider that honours idempotency keys (`on_unknown = "redrive"`).
pub const NOT_APPLIED_WITH_KEYS: [u16; 4] = [408, 425, 429, 503];

/// The same for a provider that may ignore keys (`on_unknown = "reconcile"` or `"park"`):
/// a `503` from a proxy or load balancer can follow an upstream that received the request, so
/// it is an unknown outcome there (the status endpoint decides; nothing is sent twice).
pub const NOT_APPLIED_WITHOUT_KEYS: [u16; 3] = [408, 425, 429];

/// The not-applied statuses that also prove the provider never received the call, unless
/// `effect.non_receipt_status` says otherwise: a `429` is the provider refusing the call before
/// it looks at it. A `503`, `408` or `425` may come from a proxy or load balancer after the
/// provider applied the call, so it only says "retry later with the same key".
pub const NON_RECEIPT_STATUS: [u16; 1] = [429];

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
    /// An answer that asks to retry later with the same key (`408`, `425`, `429`, `503`,
    /// connection refused): nothing is applied twice by doing so. Whether the answer also
    /// proves the provider never received the call is [`Effect::proves_non_receipt`].
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

/// Classifies an HTTP status with the default not-applied statuses of a provider that
/// honours keys ([`NOT_APPLIED_WITH_KEYS`]). Pure; the table in `docs/decisions.md` mirrors it.
pub fn classify_status(status: u16) -> StatusClass {
    classify_status_with(status, &NOT_APPLIED_WITH_KEYS)
}

/// Classifies an HTTP status, `not_applied` being the statuses that prove nothing was applied
/// (`effect.not_applied_status`). `2xx` is applied and `409` in progress whatever the list; a
/// status taken out of the list is unknown (`408`, `425`, `429` and `5xx`) or, for other
/// `4xx`, a rejection.
pub fn classify_status_with(status: u16, not_applied: &[u16]) -> StatusClass {
    match status {
        200..=299 => StatusClass::Applied,
        409 => StatusClass::InProgress,
        s if not_applied.contains(&s) => StatusClass::NotApplied,
        408 | 425 | 429 => StatusClass::Unknown,
        400..=499 => StatusClass::Rejected,
        _ => StatusClass::Unknown,
    }
}

/// The longest wait a `Retry-After` can ask for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// Reads `Retry-After` in either form RFC 9110 allows: seconds (`120`) or an HTTP-date
/// (`Wed, 21 Oct 2015 07:28:00 GMT`, measured against `now`); capped at
/// [`MAX_RETRY_AFTER`]. A date in the past is zero; anything unreadable is absent.
pub fn parse_retry_after_at(
    value: Option<&str>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    let value = value?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    }
    let when = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = (when.with_timezone(&chrono::Utc) - now)
        .to_std()
        .unwrap_or(Duration::ZERO);
    Some(wait.min(MAX_RETRY_AFTER))
}

/// [`parse_retry_after_at`] against this machine's clock (the provider's date is its own
/// clock's; a wait, not a lease, so the worker's clock is good enough).
pub fn parse_retry_after(value: Option<&str>) -> Option<Duration> {
    parse_retry_after_at(value, chrono::Utc::now())
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

    /// Whether an [`Outcome::NotApplied`] with `status` (`None`: no answer, the request never
    /// left or was refused before it was processed) proves the provider never received the
    /// call. Only such proof lets a claim end `failed` "never sent" (safe to submit again under
    /// a new key); an answer that only says "retry later" does not. Default: every
    /// not-applied outcome proves it.
    fn proves_non_receipt(&self, status: Option<i32>) -> bool {
        let _ = status;
        true
    }

    /// `[effect.outcome]`, when the effect's answers are read by value ([`by_value`]).
    fn outcomes(&self) -> Option<&crate::provider::effect::settings::ValueOutcomes> {
        None
    }

    /// Where the effect's object is in a "found" status answer (`effect.status.found_pointer`;
    /// empty: the whole answer), for reading it by value.
    fn lookup_object(&self) -> &str {
        ""
    }

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

    /// The write this effect makes in the transaction that settles its claim, when it is a
    /// database effect (`kind = "sql"`, `WorkerBuilder::database_effect`): the claimer then
    /// runs it there instead of calling [`Effect::perform`]. Default: none.
    fn database(&self) -> Option<&dyn crate::store::db_effect::DatabaseEffect> {
        None
    }

    /// Checks a whole message before anything is claimed: its payload
    /// ([`Effect::validate`], the default) and, for an effect whose request carries the
    /// message's ids or fields in a URL, the values it would put there. Nothing is committed
    /// when it fails.
    fn check_message(&self, message: &Incoming<'_>) -> Result<(), Unusable> {
        self.validate(message.payload, message.content_type)
            .map_err(Unusable::Payload)
    }

    /// The path segments of this effect's URLs that a message's values fill, as the registry
    /// of enqueued messages holds them (`claimd_consumers.url_segments`, a JSON array) so
    /// that a producer's transaction refuses the values [`Effect::check_message`] refuses
    /// there. Default: none.
    fn url_segments(&self) -> serde_json::Value {
        serde_json::Value::Array(Vec::new())
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
    fn retry_after_in_seconds_and_as_a_date_is_honoured_and_capped() {
        assert_eq!(parse_retry_after(Some("3")), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(Some("100000")), Some(MAX_RETRY_AFTER));
        let now = chrono::DateTime::parse_from_rfc3339("2015-10-21T07:27:30Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(
            parse_retry_after_at(Some("Wed, 21 Oct 2015 07:28:00 GMT"), now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after_at(Some("Wed, 21 Oct 2015 07:00:00 GMT"), now),
            Some(Duration::ZERO),
            "a date in the past"
        );
        assert_eq!(parse_retry_after(Some("soon")), None);
        assert_eq!(parse_retry_after(None), None);
    }

    #[test]
    fn a_provider_that_may_ignore_keys_treats_503_as_unknown() {
        assert_eq!(
            classify_status_with(503, &NOT_APPLIED_WITHOUT_KEYS),
            StatusClass::Unknown
        );
        assert_eq!(
            classify_status_with(503, &NOT_APPLIED_WITH_KEYS),
            StatusClass::NotApplied
        );
        assert_eq!(
            classify_status_with(429, &NOT_APPLIED_WITHOUT_KEYS),
            StatusClass::NotApplied
        );
        // Taken out of the list: unknown, never a rejection.
        assert_eq!(classify_status_with(429, &[]), StatusClass::Unknown);
        assert_eq!(classify_status_with(400, &[400]), StatusClass::NotApplied);
    }
}
