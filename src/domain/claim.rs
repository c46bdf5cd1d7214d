//! The claim model: states, idempotency keys and payload fingerprints.
//!
//! Everything here is pure: no I/O, no clock. The store persists these values; the claimer,
//! sweeper and operator commands decide with them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// Longest message id (and rendered idempotency key) claimd accepts.
pub const MAX_MESSAGE_ID_LEN: usize = 255;

/// The life-cycle state of a claim (see `docs/design.md`, "States").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimState {
    /// Claimed; the effect may or may not have happened yet.
    Started,
    /// The provider accepted the effect and has not finished it (a payment at the bank): not
    /// stuck, not a person's work, never sent again. Its provider's event or the next poll of
    /// its status settles it.
    Pending,
    /// The provider accepted the effect (`processed_utc` is set).
    Completed,
    /// The provider rejected the effect permanently, or an operator said so.
    Failed,
    /// The outcome could not be decided automatically; a person must look.
    NeedsAttention,
}

impl ClaimState {
    /// Every state, in the order reports list them.
    pub const ALL: [ClaimState; 5] = [
        ClaimState::Started,
        ClaimState::Pending,
        ClaimState::Completed,
        ClaimState::Failed,
        ClaimState::NeedsAttention,
    ];

    /// The name stored in the database and shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimState::Started => "started",
            ClaimState::Pending => "pending",
            ClaimState::Completed => "completed",
            ClaimState::Failed => "failed",
            ClaimState::NeedsAttention => "needs_attention",
        }
    }

    /// Terminal states are the only ones retention may delete.
    pub fn is_terminal(self) -> bool {
        matches!(self, ClaimState::Completed | ClaimState::Failed)
    }

    /// Whether the state machine allows `self -> to`.
    ///
    /// `started` moves to any other state (settle, park) and to itself (a sweeper takeover);
    /// `pending` moves to itself (a poll) and to any decided state, never back to `started`
    /// (the effect exists at the provider: it is never sent again); `needs_attention` moves
    /// back to `started` (operator redrive), to `pending` (the provider says it is under
    /// way) or to a terminal state (operator resolve, the provider's final word); `failed`
    /// moves back to `started` (redrive), to `completed` (resolve) or to `needs_attention`
    /// (the provider says it succeeded after all: a person checks, nothing flips silently);
    /// `completed` is final but for one move: to `needs_attention`, when the provider reports
    /// the claim's own object failed after it completed (a person checks; it never becomes
    /// `failed` or `started` by itself, and is never sent again).
    pub fn can_move_to(self, to: ClaimState) -> bool {
        use ClaimState::*;
        matches!(
            (self, to),
            (Started, _)
                | (Pending, Pending | Completed | Failed | NeedsAttention)
                | (NeedsAttention, Started | Pending | Completed | Failed)
                | (Failed, Started | Completed | NeedsAttention)
                | (Completed, NeedsAttention)
        )
    }
}

impl fmt::Display for ClaimState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state name that is not one of claimd's five.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "unknown claim state {0:?} (expected started, pending, completed, failed or needs_attention)"
)]
pub struct UnknownState(pub String);

impl FromStr for ClaimState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "started" => Ok(ClaimState::Started),
            "pending" => Ok(ClaimState::Pending),
            "completed" => Ok(ClaimState::Completed),
            "failed" => Ok(ClaimState::Failed),
            "needs_attention" => Ok(ClaimState::NeedsAttention),
            other => Err(UnknownState(other.to_string())),
        }
    }
}

/// Why a message id (or tenant) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// No id at all.
    #[error("missing {0}")]
    Missing(&'static str),
    /// Longer than [`MAX_MESSAGE_ID_LEN`].
    #[error("{what} is {len} characters long; the limit is {max}", max = MAX_MESSAGE_ID_LEN)]
    TooLong {
        /// Which field.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// Contains a byte outside visible ASCII (0x21..=0x7E).
    #[error("{what} contains a character that is not visible ASCII at position {position}")]
    NotVisibleAscii {
        /// Which field.
        what: &'static str,
        /// Zero-based byte position of the first offending byte.
        position: usize,
    },
}

/// Checks a message id: 1–255 visible ASCII characters (HTTP intake, `docs/operations.md`).
pub fn validate_message_id(id: &[u8]) -> Result<&str, IdError> {
    validate_token("Idempotency-Key", id, false)
}

/// Checks a tenant: empty (no tenant) or up to 255 visible ASCII characters.
pub fn validate_tenant(tenant: &[u8]) -> Result<&str, IdError> {
    validate_token("Tenant-Id", tenant, true)
}

fn validate_token<'a>(
    what: &'static str,
    value: &'a [u8],
    empty_ok: bool,
) -> Result<&'a str, IdError> {
    if value.is_empty() && !empty_ok {
        return Err(IdError::Missing(what));
    }
    if value.len() > MAX_MESSAGE_ID_LEN {
        return Err(IdError::TooLong {
            what,
            len: value.len(),
        });
    }
    if let Some(position) = value.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        return Err(IdError::NotVisibleAscii { what, position });
    }
    // All bytes are ASCII, so this cannot fail.
    Ok(std::str::from_utf8(value).unwrap_or_default())
}

