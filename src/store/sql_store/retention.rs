//! Retention over a dialect: the archive's move and its dropped months (PostgreSQL), then the
//! deletion of terminal claims by their state's window, of old dead-letter records, sent
//! outcome events and provider events, each in bounded batches committed one by one, under
//! the lock that lets one instance prune at a time.

use super::SqlStore;
use crate::store::args::ms;
use crate::store::dialect::{Arg, Dialect, SqlRow};
use crate::store::{ArchiveBatch, PruneResult, RetentionWindows, StoreResult};
use std::time::Duration;
use tracing::warn;

/// The terminal states, each with its window.
fn terminal(w: &RetentionWindows) -> [(&'static str, Duration); 2] {
    [("completed", w.completed), ("failed", w.failed)]
}

impl<D: Dialect> SqlStore<D> {
    /// [`EngineStore::prune`](crate::store::EngineStore::prune).
    pub(super) async fn prune_windows(
        &self,
        w: &RetentionWindows,
        batch: u32,
        dry_run: bool,
    ) -> StoreResult<PruneResult> {
        if dry_run {
            return self.prune_counts(w, batch).await;
        }
        let Some(lock) = self.dialect.retention_lock().await? else {
            return Ok(PruneResult {
                skipped_locked: true,
                ..Default::default()
            });
        };
        let pruned = self.prune_locked(w, batch).await;
        lock.release().await;
        pruned
    }

    /// What a run would do, counted.
    async fn prune_counts(&self, w: &RetentionWindows, batch: u32) -> StoreResult<PruneResult> {
        let sql = &D::SQL;
        let mut r = PruneResult::default();
        if let Some(moved) = self.dialect.archive_batch(w, batch, true).await {
            add_moved(&mut r, moved?);
            // `archive_after` is shorter than every window (checked at load): the claims old
            // enough to be deleted are the archive's to move or delete, counted above.
            return self.count_records(w, r).await;
        }
        for (state, keep) in terminal(w) {
            let args = [Arg::I64(ms(keep)), Arg::Text(state)];
            let n = self.count("prune_count", sql.prune_count, &args).await?;
            add_deleted(&mut r, state, n);
        }
        self.count_records(w, r).await
    }

    /// The dead-letter records a run would delete, added to `r`.
    async fn count_records(
        &self,
        w: &RetentionWindows,
        mut r: PruneResult,
    ) -> StoreResult<PruneResult> {
        let args = [Arg::I64(ms(w.dead_letters))];
        r.dead_letters_deleted = self
            .count(
                "prune_dead_letters_count",
                D::SQL.prune_dead_letters_count,
                &args,
            )
            .await?;
        Ok(r)
    }

    async fn prune_locked(&self, w: &RetentionWindows, batch: u32) -> StoreResult<PruneResult> {
        let sql = &D::SQL;
        let size = i64::from(batch);
        let full = |n: u64| n >= u64::from(batch);
        let mut r = PruneResult::default();
        // Each batch commits on its own so new claims are never blocked for long. The archive
        // failing (its lock not had within its timeout, the database away) leaves the rest of
        // retention to run; it is tried again at the next run.
        while let Some(moved) = self.dialect.archive_batch(w, batch, false).await {
            let moved = match moved {
                Ok(m) => m,
                Err(e) => {
                    warn!(error = %e, "the archive's move failed; retention goes on without it");
                    r.archive_error = Some(e.to_string());
                    break;
                }
            };
            r.batches += 1;
            add_moved(&mut r, moved);
            if !full(moved.moved()) {
                break;
            }
        }
        match self.dialect.drop_archive_months().await {
            Some(Ok(dropped)) => r.archive_months_dropped = dropped,
            Some(Err(e)) => {
                warn!(error = %e, "dropping the archive's past months failed; tried again next run");
                r.archive_error.get_or_insert(e.to_string());
            }
            None => {}
        }
        for (state, keep) in terminal(w) {
            let args = [Arg::I64(ms(keep)), Arg::I64(size), Arg::Text(state)];
            loop {
                let n = self.execute("prune_batch", sql.prune_batch, &args).await?;
                r.batches += 1;
                add_deleted(&mut r, state, n);
                if !full(n) {
                    break;
                }
            }
        }
        let by = |keep: Duration| [Arg::I64(ms(keep)), Arg::I64(size)];
        let steps = [
            (
                "prune_dead_letters",
                sql.prune_dead_letters,
                by(w.dead_letters),
            ),
            // Sent outcome events (unsent ones stay until they are sent).
            ("prune_outcomes", sql.prune_outcomes, by(w.records)),
            // A provider event's re-delivery older than the window is refused as stale by its
            // signature's timestamp long before.
            (
                "prune_provider_events",
                sql.prune_provider_events,
                by(w.records),
            ),
        ];
        for (name, statement, args) in &steps {
            loop {
                let n = self.execute(name, statement, args).await?;
                if *name == "prune_dead_letters" {
                    r.dead_letters_deleted += n;
                }
                if !full(n) {
                    break;
                }
            }
        }
        Ok(r)
    }

    async fn count(
        &self,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<u64> {
        let rows = self.fetch(name, sql, args).await?;
        let n = rows.first().map(|r| r.i64("n")).transpose()?;
        Ok(n.unwrap_or(0).max(0) as u64)
    }
}

fn add_moved(r: &mut PruneResult, m: ArchiveBatch) {
    r.archived += m.archived;
    add_deleted(r, "completed", m.deleted_completed);
    add_deleted(r, "failed", m.deleted_failed);
}

fn add_deleted(r: &mut PruneResult, state: &str, n: u64) {
    r.deleted += n;
    if state == "completed" {
        r.deleted_completed += n;
    } else {
        r.deleted_failed += n;
    }
}
