//! Where the store seals and opens what a claim carries (see
//! [`sealed`](crate::domain::sealed)): the process's one [`Keyring`], installed at start when
//! `[encryption]` is on. Every write of a payload, a provider answer, an error or an outcome
//! event's body binds it through [`seal_bytes`] or [`seal_text`] (`Arg::SealedBytes`,
//! `Arg::SealedText`), and every read opens it. Without a keyring both are the identity, so a
//! store written before encryption was turned on, and every instance with it off, read as
//! before.
//!
//! A value that cannot be opened (its key was retired) is read as it is stored, still sealed:
//! the engine refuses to send a claim whose payload [`is_sealed`](crate::domain::sealed::is_sealed)
//! and parks it instead, and [`unreadable`] counts such reads.

use crate::domain::sealed::{Keyring, SealError};
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

static KEYRING: OnceLock<Arc<Keyring>> = OnceLock::new();
static UNREADABLE: AtomicU64 = AtomicU64::new(0);

/// Installs the process's keyring (at start, once). A second call with other keys is
/// refused: one process seals with one keyring.
pub fn install(keys: Arc<Keyring>) -> Result<(), String> {
    let installed = KEYRING.get_or_init(|| keys.clone());
    if Arc::ptr_eq(installed, &keys) || format!("{installed:?}") == format!("{keys:?}") {
        Ok(())
    } else {
        Err(format!(
            "this process already seals with other keys ({installed:?})"
        ))
    }
}

/// The installed keyring, when encryption is on.
pub fn keyring() -> Option<&'static Keyring> {
    KEYRING.get().map(Arc::as_ref)
}

/// Reads of a sealed value whose key is missing or that did not open, since start.
pub fn unreadable() -> u64 {
    UNREADABLE.load(Ordering::Relaxed)
}

/// `plain` as it is stored: sealed when encryption is on.
pub fn seal_bytes(plain: &[u8]) -> Cow<'_, [u8]> {
    match keyring() {
        Some(k) => Cow::Owned(k.seal(plain)),
        None => Cow::Borrowed(plain),
    }
}

/// `plain` text as it is stored: sealed when encryption is on.
pub fn seal_text(plain: Option<&str>) -> Option<Cow<'_, str>> {
    plain.map(|p| match keyring() {
        Some(k) => Cow::Owned(k.seal_text(p)),
        None => Cow::Borrowed(p),
    })
}

/// The fingerprint of `payload` this instance writes: keyed when encryption is on, plain
/// otherwise.
pub fn fingerprint(payload: &[u8]) -> String {
    match keyring() {
        Some(k) => k.fingerprint(payload),
        None => crate::domain::claim::fingerprint(payload),
    }
}

/// Whether `payload` is what a stored fingerprint (plain or keyed) was taken of.
pub fn fingerprint_matches(stored: &str, payload: &[u8]) -> bool {
    crate::domain::sealed::fingerprint_matches(keyring(), stored, payload)
}

/// A stored value opened; one that does not open is kept as stored (still sealed), logged
/// naming `what` (a claim, an event), and counted.
pub fn open_bytes(stored: Vec<u8>, what: &dyn Fn() -> String) -> Vec<u8> {
    if !crate::domain::sealed::is_sealed(&stored) {
        return stored;
    }
    let opened = match keyring() {
        Some(k) => k.open(&stored),
        None => Err(SealError::MissingKey(
            crate::domain::sealed::key_id(&stored)
                .unwrap_or_default()
                .to_string(),
        )),
    };
    match opened {
        Ok(plain) => plain,
        Err(e) => {
            unopened(&e, what);
            stored
        }
    }
}

/// A stored text value opened (see [`open_bytes`]).
pub fn open_text(stored: Option<String>, what: &dyn Fn() -> String) -> Option<String> {
    let stored = stored?;
    if !crate::domain::sealed::is_sealed(stored.as_bytes()) {
        return Some(stored);
    }
    let plain = open_bytes(stored.into_bytes(), what);
    Some(
        String::from_utf8(plain)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    )
}

fn unopened(e: &SealError, what: &dyn Fn() -> String) {
    UNREADABLE.fetch_add(1, Ordering::Relaxed);
    tracing::error!(error = %e, "{}: a sealed value does not open; it is never sent", what());
}

