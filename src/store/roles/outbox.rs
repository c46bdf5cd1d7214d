//! The outcome events' outbox as the relay uses it: which consumers' settles write events,
//! holding a consumer's relay, taking its due events, marking them sent or giving them back.

use crate::store::StoreResult;
use crate::store::outbox::OutcomeEvent;
use async_trait::async_trait;
use std::time::Duration;

/// The outbox's part of the store, used by `outcome_relay` (one relay per consumer with an
/// outcome destination) and by `app`, which names those consumers once at start. The events
/// themselves are written by the settle statements ([`EngineStore`](super::EngineStore)).
#[async_trait]
pub trait OutboxStore: Send + Sync {
    /// Makes the settles of the consumers named in `destinations` (consumer, destination
    /// pairs) write one outcome event per destination ([`outbox`](crate::store::outbox)). Set
    /// once, before the first settle; later calls change nothing.
    fn set_outcome_destinations(&self, destinations: Vec<(String, String)>);

    /// The consumers whose settles write outcome events.
    fn outcome_consumers(&self) -> Vec<String>;

    /// The (consumer, destination) pairs outcome events are written for.
    fn outcome_destinations(&self) -> Vec<(String, String)>;

    /// Holds the outcome relay of `consumer`'s `destination` for `owner` for `lease` from now
    /// (taking it when it is free or its holder's lease ran out, renewing it when it is
    /// `owner`'s already). `false`: another owner holds it. One row write.
    async fn hold_outcome_relay(
        &self,
        consumer: &str,
        destination: &str,
        owner: &str,
        lease: Duration,
    ) -> StoreResult<bool>;

    /// Up to `limit` unsent outcome events of `consumer` for `destination` that are due, in
    /// order; a claim's event only when every earlier event of that claim to that
    /// destination was sent. Reads only: the caller holds the destination's relay
    /// ([`OutboxStore::hold_outcome_relay`]).
    async fn due_outcomes(
        &self,
        consumer: &str,
        destination: &str,
        limit: u32,
    ) -> StoreResult<Vec<OutcomeEvent>>;

    /// Lets go of the relay of `consumer`'s `destination` if `owner` holds it (at
    /// shutdown), so that another instance takes it over at once rather than when the lease
    /// runs out.
    async fn release_outcome_relay(
        &self,
        consumer: &str,
        destination: &str,
        owner: &str,
    ) -> StoreResult<()>;

    /// Gives `consumer`'s unsent events written before destinations had names to
    /// `destination` (its first). Returns how many.
    async fn adopt_outcomes(&self, consumer: &str, destination: &str) -> StoreResult<u64>;

    /// Marks these events sent (their destination confirmed them). Returns how many changed.
    async fn mark_outcomes_sent(&self, seqs: &[i64]) -> StoreResult<u64>;

    /// Gives these events back, to be tried again after `after`, recording `error`.
    async fn retry_outcomes(&self, seqs: &[i64], after: Duration, error: &str) -> StoreResult<()>;

    /// The oldest unsent event of `consumer` for `destination`, due or not (a probe of a
    /// destination that looked down; being the oldest, no earlier event of its claim is
    /// unsent). Reads only.
    async fn oldest_unsent_outcome(
        &self,
        consumer: &str,
        destination: &str,
    ) -> StoreResult<Option<OutcomeEvent>>;

    /// The stored `traceparent` of those of `claim_ids` that have one (traced outcome events
    /// join their claim's trace). Reads only.
    async fn trace_parents(&self, claim_ids: &[i64]) -> StoreResult<Vec<(i64, String)>>;

    /// Makes `consumer`'s events for `destination` that wait out a backoff due now (the
    /// destination confirmed events again). Returns how many.
    async fn wake_outcomes(&self, consumer: &str, destination: &str) -> StoreResult<u64>;
}
