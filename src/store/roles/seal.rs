//! What `claimd keys` reads and writes: the sealed columns of each table as stored (not
//! opened), a page at a time, and fenced writes of them sealed again (see
//! [`sealing`](crate::store::sealing)).

use crate::store::StoreResult;
use crate::store::sealing::{SealedRow, SealedTable};
use async_trait::async_trait;

/// The keys' part of the store, used by `claimd keys status` and `claimd keys rotate`.
#[async_trait]
pub trait SealStore: Send + Sync {
    /// The rows of `table` with id over `after`, by id, at most `limit`, as stored.
    async fn sealed_page(
        &self,
        table: SealedTable,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<SealedRow>>;

    /// Writes `new`'s values over the row `was` was read as, only while the row still holds
    /// `was`'s values (and, for a claim, its version): true when written. A row changed since
    /// (a settle, an erasure) is left alone: it was written under the active key anyway.
    async fn reseal(
        &self,
        table: SealedTable,
        was: &SealedRow,
        new: &SealedRow,
    ) -> StoreResult<bool>;

    /// Seals claim `id` under the active key when any of its columns is clear or under
    /// another key (a claim the SQL enqueue path wrote); true when written. Nothing without
    /// a keyring.
    async fn seal_claim(&self, id: i64) -> StoreResult<bool>;
}
