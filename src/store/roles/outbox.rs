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
    /// Makes the settles of `consumers` (those with an outcome destination) write outcome
    /// events ([`outbox`](crate::store::outbox)). Set once, before the first settle; later calls change nothing.
    fn set_outcome_consumers(&self, consumers: Vec<String>);

    /// The consumers whose settles write outcome events.
    fn outcome_consumers(&self) -> Vec<String>;

    /// Holds `consumer`'s outcome relay for `owner` for `lease` from now (taking it when it
    /// is free or its holder's lease ran out, renewing it when it is `owner`'s already).
    /// `false`: another owner holds it. One row write.
    async fn hold_outcome_relay(
        &self,
        consumer: &str,
        owner: &str,
        lease: Duration,
    ) -> StoreResult<bool>;

    /// Up to `limit` unsent outcome events of `consumer` that are due, in order; a claim's
    /// event only when every earlier event of that claim was sent. Reads only: the caller
    /// holds the consumer's relay ([`OutboxStore::hold_outcome_relay`]).
    async fn due_outcomes(&self, consumer: &str, limit: u32) -> StoreResult<Vec<OutcomeEvent>>;

    /// Lets go of `consumer`'s relay if `owner` holds it (at shutdown), so that another
    /// instance takes it over at once rather than when the lease runs out.
    async fn release_outcome_relay(&self, consumer: &str, owner: &str) -> StoreResult<()>;

    /// Marks these events sent (their destination confirmed them). Returns how many changed.
    async fn mark_outcomes_sent(&self, seqs: &[i64]) -> StoreResult<u64>;

    /// Gives these events back, to be tried again after `after`, recording `error`.
    async fn retry_outcomes(&self, seqs: &[i64], after: Duration, error: &str) -> StoreResult<()>;
}