/// Longest content type claimd stores.
pub const MAX_CONTENT_TYPE_LEN: usize = 255;

/// Checks a payload's content type before it is claimed: empty (none), or up to
/// [`MAX_CONTENT_TYPE_LEN`] printable ASCII characters (spaces and tabs allowed, as HTTP
/// allows them in a field value: `text/plain; charset=utf-8`). The stored value is sent to the provider as a header on every
/// attempt, so one that no HTTP client can send (a NUL, a control character, non-ASCII) must
/// be refused now rather than acknowledged and then never performed.
pub fn validate_content_type(value: &[u8]) -> Result<&str, String> {
    if value.len() > MAX_CONTENT_TYPE_LEN {
        return Err(format!(
            "Content-Type is {} bytes long; the limit is {MAX_CONTENT_TYPE_LEN}",
            value.len()
        ));
    }
    if let Some(position) = value
        .iter()
        .position(|&b| !(b == b'\t' || (0x20..=0x7e).contains(&b)))
    {
        return Err(format!(
            "Content-Type contains a byte that is not printable ASCII (0x{:02X}) at position {position}",
            value[position]
        ));
    }
    // All bytes are ASCII, so this cannot fail.
    Ok(std::str::from_utf8(value).unwrap_or_default())
}

/// SHA-256 of the payload, lower-case hex: two deliveries are "the same message" only when
/// their fingerprints match (invariant I5).
pub fn fingerprint(payload: &[u8]) -> String {
    hex::encode(Sha256::digest(payload))
}

/// An idempotency-key template such as `{consumer}:{tenant}:{message_id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    parts: Vec<KeyPart>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyPart {
    Literal(String),
    MessageId,
    Consumer,
    Tenant,
}

/// A key template that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyTemplateError {
    /// `{something}` that is not one of the three placeholders.
    #[error("unknown placeholder {{{0}}} (use {{message_id}}, {{consumer}} or {{tenant}})")]
    UnknownPlaceholder(String),
    /// A `{` without its `}`.
    #[error("unclosed '{{' in key template")]
    Unclosed,
    /// The template never mentions `{message_id}`, so every message would share one key.
    #[error("key template must contain {{message_id}}")]
    NoMessageId,
    /// Two placeholders touch (`{tenant}{message_id}`): tenant `a` + id `bc` and tenant `ab` +
    /// id `c` would give one key.
    #[error(
        "placeholders must be separated by a character such as ':' (one outside letters, digits, '.', '_', '-', '%')"
    )]
    AdjacentPlaceholders,
}

/// Characters a tenant or consumer keeps in a rendered key; others are percent-encoded, so a
/// separator like `:` can never come from a tenant and two tenants never share a key.
fn is_key_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

fn push_encoded(key: &mut String, value: &str) {
    for c in value.chars() {
        if is_key_safe(c) {
            key.push(c);
        } else {
            for b in c.to_string().bytes() {
                key.push_str(&format!("%{b:02X}"));
            }
        }
    }
}

