//! What operators do to claims and how they find them: listings and searches, the parked
//! claims a bulk action selects, a claim's history, and the guarded resolve and redrive.

use crate::domain::claim::{Claim, ClaimState};
use crate::store::{ClaimEvent, ClaimFamily, ClaimFilter, Seen, StoreResult};
use async_trait::async_trait;

/// The operator's part of the store, used by `claimd claims ...`, `GET /v1/claims`, the
/// operator page and its actions (`operator_action`), and `claim_query`: claim queries and
/// the moves an operator makes, each allowed only from the state (and attempt and version)
/// the operator saw.
#[async_trait]
pub trait OperatorStore: Send + Sync {
    /// Claims matching the filter, newest first.
    async fn list(&self, filter: &ClaimFilter) -> StoreResult<Vec<Claim>>;

    /// Parked (`needs_attention`) claims of `consumer` whose reason (`last_error`) starts with
    /// `reason_prefix` (empty: any), newest first, at most `limit`: what a bulk operator action
    /// selects.
    async fn parked_by_reason(
        &self,
        consumer: &str,
        reason_prefix: &str,
        limit: u32,
    ) -> StoreResult<Vec<Claim>>;

    /// The claim's history, oldest first.
    async fn events(&self, id: i64) -> StoreResult<Vec<ClaimEvent>>;

    /// The claim's follow-up chain (docs/follow-ups.md): the claim whose settle created it
    /// and the claims its settles created.
    async fn family(&self, id: i64) -> StoreResult<ClaimFamily>;

    /// Operator decision on a `needs_attention` or `failed` claim. Returns the claim after
    /// the change, or `None` when no such claim exists. Refuses other states, and with
    /// `expected` (what the operator saw) every state but that one and every other attempt,
    /// in the same statement, so a claim another operator or a sweep moved in between is left
    /// as they left it.
    #[allow(clippy::too_many_arguments)]
    async fn resolve(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        to: ClaimState,
        actor: &str,
        note: &str,
        expected: Option<Seen>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>>;

    /// Puts a `needs_attention` or `failed` claim back to `started` with an expired lease
    /// (and a new attempt number) so the next sweep performs it with the same key. `expected`
    /// as for [`OperatorStore::resolve`].
    async fn redrive(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        actor: &str,
        expected: Option<Seen>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        self.redrive_noted(consumer, tenant, message_id, actor, "", expected)
            .await
    }

    /// [`OperatorStore::redrive`] with the operator's `note` (empty: none) kept in the same
    /// history line as the state the claim left.
    async fn redrive_noted(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        actor: &str,
        note: &str,
        expected: Option<Seen>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>>;

    /// Erases claim `id` when it is finished (`completed`, `failed`) and not erased yet: its
    /// payload emptied, provider response and error cleared, `erased_utc` set, the version
    /// bumped and a history line (`erase`, by `actor`, with `note`) written in the same
    /// transaction. The row and its fingerprint stay, so a redelivery is still a duplicate.
    /// Returns the claim after the change; `None` when nothing changed (no such claim, an open
    /// one, or one erased already).
    async fn erase(&self, id: i64, actor: &str, note: &str) -> StoreResult<Option<Claim>>;

    /// One claim by its identity, else (PostgreSQL) its newest archived copy: what an
    /// operator's look at a message reads. The paths that claim and settle read
    /// [`get`](crate::store::IntakeStore::get), which never looks in the archive.
    async fn find(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<Claim>>;
}
