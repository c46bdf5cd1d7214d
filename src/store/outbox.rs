//! The outcome-event outbox as the store keeps it: which consumers get events
//! ([`OutcomeConsumers`]), which moves write one ([`emits`]), an event row as the relay reads it
//! ([`OutcomeEvent`]) and the relay's backlog ([`OutboxBacklog`]).
//!
//! The rows are written by the settle statements themselves (a data-modifying CTE in
//! PostgreSQL, a statement of the settle's transaction in SQLite): an event exists exactly
//! when the change it reports committed. A settle that writes no event (no consumer has an
//! outcome destination, or the move reports nothing) takes the plain settle statement, without
//! the outbox's part ([`OutcomeConsumers::writes`]); an operator's move binds an empty list
//! for a consumer without a destination, and writes nothing more.

use crate::domain::claim::ClaimState;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// The destinations whose consumers' settles write outcome events, as the statements bind
/// them: a JSON array of `[consumer, destination]` pairs (`[]`: none). A settle writes one
/// event row per destination of its consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeConsumers {
    destinations: Vec<(String, String)>,
    names: Vec<String>,
    json: String,
}

impl Default for OutcomeConsumers {
    fn default() -> Self {
        OutcomeConsumers::new(Vec::new())
    }
}

impl OutcomeConsumers {
    /// The destinations named, as (consumer, destination) pairs.
    pub fn new(mut destinations: Vec<(String, String)>) -> Self {
        destinations.sort();
        destinations.dedup();
        let mut names: Vec<String> = destinations.iter().map(|(c, _)| c.clone()).collect();
        names.dedup();
        let json = serde_json::to_string(&destinations).unwrap_or_else(|_| "[]".into());
        OutcomeConsumers {
            destinations,
            names,
            json,
        }
    }

    /// The consumers, sorted.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The (consumer, destination) pairs, sorted.
    pub fn destinations(&self) -> &[(String, String)] {
        &self.destinations
    }

    /// What a statement binds for a write that `emits` an event: the JSON list, or `[]`.
    pub fn bound(&self, emits: bool) -> &str {
        if emits { &self.json } else { "[]" }
    }

    /// What a write that `emits` binds when it writes an event at all: the JSON list, or
    /// `None` when no consumer gets events or the move reports nothing (then the write takes
    /// a statement without the outbox's part: [`Statements::settle_plain`]).
    ///
    /// [`Statements::settle_plain`]: super::dialect::Statements::settle_plain
    pub fn writes(&self, emits: bool) -> Option<&str> {
        (emits && !self.names.is_empty()).then_some(self.json.as_str())
    }

    /// Whether none gets events.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// Whether a settle from `from` to `to` writes an outcome event: the claim ends or pauses
/// (`completed`, `failed`, `needs_attention`, `pending`), or moves between those. A hand-off
/// (still `started`) or a poll that leaves a claim as it was writes none. An operator's resolve
/// or redrive always writes one.
pub fn emits(from: ClaimState, to: Option<ClaimState>) -> bool {
    matches!(to, Some(t) if t != from && t != ClaimState::Started)
}

/// One outcome event, as the relay reads it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OutcomeEvent {
    /// The row's sequence number (unique in the store; one per event and destination).
    pub seq: i64,
    /// The destination the row is for.
    pub destination: String,
    /// The claim's version after the change (`None` for events written before destinations
    /// had names): with the claim's id it makes the event id, the same at every destination.
    pub claim_version: Option<i64>,
    /// The claim's id.
    pub claim_id: i64,
    /// Consumer.
    pub consumer: String,
    /// Tenant (`""` when none).
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// The idempotency key sent to the provider.
    pub key: String,
    /// The claim's state after the change.
    pub state: String,
    /// The claim's attempt after the change.
    pub attempt: i32,
    /// The provider's status, when there was an answer.
    pub provider_status: Option<i32>,
    /// The provider's id of the effect.
    pub provider_id: Option<String>,
    /// The provider's answer (at most 4 KiB, as stored on the claim).
    pub provider_response: Option<String>,
    /// Why (the claim's last error), when not completed.
    pub reason: Option<String>,
    /// Who made the change: a worker instance, or the operator.
    pub actor: String,
    /// What made it: the history line's action (`perform`, `reconcile`, `poll`, `event`,
    /// `resolve`, `redrive`, ...).
    pub action: String,
    /// When the change committed (database time).
    pub at_utc: DateTime<Utc>,
    /// Sends tried before this one.
    pub tries: i32,
    /// The claim whose settle created this one (docs/follow-ups.md), while it is stored.
    pub parent: Option<OutcomeParent>,
}

