//! Rebuilding claimd's bloated indexes on PostgreSQL (`claimd reindex`). Every settle of a
//! claim writes a new entry into each of its indexes; vacuum removes the old ones, and a
//! B-tree page vacuum empties is reused but never handed back. After a burst of churn (a
//! transaction that held back vacuum for ten minutes at a thousand settles a second) the
//! indexes of `claims` stay many times the size of its live rows until they are rebuilt.
//! `REINDEX INDEX CONCURRENTLY` rebuilds one without stopping intake. Pure: what to rebuild
//! and why; the reading and the rebuild are the driver's ([`crate::store::postgres`]).

use serde::Serialize;

/// The tables whose indexes `claimd reindex` looks at: those every claim's life writes to.
pub const TABLES: &[&str] = &[
    "claims",
    "claim_events",
    "outcome_events",
    "provider_events",
];

/// Bytes of one B-tree page.
const PAGE: f64 = 8192.0;
/// The share of a leaf page a fresh build fills (B-tree's default `fillfactor`, 90), less the
/// page header and special space.
const LEAF_FILL: f64 = 0.9 * (8192.0 - 40.0) / 8192.0;
/// Bytes of an index entry besides its key: the tuple header (8) and its line pointer (4).
const ENTRY_OVERHEAD: f64 = 12.0;

/// One index as PostgreSQL reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexReading {
    /// The table it indexes.
    pub table: String,
    /// Its name.
    pub index: String,
    /// Its bytes on disk.
    pub bytes: i64,
    /// Its entries at the last vacuum or build (`pg_class.reltuples`); `None`: never counted.
    pub entries: Option<i64>,
    /// The average width of its key in bytes, from the columns' statistics; `None`: a column
    /// was never analysed.
    pub key_width: Option<f64>,
}

impl IndexReading {
    /// The bytes a fresh build of it would take, from its entries and their width; `None`
    /// when either is unknown. An index of repeated keys is smaller still (PostgreSQL stores a
    /// repeated key once), so this errs towards calling an index smaller than it is.
    pub fn fresh_bytes(&self) -> Option<i64> {
        let entries = self.entries?;
        // An empty index needs no widths: its metapage and an empty root.
        let width = if entries == 0 { 0.0 } else { self.key_width? };
        let entry = ENTRY_OVERHEAD + (width / 8.0).ceil() * 8.0;
        let leaves = (entries as f64 * entry / (PAGE * LEAF_FILL)).ceil();
        // The metapage and the root, and one inner page per 256 leaves or so.
        Some(((leaves + 2.0 + leaves / 256.0) * PAGE) as i64)
    }

    /// Its size against a fresh build's; `None` when that is unknown.
    pub fn bloat(&self) -> Option<f64> {
        self.fresh_bytes()
            .map(|f| self.bytes as f64 / f.max(1) as f64)
    }
}

/// What `claimd reindex` rebuilds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RebuildChoice {
    /// Rebuild an index at least this many times its fresh size.
    pub over: f64,
    /// Never rebuild one smaller than this: a small index costs nothing to keep.
    pub min_bytes: i64,
    /// Rebuild every index at least `min_bytes` big, whatever its estimate (also one whose
    /// estimate is unknown).
    pub all: bool,
}

impl Default for RebuildChoice {
    fn default() -> Self {
        RebuildChoice {
            over: super::storage_health::OUTGROWN_RATIO,
            min_bytes: super::storage_health::OUTGROWN_MIN_BYTES,
            all: false,
        }
    }
}

/// Why an index is or is not rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Bigger than `over` times its fresh size (or `all` was asked).
    Rebuild,
    /// Smaller than `min_bytes`.
    Small,
    /// Within `over` times its fresh size.
    Compact,
    /// Its size against a fresh build is not known (never vacuumed or analysed): run
    /// `ANALYZE`, or ask for `--all`.
    Unknown,
}

/// The verdict on one index.
pub fn verdict(r: &IndexReading, choice: &RebuildChoice) -> Verdict {
    if r.bytes < choice.min_bytes {
        return Verdict::Small;
    }
    if choice.all {
        return Verdict::Rebuild;
    }
    match r.bloat() {
        None => Verdict::Unknown,
        Some(b) if b >= choice.over => Verdict::Rebuild,
        Some(_) => Verdict::Compact,
    }
}

/// One index after `claimd reindex`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexOutcome {
    /// The index as it was read before.
    #[serde(flatten)]
    pub reading: IndexReading,
    /// Its size against a fresh build's, as read before.
    pub bloat: Option<f64>,
    /// What was decided.
    pub verdict: Verdict,
    /// Its bytes after the rebuild; `None`: not rebuilt (or a dry run).
    pub bytes_after: Option<i64>,
    /// How long the rebuild took.
    pub seconds: Option<f64>,
    /// Why the rebuild failed (the index is left as it was).
    pub error: Option<String>,
}

/// What `claimd reindex` found and did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reindexed {
    /// Each index looked at, biggest first.
    pub indexes: Vec<IndexOutcome>,
    /// The invalid copies a cut rebuild had left (`<index>_ccnew`): dropped first, and again
    /// after a rebuild of this run failed; in a dry run, those that would be.
    pub leftovers: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(bytes: i64, entries: Option<i64>, width: Option<f64>) -> IndexReading {
        IndexReading {
            table: "claims".into(),
            index: "claims_received".into(),
            bytes,
            entries,
            key_width: width,
        }
    }

    #[test]
    fn a_fresh_index_of_eight_byte_keys_is_about_twenty_bytes_an_entry() {
        let r = reading(0, Some(1_000_000), Some(8.0));
        let fresh = r.fresh_bytes().unwrap() as f64;
        // 20 bytes an entry at 90 % fill: about 22.5 MB.
        assert!((21.5e6..24.0e6).contains(&fresh), "{fresh}");
    }

    #[test]
    fn an_index_nine_times_its_fresh_size_is_rebuilt_and_one_near_it_kept() {
        let fresh = reading(0, Some(100_000), Some(40.0)).fresh_bytes().unwrap();
        let choice = RebuildChoice::default();
        let big = reading(fresh * 9, Some(100_000), Some(40.0));
        assert_eq!(verdict(&big, &choice), Verdict::Rebuild);
        assert!((8.9..9.1).contains(&big.bloat().unwrap()));
        let near = reading(fresh * 3 / 2, Some(100_000), Some(40.0));
        let near = IndexReading {
            bytes: near.bytes.max(choice.min_bytes),
            ..near
        };
        assert_eq!(
            verdict(
                &near,
                &RebuildChoice {
                    over: 20.0,
                    ..choice
                }
            ),
            Verdict::Compact
        );
    }

    #[test]
    fn a_small_index_is_left_and_an_unknown_one_said_so_unless_all_is_asked() {
        let choice = RebuildChoice::default();
        assert_eq!(
            verdict(&reading(1 << 20, Some(10), Some(8.0)), &choice),
            Verdict::Small
        );
        let unknown = reading(64 << 20, None, Some(8.0));
        assert_eq!(verdict(&unknown, &choice), Verdict::Unknown);
        let all = RebuildChoice {
            all: true,
            ..choice
        };
        assert_eq!(verdict(&unknown, &all), Verdict::Rebuild);
        assert_eq!(verdict(&reading(1 << 20, None, None), &all), Verdict::Small);
    }
}
