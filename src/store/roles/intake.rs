//! What arrives from outside, as the store keeps it: a producer's message claimed once
//! (duplicates and payload mismatches recognised and counted, by the unique key alone), a
//! broker message dead-lettered, a provider's event recorded once and the claim it names.

use crate::domain::claim::{Claim, NewClaim};
use crate::store::{ClaimOutcome, ProviderEventRecord, StoreResult};
use async_trait::async_trait;

/// The intake's part of the store: claiming a message (a new claim, a duplicate, a
/// mismatch), reading a claim by its key (`GET /v1/messages/...`, a duplicate's answer), the
/// dead letters of the AMQP intake, and the provider events `provider_events::receive` takes
/// (seen once, recorded, the claim found by the provider's id).
#[async_trait]
pub trait IntakeStore: Send + Sync {
    /// Inserts the claim in a transaction of its own and commits it, or recognises a duplicate
    /// or a mismatch (counting it). Only the unique key decides "duplicate".
    async fn claim(&self, new: &NewClaim) -> StoreResult<ClaimOutcome>;

    /// Claims many at once (one round trip where the driver can); same answers as [`claim`].
    ///
    /// [`claim`]: IntakeStore::claim
    async fn claim_many(&self, new: &[NewClaim]) -> StoreResult<Vec<ClaimOutcome>> {
        let mut out = Vec::with_capacity(new.len());
        for n in new {
            out.push(self.claim(n).await?);
        }
        Ok(out)
    }

    /// One claim by its identity.
    async fn get(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<Claim>>;

    /// Records that a broker message of `consumer` was dead-lettered for `reason` (a reason
    /// class such as `payload_mismatch`). `message_id` is stored printable and cut to 255 bytes.
    async fn record_dead_letter(
        &self,
        consumer: &str,
        reason: &str,
        message_id: Option<&str>,
    ) -> StoreResult<()>;

    /// Whether `consumer` already took the provider event `event_id`.
    async fn provider_event_seen(&self, consumer: &str, event_id: &str) -> StoreResult<bool>;

    /// Records a provider event once (a second record of the same id changes nothing).
    async fn record_provider_event(&self, event: &ProviderEventRecord<'_>) -> StoreResult<()>;

    /// The claim of `consumer` whose provider id is `provider_id` (the most recent when the
    /// provider reused one).
    async fn find_by_provider_id(
        &self,
        consumer: &str,
        provider_id: &str,
    ) -> StoreResult<Option<Claim>>;
}
