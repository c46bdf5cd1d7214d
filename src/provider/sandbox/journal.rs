//! The sandbox's effects kept across restarts: one JSON line per applied effect (the whole
//! [`EffectRecord`], written again when an unkeyed effect is applied once more), appended to a
//! file before the caller gets its answer, read back at start, the last line of a key winning.
//!
//! A real provider does not forget a payment when claimd restarts; a sandbox that did would
//! make `claimd reconcile` report `completed_unknown_to_provider` for every claim it completed
//! before the restart. One process writes a file: it is locked while the sandbox runs. A line
//! cut short by a crash is the effect of a call that never got its answer; it is skipped,
//! as the provider would have lost it (claimd finds out through the status endpoint).

use super::{EffectRecord, Inner, Sandbox, SandboxModes, SandboxOptions, Slot, Stored};
use bytes::Bytes;
use hyper::StatusCode;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

/// Why the state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// It cannot be opened, read or locked.
    #[error("sandbox state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Another process holds it.
    #[error(
        "sandbox state file {0}: another sandbox is using it (one process per file): stop that one, or give this one another file"
    )]
    Locked(PathBuf),
}

/// The open, locked state file.
pub(super) struct Journal {
    file: Mutex<std::fs::File>,
    path: PathBuf,
}

impl Journal {
    /// Appends `record` as one line. A failed write is logged: the effect stays applied in
    /// memory, as an answer already on its way cannot be taken back.
    pub(super) fn append(&self, record: &EffectRecord) {
        let mut line = match serde_json::to_vec(record) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "sandbox: effect not written to the state file");
                return;
            }
        };
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // One write of a whole line (O_APPEND): lines never interleave.
        if let Err(e) = file.write_all(&line) {
            tracing::warn!(path = %self.path.display(), error = %e, "sandbox: effect not written to the state file");
        }
    }
}

/// Opens (creating it) and locks `path`, and reads the effects it holds: the last record of
/// each key, and how many lines were skipped as unreadable.
fn open_file(path: &Path) -> Result<(Journal, Vec<EffectRecord>, usize), JournalError> {
    let io = |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(JournalError::Locked(path.to_path_buf()));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    let mut last: std::collections::HashMap<String, EffectRecord> = Default::default();
    let mut skipped = 0;
    for line in std::io::BufReader::new(&file).lines() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<EffectRecord>(&line) {
            Ok(r) => {
                last.insert(r.key.clone(), r);
            }
            Err(_) => skipped += 1,
        }
    }
    let journal = Journal {
        file: Mutex::new(file),
        path: path.to_path_buf(),
    };
    Ok((journal, last.into_values().collect(), skipped))
}

/// A sandbox keeping its effects in `state_file`, or in memory only when it is empty (said
/// in the log: its effects are then forgotten on restart).
pub fn open(
    options: SandboxOptions,
    modes: SandboxModes,
    state_file: &str,
) -> Result<Sandbox, JournalError> {
    if state_file.is_empty() {
        tracing::info!(
            "sandbox: effects in memory only, forgotten on restart (set [sandbox] state_file to keep them)"
        );
        return Ok(Sandbox::with_modes(options, modes));
    }
    Sandbox::with_state_file(options, modes, Path::new(state_file))
}

/// The state file of the sandbox `claimd run` starts: `configured` when set (`""`: memory
/// only), else beside a SQLite store's file (`claimd.db` → `claimd.db.sandbox.jsonl`), so the
/// sandbox forgets its effects exactly when the claims are gone too; memory only with
/// PostgreSQL or an in-memory SQLite.
pub fn state_file_under_run(configured: Option<&str>, store_url: &str) -> String {
    if let Some(path) = configured {
        return path.to_string();
    }
    // No file to sit beside: PostgreSQL, or an in-memory SQLite.
    match crate::store::sqlite_filename(store_url) {
        Some(file) => format!("{}.sandbox.jsonl", file.to_string_lossy()),
        None => String::new(),
    }
}

/// The number in a sandbox id (`eff_12` → 12).
fn id_number(record: &EffectRecord) -> Option<u64> {
    record
        .response
        .get("id")?
        .as_str()?
        .strip_prefix("eff_")?
        .parse()
        .ok()
}

impl Sandbox {
    /// [`Sandbox::with_modes`] whose effects survive a restart: those in `path` are applied
    /// already (replayed, found by lookups), and each new one is appended there before it is
    /// answered. New ids continue after the highest one read.
    pub fn with_state_file(
        options: SandboxOptions,
        modes: SandboxModes,
        path: &Path,
    ) -> Result<Sandbox, JournalError> {
        let (journal, records, skipped) = open_file(path)?;
        let sandbox = Sandbox::build(options, modes, Some(journal));
        let inner = &sandbox.inner;
        let next = records.iter().filter_map(id_number).max().unwrap_or(0) + 1;
        inner.next_id.store(next, Ordering::Relaxed);
        let unkeyed = records
            .iter()
            .filter_map(|r| r.key.strip_prefix("unkeyed-")?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        inner.unkeyed.store(unkeyed + 1, Ordering::Relaxed);
        let restored = records.len();
        let processing = super::pending::still_processing(&records);
        for record in records {
            let stored = Stored {
                status: StatusCode::OK,
                body: Bytes::from(record.response.to_string()),
                record,
            };
            let key = stored.record.key.clone();
            inner.shard(&key).insert(key, Slot::Done(Box::new(stored)));
        }
        super::pending::resume(inner, processing);
        if skipped > 0 {
            tracing::warn!(path = %path.display(), skipped, "sandbox: unreadable lines in the state file skipped (a write cut short)");
        }
        tracing::info!(path = %path.display(), restored, "sandbox: effects kept in the state file across restarts");
        Ok(sandbox)
    }
}

impl Inner {
    /// Writes an applied effect to the state file, when there is one.
    pub(super) fn keep(&self, record: &EffectRecord) {
        if let Some(journal) = &self.journal {
            journal.append(record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_run_the_state_file_sits_beside_a_sqlite_store() {
        assert_eq!(
            state_file_under_run(None, "sqlite://claimd.db"),
            "claimd.db.sandbox.jsonl"
        );
        assert_eq!(
            state_file_under_run(None, "sqlite:///var/lib/claimd/c.db?mode=rwc"),
            "/var/lib/claimd/c.db.sandbox.jsonl"
        );
        assert_eq!(state_file_under_run(None, "sqlite::memory:"), "");
        assert_eq!(state_file_under_run(None, "postgres://u@db/claimd"), "");
        assert_eq!(state_file_under_run(Some(""), "sqlite://claimd.db"), "");
        assert_eq!(
            state_file_under_run(Some("/tmp/s.jsonl"), "postgres://u@db/x"),
            "/tmp/s.jsonl"
        );
    }
}
