//! How claimd's tables are doing on PostgreSQL: their live and dead rows, table and index
//! sizes, and the oldest transaction holding back vacuum ([`StorageHealth`]), read at each
//! `/metrics` scrape and by `claimd report`. A transaction left open (an idle session in a
//! transaction, a forgotten `BEGIN` in psql, a stuck replication slot) stops vacuum from
//! removing any row deleted after it started: dead rows pile up in `claims` and every take
//! reads past them. Pure: the reading is the store's.

/// Dead rows over live ones above which a table is called bloated (with at least
/// [`BLOATED_MIN_DEAD`] dead rows): vacuum normally keeps them near 0.2.
pub const BLOATED_RATIO: f64 = 0.5;

/// The fewest dead rows for a table to be called bloated: a small table's ratio means little.
pub const BLOATED_MIN_DEAD: i64 = 100_000;

/// How long a transaction may hold back vacuum before it is worth a person's look: the alert
/// `ClaimdVacuumHeldBack` (docs/alerts.yml) fires at the same age, two minutes on. At a
/// thousand settles a second, five minutes already leave 300,000 dead rows in `claims` that
/// every take walks past.
pub const HELD_BACK_AFTER_S: f64 = 300.0;

/// Index bytes below which indexes are never called outgrown ([`TableHealth::indexes_outgrown`];
/// `claimd reindex --min-mib`'s default): a small index costs nothing to keep.
pub const OUTGROWN_MIN_BYTES: i64 = 8 << 20;

/// Index size over a fresh build's at which indexes are called outgrown (`claimd reindex
/// --over`'s default).
pub const OUTGROWN_RATIO: f64 = 2.0;

/// One table of claimd's.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct TableHealth {
    /// The table's name.
    pub table: String,
    /// Live rows (the statistics collector's estimate).
    pub live_rows: i64,
    /// Dead rows not yet vacuumed.
    pub dead_rows: i64,
    /// The table's bytes on disk (TOAST included, indexes not).
    pub table_bytes: i64,
    /// Its indexes' bytes.
    pub index_bytes: i64,
    /// What a fresh build of its indexes would take, estimated from their entries and the
    /// width of their columns (`claimd reindex`'s estimate); `None`: not known (a table
    /// never vacuumed or analysed, or one `claimd reindex` does not rebuild).
    pub index_fresh_bytes: Option<i64>,
    /// Seconds since it was last vacuumed (by autovacuum or by hand); `None`: never.
    pub vacuumed_s_ago: Option<f64>,
}

impl TableHealth {
    /// Dead rows per live row.
    pub fn dead_ratio(&self) -> f64 {
        self.dead_rows as f64 / (self.live_rows.max(1)) as f64
    }

    /// Whether dead rows outnumber what vacuum normally leaves.
    pub fn bloated(&self) -> bool {
        self.dead_rows >= BLOATED_MIN_DEAD && self.dead_ratio() > BLOATED_RATIO
    }

    /// Its indexes against what a fresh build would take; `None` when that is unknown.
    pub fn index_ratio(&self) -> Option<f64> {
        self.index_fresh_bytes
            .map(|f| self.index_bytes as f64 / f.max(1) as f64)
    }

    /// Whether its indexes grew to [`OUTGROWN_RATIO`] times what they need (and at least
    /// [`OUTGROWN_MIN_BYTES`]): vacuum never shrinks them; `claimd reindex` does.
    pub fn indexes_outgrown(&self) -> bool {
        self.index_bytes >= OUTGROWN_MIN_BYTES
            && self.index_ratio().is_some_and(|r| r >= OUTGROWN_RATIO)
    }
}

/// The oldest transaction in claimd's database that holds back vacuum.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct VacuumHorizon {
    /// How old the oldest snapshot is, in transactions (`age(backend_xmin)`, a replication
    /// slot's `xmin`, a prepared transaction).
    pub age_transactions: i64,
    /// How long the oldest open transaction of a session has run, in seconds; `None` when
    /// none is open or its start cannot be seen.
    pub oldest_transaction_s: Option<f64>,
    /// Who holds it, as PostgreSQL shows it: `pid 4242 (psql, idle in transaction)`, a
    /// replication slot or a prepared transaction.
    pub holder: Option<String>,
}

