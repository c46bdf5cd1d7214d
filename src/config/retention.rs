//! `[retention]`: when finished claims and records are deleted, per state, and (PostgreSQL)
//! when finished claims move to the archive.

use super::ConsumerConfig;
use crate::domain::duration::Dur;
use crate::store::RetentionWindows;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The longest window the archive keeps a claim for (its partitions are made within a hundred
/// years of today).
const MAX_ARCHIVED: Duration = Duration::from_secs(36_500 * 86_400);

/// `[retention]`. Every key may be left out.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Cron expression with seconds.
    pub schedule: String,
    /// How long terminal claims are kept, and what the per-state windows default to; also
    /// the window of sent outcome events and recorded provider events.
    pub keep_terminal_for: Dur,
    /// How long `completed` claims are kept (default: `keep_terminal_for`).
    pub keep_completed_for: Option<Dur>,
    /// How long `failed` claims are kept (default: `keep_terminal_for`).
    pub keep_failed_for: Option<Dur>,
    /// How long dead-letter records are kept (default: `keep_terminal_for`).
    pub keep_dead_letters_for: Option<Dur>,
    /// PostgreSQL: finished claims last changed longer ago than this leave `claims` for the
    /// archive, whose months are dropped whole once their claims' windows end. Not set: they
    /// stay in `claims` until deleted.
    pub archive_after: Option<Dur>,
    /// Rows deleted or moved per statement.
    pub batch_size: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            schedule: "0 0 3 * * *".into(),
            keep_terminal_for: Dur(Duration::from_secs(14 * 86_400)),
            keep_completed_for: None,
            keep_failed_for: None,
            keep_dead_letters_for: None,
            archive_after: None,
            batch_size: 5000,
        }
    }
}

impl RetentionConfig {
    /// The windows the store applies.
    pub fn windows(&self) -> RetentionWindows {
        let or_default = |d: &Option<Dur>| d.map_or(self.keep_terminal_for.0, |d| d.0);
        RetentionWindows {
            completed: or_default(&self.keep_completed_for),
            failed: or_default(&self.keep_failed_for),
            dead_letters: or_default(&self.keep_dead_letters_for),
            records: self.keep_terminal_for.0,
            archive_after: self.archive_after.map(|d| d.0),
        }
    }

    /// Refuses windows that would let a redelivered message be performed again, and an
    /// archive on a store that keeps none: `(key, why)`.
    pub(super) fn validate(
        &self,
        consumers: &[ConsumerConfig],
        sqlite: bool,
    ) -> Result<(), (String, String)> {
        if sqlite && self.archive_after.is_some() {
            return Err((
                "retention.archive_after".into(),
                "the archive is PostgreSQL's (a partitioned table): leave it out with SQLite, whose retention deletes rows".into(),
            ));
        }
        if let Some(after) = self.archive_after {
            let w = self.windows();
            for (key, keep) in [
                ("keep_completed_for", w.completed),
                ("keep_failed_for", w.failed),
            ] {
                if after.0 >= keep {
                    return Err((
                        "retention.archive_after".into(),
                        format!(
                            "{after} is not shorter than the window of {key} ({}): a claim would be deleted before it could be archived",
                            Dur(keep)
                        ),
                    ));
                }
                if keep > MAX_ARCHIVED {
                    return Err((
                        format!("retention.{key}"),
                        format!(
                            "{} is longer than the archive keeps claims ({}): its partitions are made within a hundred years",
                            Dur(keep),
                            Dur(MAX_ARCHIVED)
                        ),
                    ));
                }
            }
        }
        for (key, d) in [
            ("keep_terminal_for", Some(self.keep_terminal_for)),
            ("keep_completed_for", self.keep_completed_for),
            ("keep_failed_for", self.keep_failed_for),
            ("keep_dead_letters_for", self.keep_dead_letters_for),
            ("archive_after", self.archive_after),
        ] {
            let Some(d) = d else { continue };
            if d.0.is_zero() {
                return Err((format!("retention.{key}"), "must be more than zero".into()));
            }
            if key == "keep_dead_letters_for" {
                continue;
            }
            for (i, c) in consumers.iter().enumerate() {
                if d.0 < c.redrive_within.0 {
                    return Err((
                        format!("retention.{key}"),
                        format!(
                            "{d} is shorter than consumers[{i}].redrive_within {}: a redelivered message could be claimed and performed again after its claim {}",
                            c.redrive_within,
                            if key == "archive_after" {
                                "left for the archive"
                            } else {
                                "was pruned"
                            }
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