impl FromStr for KeyTemplate {
    type Err = KeyTemplateError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(KeyPart::Literal(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or(KeyTemplateError::Unclosed)?;
            parts.push(match &after[..close] {
                "message_id" => KeyPart::MessageId,
                "consumer" => KeyPart::Consumer,
                "tenant" => KeyPart::Tenant,
                other => return Err(KeyTemplateError::UnknownPlaceholder(other.to_string())),
            });
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(KeyPart::Literal(rest.to_string()));
        }
        if !parts.contains(&KeyPart::MessageId) {
            return Err(KeyTemplateError::NoMessageId);
        }
        // Between two placeholders there must be a separator no encoded value can contain, so
        // every key splits back into its parts one way only.
        for pair in parts.windows(2) {
            if !matches!(pair[0], KeyPart::Literal(_)) && !matches!(pair[1], KeyPart::Literal(_)) {
                return Err(KeyTemplateError::AdjacentPlaceholders);
            }
        }
        for triple in parts.windows(3) {
            if let [a, KeyPart::Literal(sep), b] = triple
                && !matches!(a, KeyPart::Literal(_))
                && !matches!(b, KeyPart::Literal(_))
                && sep.chars().all(|c| is_key_safe(c) || c == '%')
            {
                return Err(KeyTemplateError::AdjacentPlaceholders);
            }
        }
        Ok(KeyTemplate { parts })
    }
}

impl KeyTemplate {
    /// Renders the key from the claim's stored identity (invariant I3: nothing else goes in).
    /// Tenant and consumer are percent-encoded outside letters, digits, `.`, `_` and `-`, so
    /// distinct identities never render to one key.
    pub fn render(&self, consumer: &str, tenant: &str, message_id: &str) -> String {
        let mut key = String::with_capacity(message_id.len() + 16);
        for part in &self.parts {
            match part {
                KeyPart::Literal(s) => key.push_str(s),
                KeyPart::MessageId => key.push_str(message_id),
                KeyPart::Consumer => push_encoded(&mut key, consumer),
                KeyPart::Tenant => push_encoded(&mut key, tenant),
            }
        }
        key
    }

    /// Whether the key includes the consumer name.
    pub fn mentions_consumer(&self) -> bool {
        self.parts.contains(&KeyPart::Consumer)
    }

    /// Whether the key includes the tenant.
    pub fn mentions_tenant(&self) -> bool {
        self.parts.contains(&KeyPart::Tenant)
    }
}

/// A tenant was given to a consumer whose key template does not contain `{tenant}`: two
/// tenants' messages with one id would be sent under one provider key, and one of them would
/// never happen. Refused by every way in (HTTP and AMQP intake, `submit`, `enqueue`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "consumer {consumer:?} does not key on tenants (key template {template:?} lacks {{tenant}}): send no tenant, or add {{tenant}} to its key"
)]
pub struct TenantNotKeyed {
    /// The consumer.
    pub consumer: String,
    /// Its key template.
    pub template: String,
}

/// The rendered idempotency key is longer than the provider accepts (`max_key_length`):
/// acknowledged, the message could never be performed. Refused by every way in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the idempotency key for this message would be {len} characters (key template {template:?}); the provider's limit is {max} (effect.max_key_length): use a shorter message id or tenant"
)]
pub struct KeyTooLong {
    /// Length of the rendered key.
    pub len: usize,
    /// The effect's limit.
    pub max: usize,
    /// The consumer's key template.
    pub template: String,
}

/// How the previous holder of a claim let go of it, when it did so on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// The provider's answer proved nothing was applied (503, 429, connection refused).
    NotApplied,
    /// The attempt never called the provider: the claim still carries the marker it was
    /// committed with, which the worker clears just before its first call.
    NotCalled,
    /// An operator asked for the claim to be performed again.
    OperatorRedrive,
    /// An outcome is still unknown and nothing could decide it yet (the status endpoint gave
    /// no answer, a "not found" came too soon after the last call to trust, or the destination
    /// held the call or lookup back): the sweeper asks again, and the wait is not an attempt.
    Undecided,
}

impl Handoff {
    /// Reads the stored name; unknown names count as no hand-off (the safe reading).
    pub fn parse(s: &str) -> Option<Handoff> {
        match s {
            "not_applied" => Some(Handoff::NotApplied),
            "not_called" => Some(Handoff::NotCalled),
            "operator_redrive" => Some(Handoff::OperatorRedrive),
            "undecided" => Some(Handoff::Undecided),
            _ => None,
        }
    }

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Handoff::NotApplied => "not_applied",
            Handoff::NotCalled => "not_called",
            Handoff::OperatorRedrive => "operator_redrive",
            Handoff::Undecided => "undecided",
        }
    }
}

