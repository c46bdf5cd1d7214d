//! `claimd migrate --plan`: the pending migrations and what each will lock, changing
//! nothing. Exits 3 when one would hold a lock that stops intake while it reads a table's
//! rows (an index build without `CONCURRENTLY`, a rewrite): build that by hand first
//! (docs/operations.md, "A rolling upgrade").

use super::{Format, Output};
use crate::store::pending_migrations::{self, PendingMigration};
use std::fmt::Write;

/// Lists the pending migrations of the store at `url`.
pub(super) async fn show(url: &str, format: Format) -> Output {
    let plan = match pending_migrations::pending(url).await {
        Ok(p) => p,
        Err(e) => return Output::fail(1, e),
    };
    let stops_intake = plan.iter().flat_map(|m| &m.held).any(|h| h.stops_intake());
    let mut out = match format {
        Format::Json => Output::ok(
            serde_json::to_string_pretty(&serde_json::json!({
                "pending": plan,
                "stops_intake_while_reading_rows": stops_intake,
            }))
            .unwrap_or_default()
                + "\n",
        ),
        Format::Table | Format::Csv => Output::ok(table(&plan)),
    };
    if stops_intake {
        out.code = 3;
    }
    out
}

fn table(plan: &[PendingMigration]) -> String {
    if plan.is_empty() {
        return "no migration pending: the store is up to date\n".into();
    }
    let mut s = format!(
        "{} migration(s) pending (nothing was changed; `claimd migrate` applies them):\n",
        plan.len()
    );
    for m in plan {
        let how = if m.outside_a_transaction {
            "outside a transaction: each lock ends with its statement"
        } else {
            "in one transaction: every lock is held until it commits"
        };
        let _ = writeln!(s, "\n{:04} {} ({how})", m.version, m.description);
        if m.held.is_empty() && m.statements.is_empty() {
            let _ = writeln!(
                s,
                "  SQLite: the database's one write lock for as long as it runs"
            );
        } else if m.held.is_empty() {
            let _ = writeln!(s, "  locks no existing table (catalog changes only)");
        }
        for h in &m.held {
            let rows = h
                .rows
                .map_or("rows unknown".to_string(), |n| format!("~{n} rows"));
            let effect = match (h.blocks_writes, h.while_rows_are_read) {
                (true, true) if !h.stops_intake() => "empty: stops nothing",
                (true, true) => "STOPS INTAKE while it reads every row",
                (true, false) => "stops intake for a moment",
                (false, true) => "intake goes on while it reads every row",
                (false, false) => "intake goes on",
            };
            let _ = writeln!(
                s,
                "  {:<22} {:<22} {rows:<16} {effect}",
                h.table,
                h.lock.name()
            );
        }
        for st in m.statements.iter().filter(|st| st.unclassified) {
            let _ = writeln!(s, "  not recognised, read it: {}", st.statement);
        }
    }
    s
}