/// The statements that read the sealed columns as stored and write them back, fenced, in one
/// dialect (`claimd keys`, and sealing a claim the SQL enqueue path wrote in clear).
/// Parameters are documented on each field.
#[derive(Debug)]
pub struct SealStatements {
    /// `id, version, payload, provider_response, last_error` of claims with id over `1`,
    /// by id, at most `2`.
    pub claims_page: &'static str,
    /// The same columns of claim `1`.
    pub claim_one: &'static str,
    /// Claim `1` gets payload `2`, answer `3`, error `4`, only while its version is `5` and
    /// its columns still hold `6`, `7`, `8` (what was read): a write since wins.
    pub reseal_claim: &'static str,
    /// `id, provider_response, reason, last_error` of outcome events with id over `1`, at
    /// most `2`.
    pub outcome_events_page: &'static str,
    /// Event `1` gets answer `2`, reason `3`, error `4`, only while it holds `5`, `6`, `7`.
    pub reseal_outcome_event: &'static str,
    /// `id, detail` of history lines with id over `1`, at most `2`.
    pub claim_events_page: &'static str,
    /// History line `1` gets detail `2`, only while it holds `3`.
    pub reseal_claim_event: &'static str,
}

/// A table with sealed columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SealedTable {
    /// `claims`: payload, provider_response, last_error.
    Claims,
    /// `outcome_events`: provider_response, reason, last_error.
    OutcomeEvents,
    /// `claim_events`: detail.
    ClaimEvents,
}

impl SealedTable {
    /// Every table, in the order `claimd keys` goes through them.
    pub const ALL: [SealedTable; 3] = [
        SealedTable::Claims,
        SealedTable::OutcomeEvents,
        SealedTable::ClaimEvents,
    ];

    /// The table's name.
    pub fn name(self) -> &'static str {
        match self {
            SealedTable::Claims => "claims",
            SealedTable::OutcomeEvents => "outcome_events",
            SealedTable::ClaimEvents => "claim_events",
        }
    }

    /// Its sealed columns, in the order of [`SealedRow::values`].
    pub fn columns(self) -> &'static [&'static str] {
        match self {
            SealedTable::Claims => &["payload", "provider_response", "last_error"],
            SealedTable::OutcomeEvents => &["provider_response", "reason", "last_error"],
            SealedTable::ClaimEvents => &["detail"],
        }
    }
}

/// One row's sealed columns, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedRow {
    /// The row's id.
    pub id: i64,
    /// The claim's version (claims only; 0 elsewhere).
    pub version: i64,
    /// The columns of [`SealedTable::columns`], in order; `None` for NULL. A claim's payload
    /// is never NULL (an erased one is empty).
    pub values: Vec<Option<Vec<u8>>>,
}

/// `row` with every value that is clear (not empty) or sealed under another key sealed under
/// the active one; `None` when nothing needs it. A value whose key is missing (or that does
/// not open) is an error naming its key: the row is left as it is.
pub fn resealed(keys: &Keyring, row: &SealedRow) -> Result<Option<SealedRow>, SealError> {
    let mut changed = false;
    let mut values = Vec::with_capacity(row.values.len());
    for v in &row.values {
        values.push(match v {
            Some(stored) if keys.needs_reseal(stored) => {
                changed = true;
                Some(keys.seal(&keys.open(stored)?))
            }
            other => other.clone(),
        });
    }
    Ok(changed.then_some(SealedRow {
        id: row.id,
        version: row.version,
        values,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &str = "k1=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n\
                        k2=HyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4=\n\
                        fp=QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=";

    #[test]
    fn a_row_is_sealed_again_under_the_active_key_keeping_erased_and_null_values() {
        let old = Keyring::new(KEYS, "k1", "fp").expect("keys");
        let new = Keyring::new(KEYS, "k2", "fp").expect("keys");
        let row = SealedRow {
            id: 7,
            version: 3,
            values: vec![
                Some(old.seal(b"{\"card\":\"tok\"}")),
                None,
                Some(b"timeout".to_vec()),
            ],
        };
        let again = resealed(&new, &row).expect("opens").expect("changed");
        assert_eq!((again.id, again.version), (7, 3));
        let payload = again.values[0].as_deref().expect("payload");
        assert_eq!(crate::domain::sealed::key_id(payload), Some("k2"));
        assert_eq!(new.open(payload).expect("opens"), b"{\"card\":\"tok\"}");
        assert_eq!(again.values[1], None);
        let error = again.values[2].as_deref().expect("error");
        assert_eq!(
            new.open(error).expect("opens"),
            b"timeout",
            "a clear value is sealed"
        );
        assert_eq!(resealed(&new, &again), Ok(None), "nothing left to do");
        let erased = SealedRow {
            values: vec![Some(Vec::new()), None, None],
            ..row.clone()
        };
        assert_eq!(
            resealed(&new, &erased),
            Ok(None),
            "an erased row stays erased"
        );
        let retired = Keyring::new(&KEYS.replace("k1=", "k3="), "k2", "fp").expect("keys");
        assert_eq!(
            resealed(&retired, &row),
            Err(SealError::MissingKey("k1".into()))
        );
    }
}