/// What intake hands the store to claim.
#[derive(Debug, Clone)]
pub struct NewClaim {
    /// Consumer name from the configuration.
    pub consumer: String,
    /// Tenant, `""` when none (never NULL: see `docs/design.md`).
    pub tenant: String,
    /// The message id from the client or broker.
    pub message_id: String,
    /// The idempotency key sent to the provider, rendered once at claim time.
    pub idem_key: String,
    /// SHA-256 of the payload.
    pub fingerprint: String,
    /// The payload, verbatim.
    pub payload: bytes::Bytes,
    /// The payload's content type, verbatim.
    pub content_type: String,
    /// Who claims it (written as lease owner).
    pub worker: String,
    /// How long the claimer may work before the sweeper may take over.
    pub lease: std::time::Duration,
    /// A random value written with the row ([`new_claim_token`]), so the intake call that
    /// inserted it can recognise its own row when the commit's reply was lost (a connection
    /// cut after the commit): its retry finds the row and knows it is not a duplicate.
    /// Empty: none (the row is then never recognised as its caller's own).
    pub claim_token: String,
    /// Commit the claim with a "not called yet" marker that the worker clears just before its
    /// first call, so a crash or a lost commit reply before that call leaves a claim the sweeper
    /// knows was never sent. Set for consumers whose orphans would otherwise wait for a person
    /// (`on_unknown = "park"`); it costs them one more write per message.
    pub mark_not_called: bool,
    /// The claim's order key (`order_key` rendered from the payload): claims of one consumer,
    /// tenant and order key run one at a time. A claim with one is committed waiting (no lease
    /// owner) and started by the pickup when its line lets it.
    pub order_key: Option<String>,
    /// A scheduled send: the claim is committed held by [`SCHEDULE_OWNER`] at attempt 0 with
    /// its lease ending at this time, and the sweeper's takeover sends it as attempt 1.
    pub not_before: Option<DateTime<Utc>>,
    /// The W3C `traceparent` of the claim's intake span, when traces are on (`[traces]`): the
    /// claim's later steps, in any instance, join that trace.
    pub trace_parent: Option<String>,
    /// Its priority, -100 to 100 ([`crate::domain::priority`]): among claims that wait in the
    /// database (in a line, enqueued), higher ones are taken first.
    pub priority: i16,
}

/// The lease owner of a scheduled claim until its time ([`NewClaim::not_before`]); no instance
/// may be named so (`[run] instance`).
pub const SCHEDULE_OWNER: &str = "schedule";

/// A fresh [`NewClaim::claim_token`]: 128 random bits, hex.
pub fn new_claim_token() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// A claim as stored.
#[derive(Debug, Clone, Serialize)]
pub struct Claim {
    /// Row id.
    pub id: i64,
    /// Consumer name.
    pub consumer: String,
    /// Tenant (`""` when none).
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// The idempotency key sent to the provider on every attempt.
    pub idem_key: String,
    /// SHA-256 of the payload.
    pub fingerprint: String,
    /// The payload.
    #[serde(skip)]
    pub payload: bytes::Bytes,
    /// The payload's content type.
    pub content_type: String,
    /// Current state.
    pub state: ClaimState,
    /// Fencing token: bumped by every takeover.
    pub attempt: i32,
    /// Who holds the lease.
    pub lease_owner: Option<String>,
    /// When the lease ends (database clock).
    pub lease_until: Option<DateTime<Utc>>,
    /// When the claim was first committed.
    pub received_utc: DateTime<Utc>,
    /// When the current attempt started.
    pub started_utc: DateTime<Utc>,
    /// When the effect was confirmed.
    pub processed_utc: Option<DateTime<Utc>>,
    /// Last error, or the reason the claim needs attention.
    pub last_error: Option<String>,
    /// Provider's HTTP status (or SMTP reply code) of the deciding answer.
    pub provider_status: Option<i32>,
    /// Up to 4 KiB of the provider's answer.
    pub provider_response: Option<String>,
    /// How many duplicate deliveries (same fingerprint) were recognised.
    pub duplicate_count: i64,
    /// How many deliveries reused the key with another payload.
    pub mismatch_count: i64,
    /// Whether the outcome was learnt from the provider's status endpoint.
    pub reconciled: bool,
    /// How many times the effect was sent again after an unknown outcome.
    pub resent_count: i32,
    /// How many attempts ended waiting rather than deciding (provably not applied, held back
    /// by the destination, a lookup without an answer): `max_attempts` counts
    /// `attempt - waits`.
    pub waits: i32,
    /// The token of the intake call that inserted the row ([`NewClaim::claim_token`]).
    #[serde(skip)]
    pub claim_token: Option<String>,
    /// The provider's own id of the effect (a PaymentIntent's `pi_...`), when its answer
    /// carried one (`[effect.outcome] id_pointer`): how the provider's events find the claim.
    pub provider_id: Option<String>,
    /// When the claim became `pending` (the provider accepted it without finishing).
    pub pending_utc: Option<DateTime<Utc>>,
    /// Bumped by every change of the claim's state, attempt, lease hand-off or provider id:
    /// a write decided on what a reader saw (a provider event, a poll, an operator's form)
    /// is fenced on it, so a claim that left a state and came back to it at the same attempt
    /// is not mistaken for the one that was read.
    pub version: i64,
    /// The claim's order key, when its consumer orders claims ([`NewClaim::order_key`]).
    pub order_key: Option<String>,
    /// When a scheduled claim may be sent ([`NewClaim::not_before`]).
    pub not_before: Option<DateTime<Utc>>,
    /// The W3C `traceparent` of the claim's intake span ([`NewClaim::trace_parent`]).
    #[serde(skip)]
    pub trace_parent: Option<String>,
    /// When the claim's payload, provider answer and error were erased (payload retention or
    /// an operator's erasure); `None`: not erased. An erased claim keeps its fingerprint (a
    /// redelivery is still a duplicate) and is never sent again.
    pub erased_utc: Option<DateTime<Utc>>,
}

