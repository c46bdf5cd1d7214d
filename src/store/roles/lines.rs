//! What the reports, the CLI and the operator page read of order keys' lines
//! (docs/flow-control.md): whom a waiting claim waits behind, how many wait behind a claim,
//! how many claims of each consumer wait in lines.

use crate::domain::claim::Claim;
use crate::store::StoreResult;
use async_trait::async_trait;
use serde::Serialize;
use std::collections::BTreeMap;

/// The claim a waiting claim waits behind: the earliest unfinished claim of its line that
/// holds it (earlier in the line, or in flight, pending or parked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LineHead {
    /// Its message id.
    pub message_id: String,
    /// Its state.
    pub state: String,
    /// Its attempt.
    pub attempt: i32,
}

/// The lines' part of the store.
#[async_trait]
pub trait LineStore: Send + Sync {
    /// Whom `claim` waits behind in its order key's line; `None` when it waits for nobody
    /// (or has no order key).
    async fn line_head(&self, claim: &Claim) -> StoreResult<Option<LineHead>>;

    /// [`line_head`](LineStore::line_head) of a claim that waits in its line, else `None`
    /// without asking.
    async fn waiting_behind(&self, claim: &Claim) -> StoreResult<Option<LineHead>> {
        if !claim.waits_in_line() {
            return Ok(None);
        }
        self.line_head(claim).await
    }

    /// How many claims wait behind `claim` in its order key's line (0 without a key).
    async fn behind_in_line(&self, claim: &Claim) -> StoreResult<i64>;

    /// Claims waiting in order keys' lines, per consumer (consumers with none are left out).
    async fn in_line(&self) -> StoreResult<BTreeMap<String, i64>>;

    /// Puts up to `limit` scheduled claims of `consumer` whose time came into their order
    /// keys' lines, in one statement: no lease owner, attempt 1 and the "not called" marker
    /// with it, so the pickup takes each at its turn as a first send. No worker holds such a
    /// claim in between, so no crash or store error can leave it taken and out of its line
    /// (I10, I11). Returns the claims it released.
    async fn release_due_to_line(&self, consumer: &str, limit: u32) -> StoreResult<Vec<Claim>>;
}
