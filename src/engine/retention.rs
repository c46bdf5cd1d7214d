//! Retention: deletes terminal claims (`completed`, `failed`) older than `keep_terminal_for`,
//! in bounded batches, one instance at a time (I7). `started` and `needs_attention` claims are
//! never deleted: the statement names only terminal states.

use crate::config::RetentionConfig;
use crate::store::{PruneResult, Store, StoreResult};
use tracing::info;

/// Runs one retention pass.
pub async fn prune(
    store: &Store,
    config: &RetentionConfig,
    dry_run: bool,
) -> StoreResult<PruneResult> {
    let result = store
        .prune(config.keep_terminal_for.0, config.batch_size, dry_run)
        .await?;
    if !dry_run && (result.deleted > 0 || result.dead_letters_deleted > 0) {
        info!(
            deleted = result.deleted,
            batches = result.batches,
            dead_letters_deleted = result.dead_letters_deleted,
            "pruned terminal claims and old dead-letter records"
        );
    }
    Ok(result)
}