impl NewClaim {
    /// Who holds the claim as it is committed: the scheduler for a scheduled send, nobody for
    /// a claim that waits for its order key's line, else the claiming worker.
    pub fn lease_owner(&self) -> Option<&str> {
        if self.not_before.is_some() {
            Some(SCHEDULE_OWNER)
        } else if self.order_key.is_some() {
            None
        } else {
            Some(&self.worker)
        }
    }

    /// The attempt the claim is committed at: 0 for a scheduled send (its takeover at its
    /// time makes it attempt 1), else 1.
    pub fn first_attempt(&self) -> i32 {
        if self.not_before.is_some() { 0 } else { 1 }
    }

    /// Whether the claim is committed with the "not called yet" marker: asked for, or a claim
    /// that waits (for its line or its time) before anything is sent.
    pub fn not_called(&self) -> bool {
        self.mark_not_called || self.order_key.is_some() || self.not_before.is_some()
    }

    /// Whether `claim` is the row this very intake call inserted (its commit's reply may have
    /// been lost), as opposed to a claim another delivery of the same message made.
    pub fn inserted(&self, claim: &Claim) -> bool {
        !self.claim_token.is_empty() && claim.claim_token.as_deref() == Some(&self.claim_token)
    }

    /// Whether `found`, read back after this call's claim statement failed, is the row this
    /// call inserted and still as that statement left it for this worker to perform: `started`
    /// at attempt 1 and held by this worker. A claim committed waiting (for its line or its
    /// time) never is: the pickup or the sweeper takes it, and this worker's own pickup may
    /// already have (the same owner at the same attempt), so performing it here as well would
    /// send it twice, both sends counted as first ones.
    pub fn adoptable(&self, found: &Claim) -> bool {
        self.inserted(found)
            && found.state == ClaimState::Started
            && found.attempt == 1
            && self.lease_owner() == Some(self.worker.as_str())
            && found.lease_owner.as_deref() == Some(self.worker.as_str())
    }
}

impl Claim {
    /// The id of the message's trace (`[traces]`; 32 hex digits), to look it up in the
    /// tracing backend; `None` when it was claimed with traces off.
    pub fn trace_id(&self) -> Option<String> {
        self.trace_parent
            .as_deref()
            .and_then(|t| crate::domain::trace_context::TraceParent::parse(t.as_bytes()))
            .map(|t| t.trace_id_hex())
    }

    /// A `started` claim whose lease has expired at `now` (database time).
    pub fn is_stuck(&self, now: DateTime<Utc>) -> bool {
        self.state == ClaimState::Started
            && !self.waits_in_line()
            && self.lease_until.is_none_or(|until| until < now)
    }

    /// A scheduled send before its time: `started` at attempt 0, held by [`SCHEDULE_OWNER`].
    pub fn is_scheduled(&self) -> bool {
        self.state == ClaimState::Started
            && self.attempt == 0
            && self.lease_owner.as_deref() == Some(SCHEDULE_OWNER)
    }