/// An outcome event's parent claim: what names it to the producer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OutcomeParent {
    /// Its consumer.
    pub consumer: String,
    /// Its message id.
    pub message_id: String,
}

/// The first event of each claim among `events` (sorted by `seq`): a claim's later event in the
/// same batch waits for the next round, when the earlier one was sent (order per claim).
pub fn first_per_claim(events: Vec<OutcomeEvent>) -> Vec<OutcomeEvent> {
    let mut seen = std::collections::HashSet::with_capacity(events.len());
    events
        .into_iter()
        .filter(|e| seen.insert(e.claim_id))
        .collect()
}

/// The relay's backlog for one destination of a consumer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OutboxBacklog {
    /// Consumer.
    pub consumer: String,
    /// The destination's name.
    pub destination: String,
    /// Events not sent yet.
    pub unsent: i64,
    /// Age of the oldest unsent event, in seconds.
    pub oldest_unsent_age_s: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_claim_that_ends_or_pauses_writes_an_event() {
        use ClaimState::*;
        assert!(emits(Started, Some(Completed)));
        assert!(emits(Started, Some(Failed)));
        assert!(emits(Started, Some(NeedsAttention)));
        assert!(emits(Started, Some(Pending)));
        assert!(emits(Pending, Some(Completed)));
        assert!(emits(Completed, Some(NeedsAttention)));
        assert!(!emits(Started, None), "a hand-off");
        assert!(!emits(Started, Some(Started)));
        assert!(
            !emits(Pending, Some(Pending)),
            "a poll that changed nothing"
        );
    }

    #[test]
    fn a_batch_keeps_the_first_event_of_each_claim() {
        let ev = |seq, claim_id| OutcomeEvent {
            seq,
            destination: "hooks".into(),
            claim_version: Some(seq),
            claim_id,
            consumer: "pay".into(),
            tenant: String::new(),
            message_id: format!("m{claim_id}"),
            key: String::new(),
            state: "completed".into(),
            attempt: 1,
            provider_status: None,
            provider_id: None,
            provider_response: None,
            reason: None,
            actor: "w".into(),
            action: "perform".into(),
            at_utc: DateTime::<Utc>::UNIX_EPOCH,
            tries: 0,
            parent: None,
        };
        let kept: Vec<i64> = first_per_claim(vec![ev(1, 7), ev(2, 8), ev(3, 7), ev(4, 9)])
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(kept, [1, 2, 4]);
    }

    #[test]
    fn the_bound_list_is_empty_unless_the_write_emits() {
        let pair = |c: &str, d: &str| (c.to_string(), d.to_string());
        let c = OutcomeConsumers::new(vec![pair("b", "x"), pair("a", "y"), pair("a", "x")]);
        let json = r#"[["a","x"],["a","y"],["b","x"]]"#;
        assert_eq!(c.names(), ["a", "b"]);
        assert_eq!(c.bound(true), json);
        assert_eq!(c.bound(false), "[]");
        assert_eq!(OutcomeConsumers::default().bound(true), "[]");
        assert_eq!(c.writes(true), Some(json));
        assert_eq!(c.writes(false), None);
        assert_eq!(OutcomeConsumers::default().writes(true), None);
    }
}
