//! `claimd keys status` and `claimd keys rotate`: how many stored values each key sealed, and
//! sealing again under the active key what an older key (or none) sealed, online, in small
//! fenced writes (docs/operations.md, "Encryption at rest").
//!
//! Rotation reads each table a page at a time, by id, and writes each row that needs it in a
//! statement of its own, only while the row still holds what was read (a claim: also its
//! version): a settle, a takeover or an erasure that wrote the row meanwhile wins, having
//! written it under the active key already. Running it again goes on where it stopped (rows
//! done are only read), and `after` skips the claims already done.

use crate::domain::sealed::{Keyring, SealError, key_id};
use crate::store::sealing::{self, SealedRow, SealedTable};
use crate::store::{SealStore, StoreError};
use serde::Serialize;
use std::collections::BTreeMap;

/// Rows read per page.
pub const PAGE: u32 = 500;

/// What a key-id count calls a clear value (written before encryption was on, or by the SQL
/// enqueue path and not taken yet).
pub const CLEAR: &str = "(clear)";

/// Why a keys command failed.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// Encryption is not on in the configuration.
    #[error("encryption is off: set [encryption] enabled = true with its keys")]
    Off,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A value that does not open: where, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Unreadable {
    /// The table.
    pub table: &'static str,
    /// The column.
    pub column: &'static str,
    /// The row's id (a claim's id in `claims`).
    pub id: i64,
    /// Why (its key is not among the keys, or it is damaged).
    pub why: String,
}

/// `claimd keys status`: per table and column, how many values each key id sealed.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct KeyStatus {
    /// The key that seals now.
    pub active: String,
    /// The keys that open.
    pub keys: Vec<String>,
    /// `table.column` -> key id (or [`CLEAR`]) -> values. Empty and NULL values are not
    /// counted.
    pub counts: BTreeMap<String, BTreeMap<String, u64>>,
    /// Values sealed under a key that is not among the keys (at most 100 listed).
    pub unreadable: Vec<Unreadable>,
    /// How many values are unreadable in all.
    pub unreadable_total: u64,
    /// Values not sealed under the active key (what a rotation would write).
    pub to_rotate: u64,
}

/// Counts the stored values per key (reads every row, a page at a time).
pub async fn status(store: &dyn SealStore) -> Result<KeyStatus, KeysError> {
    let keys = sealing::keyring().ok_or(KeysError::Off)?;
    let mut out = KeyStatus {
        active: keys.active().to_string(),
        keys: keys.ids().iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    for table in SealedTable::ALL {
        let mut after = 0;
        loop {
            let page = store.sealed_page(table, after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = last.id;
            for row in &page {
                count_row(keys, table, row, &mut out);
            }
        }
    }
    Ok(out)
}

fn count_row(keys: &Keyring, table: SealedTable, row: &SealedRow, out: &mut KeyStatus) {
    for (column, value) in table.columns().iter().zip(&row.values) {
        let Some(stored) = value.as_deref().filter(|v| !v.is_empty()) else {
            continue;
        };
        let id = key_id(stored).unwrap_or(CLEAR);
        *out.counts
            .entry(format!("{}.{column}", table.name()))
            .or_default()
            .entry(id.to_string())
            .or_default() += 1;
        if keys.needs_reseal(stored) {
            out.to_rotate += 1;
        }
        if id != CLEAR && !keys.ids().contains(&id) {
            out.unreadable_total += 1;
            tracing::error!(
                table = table.name(),
                column,
                id = row.id,
                key = id,
                "{} {}: {column} sealed with key {id:?}, which is not among the keys",
                table.name(),
                row.id
            );
            if out.unreadable.len() < 100 {
                out.unreadable.push(Unreadable {
                    table: table.name(),
                    column,
                    id: row.id,
                    why: SealError::MissingKey(id.to_string()).to_string(),
                });
            }
        }
    }
}

/// Where a rotation is, after a page.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct RotateProgress {
    /// The table being gone through.
    pub table: &'static str,
    /// The last id read in it.
    pub last_id: i64,
    /// Rows read so far (all tables).
    pub read: u64,
    /// Rows written sealed under the active key.
    pub resealed: u64,
    /// Rows changed by someone else between the read and the write (left: written anew).
    pub changed_meanwhile: u64,
    /// Values that do not open (their key is missing): left as they are.
    pub unreadable: Vec<Unreadable>,
}

/// Seals again under the active key every value sealed under another key, or clear, going
/// through the tables by id; claims from id `after` on. `progress` is told after every page.
pub async fn rotate(
    store: &dyn SealStore,
    after: i64,
    mut progress: impl FnMut(&RotateProgress),
) -> Result<RotateProgress, KeysError> {
    let keys = sealing::keyring().ok_or(KeysError::Off)?;
    let mut p = RotateProgress::default();
    for table in SealedTable::ALL {
        p.table = table.name();
        let mut last = if table == SealedTable::Claims {
            after
        } else {
            0
        };
        loop {
            let page = store.sealed_page(table, last, PAGE).await?;
            let Some(end) = page.last() else { break };
            last = end.id;
            for row in &page {
                p.read += 1;
                match sealing::resealed(keys, row) {
                    Ok(None) => {}
                    Ok(Some(new)) => {
                        if store.reseal(table, row, &new).await? {
                            p.resealed += 1;
                        } else {
                            p.changed_meanwhile += 1;
                        }
                    }
                    Err(e) => {
                        tracing::error!(table = table.name(), id = row.id, error = %e, "{} {}: not rotated", table.name(), row.id);
                        p.unreadable.push(Unreadable {
                            table: table.name(),
                            column: "",
                            id: row.id,
                            why: e.to_string(),
                        });
                    }
                }
            }
            p.last_id = last;
            progress(&p);
        }
    }
    Ok(p)
}
