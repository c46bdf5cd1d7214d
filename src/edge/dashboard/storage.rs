//! The page's "Storage" section (PostgreSQL): claimd's tables with their live and dead rows
//! and sizes, and the oldest transaction holding back vacuum — what `claimd report` prints
//! under "Storage" ([`crate::store::storage_health`]). Shown only when the store reads it.

use crate::store::storage_health::StorageHealth;
use maud::{Markup, html};

/// Bytes as MiB with one decimal.
fn mib(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1_048_576.0)
}

/// The section, or nothing when the store has no reading (SQLite).
pub fn render_storage(storage: Option<&StorageHealth>) -> Markup {
    let Some(s) = storage else {
        return html! {};
    };
    let h = &s.horizon;
    html! {
        section {
            h2 { "Storage" }
            @let horizon = h.describe();
            @if h.held_back() {
                p.bad { (horizon) }
            } @else {
                p { (horizon) }
            }
            table {
                thead { tr {
                    th { "table" } th { "live rows" } th { "dead rows" } th { "table" }
                    th { "indexes" } th { "last vacuum" }
                } }
                tbody {
                    @for t in &s.tables {
                        tr {
                            td { (t.table) }
                            td { (t.live_rows) }
                            @if t.bloated() {
                                td.bad { (t.dead_rows) " (" (format!("{:.0}", t.dead_ratio() * 100.0))
                                    "%: bloated, see docs/operations.md, \"Storage\")" }
                            } @else {
                                td { (t.dead_rows) " (" (format!("{:.0}", t.dead_ratio() * 100.0)) "%)" }
                            }
                            td { (mib(t.table_bytes)) }
                            @match t.index_ratio() {
                                Some(r) if t.indexes_outgrown() => {
                                    td.bad { (mib(t.index_bytes)) " (" (format!("{r:.1}"))
                                        "x a fresh build: run claimd reindex, see docs/operations.md)" }
                                },
                                _ => { td { (mib(t.index_bytes)) } },
                            }
                            td { @match t.vacuumed_s_ago {
                                Some(ago) => { (super::text::human_secs(ago)) " ago" },
                                None => "never",
                            } }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::storage_health::{TableHealth, VacuumHorizon};

    #[test]
    fn a_held_back_vacuum_a_bloated_table_and_outgrown_indexes_are_marked() {
        let s = StorageHealth {
            tables: vec![TableHealth {
                table: "claims".into(),
                live_rows: 1_000,
                dead_rows: 200_000,
                table_bytes: 10 * 1_048_576,
                index_bytes: 30 * 1_048_576,
                index_fresh_bytes: Some(3 * 1_048_576),
                vacuumed_s_ago: None,
            }],
            horizon: VacuumHorizon {
                age_transactions: 5_000,
                oldest_transaction_s: Some(900.0),
                holder: Some("pid 42 (psql, idle in transaction)".into()),
            },
        };
        let page = render_storage(Some(&s)).into_string();
        assert!(page.contains("Storage"), "{page}");
        assert!(page.contains("HELD BACK"), "{page}");
        assert!(page.contains("pid 42"), "{page}");
        assert!(page.contains("bloated"), "{page}");
        assert!(page.contains("10.0 MiB"), "{page}");
        assert!(
            page.contains("30.0 MiB (10.0x a fresh build: run claimd reindex"),
            "{page}"
        );
        assert!(render_storage(None).into_string().is_empty());
    }
}