impl VacuumHorizon {
    /// One line for `claimd report` and the page: who holds vacuum back, and what to do when
    /// it has for too long.
    pub fn describe(&self) -> String {
        match (&self.holder, self.oldest_transaction_s) {
            (Some(holder), Some(s)) if self.held_back() => format!(
                "vacuum HELD BACK for {s:.0} s by {holder}: end that transaction (docs/operations.md, \"Storage\")"
            ),
            (Some(holder), Some(s)) => {
                format!("oldest open transaction: {s:.0} s ({holder}); vacuum is not held back")
            }
            (Some(holder), None) => format!(
                "oldest snapshot {} transactions old, held by {holder}",
                self.age_transactions
            ),
            _ => "no open transaction holds back vacuum".to_string(),
        }
    }

    /// Whether a transaction has held vacuum back for longer than [`HELD_BACK_AFTER_S`].
    pub fn held_back(&self) -> bool {
        self.oldest_transaction_s
            .is_some_and(|s| s > HELD_BACK_AFTER_S)
    }
}

/// One reading of the store's tables.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct StorageHealth {
    /// claimd's tables, largest first.
    pub tables: Vec<TableHealth>,
    /// What holds back vacuum.
    pub horizon: VacuumHorizon,
}

impl StorageHealth {
    /// Lines for `claimd report`: one per table, then the horizon, with what to do when
    /// something is wrong.
    pub fn describe(&self) -> Vec<String> {
        let mib = |b: i64| b as f64 / 1_048_576.0;
        let mut out: Vec<String> = self
            .tables
            .iter()
            .map(|t| {
                format!(
                    "{}: {} live rows, {} dead ({:.0}%), table {:.1} MiB, indexes {:.1} MiB{}{}",
                    t.table,
                    t.live_rows,
                    t.dead_rows,
                    t.dead_ratio() * 100.0,
                    mib(t.table_bytes),
                    mib(t.index_bytes),
                    if t.bloated() {
                        "  BLOATED: see docs/operations.md, \"Storage\""
                    } else {
                        ""
                    },
                    match t.index_ratio() {
                        Some(r) if t.indexes_outgrown() => format!(
                            "  INDEXES {r:.1}x a fresh build: run `claimd reindex` as the owner \
                             (docs/operations.md, \"Indexes that outgrew their rows\")"
                        ),
                        _ => String::new(),
                    }
                )
            })
            .collect();
        out.push(self.horizon.describe());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bloat_and_a_held_back_vacuum_are_named_with_what_to_do() {
        let t = |dead: i64, live: i64| TableHealth {
            table: "claims".into(),
            live_rows: live,
            dead_rows: dead,
            table_bytes: 10 * 1_048_576,
            index_bytes: 5 * 1_048_576,
            index_fresh_bytes: Some(4 * 1_048_576),
            vacuumed_s_ago: None,
        };
        assert!(!t(50_000, 10_000).bloated(), "few dead rows: a small table");
        assert!(!t(200_000, 1_000_000).bloated());
        assert!(t(600_000, 1_000_000).bloated());
        let health = StorageHealth {
            tables: vec![t(600_000, 1_000_000)],
            horizon: VacuumHorizon {
                age_transactions: 90_000,
                oldest_transaction_s: Some(700.0),
                holder: Some("pid 42 (psql, idle in transaction)".into()),
            },
        };
        let lines = health.describe();
        assert!(lines[0].contains("600000 dead (60%)"), "{lines:?}");
        assert!(lines[0].contains("BLOATED"), "{lines:?}");
        assert!(
            lines[1]
                .starts_with("vacuum HELD BACK for 700 s by pid 42 (psql, idle in transaction)"),
            "{lines:?}"
        );
        assert!(!lines[0].contains("INDEXES"), "{lines:?}");
        let outgrown = TableHealth {
            index_bytes: 90 * 1_048_576,
            index_fresh_bytes: Some(10 * 1_048_576),
            ..t(10, 1_000)
        };
        assert!(outgrown.indexes_outgrown());
        let line = &StorageHealth {
            tables: vec![outgrown.clone()],
            ..Default::default()
        }
        .describe()[0];
        assert!(
            line.contains("INDEXES 9.0x a fresh build: run `claimd reindex`"),
            "{line}"
        );
        let small = TableHealth {
            index_bytes: 4 * 1_048_576,
            index_fresh_bytes: Some(1_048_576 / 4),
            ..outgrown.clone()
        };
        assert!(!small.indexes_outgrown(), "small indexes are left alone");
        let unknown = TableHealth {
            index_fresh_bytes: None,
            ..outgrown
        };
        assert!(!unknown.indexes_outgrown());
        let quiet = StorageHealth::default().describe();
        assert_eq!(quiet, vec!["no open transaction holds back vacuum"]);
    }
}