    /// A claim waiting for its order key's line: `started`, nobody holds it, and the pickup
    /// takes it when no claim ahead of it in its line is unfinished.
    pub fn waits_in_line(&self) -> bool {
        self.state == ClaimState::Started && self.order_key.is_some() && self.lease_owner.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_as_inserted(new: &NewClaim) -> Claim {
        Claim {
            id: 1,
            consumer: new.consumer.clone(),
            tenant: new.tenant.clone(),
            message_id: new.message_id.clone(),
            idem_key: new.idem_key.clone(),
            fingerprint: new.fingerprint.clone(),
            payload: new.payload.clone(),
            content_type: new.content_type.clone(),
            state: ClaimState::Started,
            attempt: new.first_attempt(),
            lease_owner: new.lease_owner().map(str::to_string),
            lease_until: None,
            received_utc: Utc::now(),
            started_utc: Utc::now(),
            processed_utc: None,
            last_error: None,
            provider_status: None,
            provider_response: None,
            duplicate_count: 0,
            mismatch_count: 0,
            reconciled: false,
            resent_count: 0,
            waits: 0,
            claim_token: Some(new.claim_token.clone()),
            provider_id: None,
            pending_utc: None,
            version: 0,
            order_key: new.order_key.clone(),
            not_before: new.not_before,
            trace_parent: None,
            erased_utc: None,
        }
    }

    fn new_claim() -> NewClaim {
        NewClaim {
            consumer: "payments".into(),
            tenant: String::new(),
            message_id: "m1".into(),
            idem_key: "payments:m1".into(),
            fingerprint: fingerprint(b"{}"),
            payload: bytes::Bytes::from_static(b"{}"),
            content_type: "application/json".into(),
            worker: "w1".into(),
            lease: std::time::Duration::from_secs(30),
            claim_token: new_claim_token(),
            mark_not_called: false,
            order_key: None,
            not_before: None,
            trace_parent: None,
            priority: 0,
        }
    }

    #[test]
    fn only_a_claim_as_its_own_statement_left_it_is_adopted() {
        let new = new_claim();
        let found = claim_as_inserted(&new);
        assert!(
            new.adoptable(&found),
            "this call's claim, held by this worker"
        );
        let mut other = new.clone();
        other.claim_token = new_claim_token();
        assert!(!other.adoptable(&found), "another delivery's claim");
        let mut taken_over = found.clone();
        taken_over.attempt = 2;
        assert!(!new.adoptable(&taken_over), "taken over by a sweeper");
        let mut settled = found.clone();
        settled.state = ClaimState::Completed;
        assert!(!new.adoptable(&settled));
    }

    #[test]
    fn a_claim_committed_waiting_is_never_adopted_even_once_this_worker_took_it() {
        let mut new = new_claim();
        new.order_key = Some("o1".into());
        let waiting = claim_as_inserted(&new);
        assert_eq!(waiting.lease_owner, None);
        assert!(!new.adoptable(&waiting), "the pickup takes it at its turn");
        // This process's own pickup took it meanwhile: same owner, same attempt. Adopting it
        // too would drive it twice, both sends uncounted (two charges under max_sends = 1).
        let mut picked_up = waiting.clone();
        picked_up.lease_owner = Some("w1".into());
        assert!(!new.adoptable(&picked_up));
        let mut scheduled = new_claim();
        scheduled.not_before = Some(Utc::now());
        assert!(!scheduled.adoptable(&claim_as_inserted(&scheduled)));
    }

    #[test]
    fn states_round_trip_through_their_names() {
        for state in ClaimState::ALL {
            assert_eq!(state.as_str().parse::<ClaimState>().unwrap(), state);
        }
        assert!("done".parse::<ClaimState>().is_err());
    }

    #[test]
    fn completed_is_final_and_only_terminal_states_are_terminal() {
        for to in ClaimState::ALL {
            // Only parked for a person when the provider contradicts it.
            assert_eq!(
                ClaimState::Completed.can_move_to(to),
                to == ClaimState::NeedsAttention
            );
        }
        assert!(ClaimState::Completed.is_terminal());
        assert!(ClaimState::Failed.is_terminal());
        assert!(!ClaimState::Started.is_terminal());
        assert!(!ClaimState::NeedsAttention.is_terminal());
        assert!(ClaimState::NeedsAttention.can_move_to(ClaimState::Started));
        assert!(!ClaimState::NeedsAttention.can_move_to(ClaimState::NeedsAttention));
    }

    #[test]
    fn a_pending_claim_is_never_sent_again_and_not_terminal() {
        assert!(!ClaimState::Pending.can_move_to(ClaimState::Started));
        assert!(!ClaimState::Pending.is_terminal());
        for to in [
            ClaimState::Pending,
            ClaimState::Completed,
            ClaimState::Failed,
            ClaimState::NeedsAttention,
        ] {
            assert!(ClaimState::Pending.can_move_to(to), "{to}");
        }
        assert!(ClaimState::Started.can_move_to(ClaimState::Pending));
        assert!(ClaimState::NeedsAttention.can_move_to(ClaimState::Pending));
        assert!(!ClaimState::Failed.can_move_to(ClaimState::Pending));
    }

    #[test]
    fn message_ids_must_be_visible_ascii_and_bounded() {
        assert_eq!(validate_message_id(b"order-1").unwrap(), "order-1");
        assert_eq!(
            validate_message_id(b""),
            Err(IdError::Missing("Idempotency-Key"))
        );
        assert!(matches!(
            validate_message_id(&[b'a'; 256]),
            Err(IdError::TooLong { len: 256, .. })
        ));
        assert!(validate_message_id(&[b'a'; 255]).is_ok());
        assert!(matches!(
            validate_message_id(b"a\x07b"),
            Err(IdError::NotVisibleAscii { position: 1, .. })
        ));
        assert!(validate_message_id(b"a b").is_err());
        assert!(validate_message_id("é".as_bytes()).is_err());
        assert_eq!(validate_tenant(b"").unwrap(), "");
    }

    #[test]
    fn content_types_must_be_printable_ascii_and_bounded() {
        assert_eq!(validate_content_type(b"").unwrap(), "");
        assert_eq!(
            validate_content_type(b"text/plain; charset=utf-8").unwrap(),
            "text/plain; charset=utf-8"
        );
        assert!(validate_content_type(b"application/json\0").is_err());
        assert!(validate_content_type(b"text/plain\r\nX-Evil: 1").is_err());
        assert!(validate_content_type(b"text/plain\x07").is_err());
        assert!(validate_content_type(b"text/plain;\tcharset=utf-8").is_ok());
        assert!(validate_content_type("text/pl\u{e9}in".as_bytes()).is_err());
        assert!(validate_content_type(&[b'a'; 256]).is_err());
        assert!(validate_content_type(&[b'a'; 255]).is_ok());
    }

    #[test]
    fn a_claim_knows_the_row_its_own_intake_call_inserted() {
        let token = new_claim_token();
        assert_eq!(token.len(), 32);
        assert_ne!(token, new_claim_token());
    }

    #[test]
    fn fingerprint_is_sha256_hex() {
        assert_eq!(
            fingerprint(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn key_templates_render_from_stored_fields() {
        let t: KeyTemplate = "{consumer}:{tenant}:{message_id}".parse().unwrap();
        assert_eq!(t.render("pay", "acme", "m1"), "pay:acme:m1");
        assert!(t.mentions_consumer() && t.mentions_tenant());
        let plain: KeyTemplate = "{message_id}".parse().unwrap();
        assert_eq!(plain.render("pay", "acme", "m1"), "m1");
        assert!(!plain.mentions_tenant());
        assert_eq!(
            "{msg}".parse::<KeyTemplate>(),
            Err(KeyTemplateError::UnknownPlaceholder("msg".into()))
        );
        assert_eq!(
            "x-{consumer}".parse::<KeyTemplate>(),
            Err(KeyTemplateError::NoMessageId)
        );
        assert_eq!(
            "{message_id".parse::<KeyTemplate>(),
            Err(KeyTemplateError::Unclosed)
        );
        assert_eq!(
            "{tenant}{message_id}".parse::<KeyTemplate>(),
            Err(KeyTemplateError::AdjacentPlaceholders)
        );
        assert_eq!(
            "{tenant}-{message_id}".parse::<KeyTemplate>(),
            Err(KeyTemplateError::AdjacentPlaceholders)
        );
        // A tenant cannot smuggle the separator in.
        let t: KeyTemplate = "{tenant}:{message_id}".parse().unwrap();
        assert_eq!(t.render("p", "a:b", "c"), "a%3Ab:c");
        assert_ne!(t.render("p", "a:b", "c"), t.render("p", "a", "b:c"));
    }
}
