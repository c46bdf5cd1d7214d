//! Retention: erases the payloads of finished claims older than their consumer's
//! `payload_retention`, moves finished claims older than `archive_after` to the archive
//! (PostgreSQL) and drops the archive's months whose retention is over, then deletes terminal
//! claims (`completed`, `failed`) older than their state's window, in bounded batches, one
//! instance at a time (I7). `started`, `pending` and `needs_attention` claims are never
//! erased, archived nor deleted: the statements name only terminal states.

use crate::config::{ConsumerConfig, RetentionConfig};
use crate::store::{PruneResult, Store, StoreResult};
use tracing::info;

/// Runs one retention pass: the payload erasure of every consumer with a
/// `payload_retention`, then the deletion of old claims; a dry run only counts both.
pub async fn prune(
    store: &Store,
    config: &RetentionConfig,
    consumers: &[ConsumerConfig],
    dry_run: bool,
) -> StoreResult<PruneResult> {
    let mut erased = 0;
    for c in consumers {
        let Some(keep) = &c.payload_retention else {
            continue;
        };
        if dry_run {
            erased += store.erase_due_count(&c.name, keep.0).await?;
            continue;
        }
        let n = store.erase_due(&c.name, keep.0, config.batch_size).await?;
        if n > 0 {
            info!(consumer = %c.name, erased = n, payload_retention = %keep,
                "erased the payloads of finished claims");
        }
        erased += n;
    }
    let mut result = store
        .prune(&config.windows(), config.batch_size, dry_run)
        .await?;
    result.erased = erased;
    if !dry_run
        && (result.deleted > 0
            || result.dead_letters_deleted > 0
            || result.archived > 0
            || result.archive_months_dropped > 0)
    {
        info!(
            deleted = result.deleted,
            deleted_completed = result.deleted_completed,
            deleted_failed = result.deleted_failed,
            archived = result.archived,
            archive_months_dropped = result.archive_months_dropped,
            batches = result.batches,
            dead_letters_deleted = result.dead_letters_deleted,
            "retention: archived and pruned finished claims and old records"
        );
    }
    Ok(result)
}
