//! `claimd reindex`: rebuilds the bloated indexes of claimd's churned tables on PostgreSQL
//! with `REINDEX INDEX CONCURRENTLY`, as the tables' owner ([`crate::store::index_rebuild`];
//! docs/operations.md, "Indexes that outgrew their rows").

use super::{Format, Output};
use crate::domain::table::Table;
use crate::service::app::App;
use crate::store::index_rebuild::{RebuildChoice, Reindexed, Verdict};

/// Runs `claimd reindex`.
pub(super) async fn reindex_cmd(
    app: &App,
    choice: RebuildChoice,
    dry_run: bool,
    format: Format,
) -> Output {
    let done = match app.store.rebuild_indexes(&choice, dry_run).await {
        Ok(Some(done)) => done,
        Ok(None) => {
            return Output::ok(
                "SQLite: nothing to rebuild (pages a delete frees are reused; `VACUUM` \
                 compacts the file)\n"
                    .into(),
            );
        }
        Err(e) => return Output::store(app, &e),
    };
    let failed = done.indexes.iter().filter(|i| i.error.is_some()).count();
    let mut out = match format {
        Format::Json => Output::ok(super::to_json(&done)),
        Format::Csv => Output::ok(table(&done, dry_run).csv()),
        Format::Table => Output::ok(summary(&done, dry_run)),
    };
    if failed > 0 {
        out.code = 1;
        out.stderr = format!("{failed} index(es) could not be rebuilt: see the table\n");
    }
    out
}

fn mib(bytes: i64) -> String {
    format!("{:.1}", bytes as f64 / (1 << 20) as f64)
}

fn table(done: &Reindexed, dry_run: bool) -> Table {
    let mut t = Table::new(&[
        "index",
        "table",
        "MiB",
        "entries",
        "fresh_MiB",
        "x_fresh",
        "action",
    ]);
    for i in &done.indexes {
        let r = &i.reading;
        let action = match (i.verdict, &i.error, i.bytes_after) {
            (Verdict::Rebuild, Some(e), _) => format!("FAILED: {e}"),
            (Verdict::Rebuild, None, Some(after)) => format!(
                "rebuilt: {} MiB in {:.1} s",
                mib(after),
                i.seconds.unwrap_or(0.0)
            ),
            (Verdict::Rebuild, None, None) if dry_run => "would rebuild".into(),
            (Verdict::Rebuild, None, None) => "rebuilt".into(),
            (Verdict::Small, ..) => "kept: small".into(),
            (Verdict::Compact, ..) => "kept".into(),
            (Verdict::Unknown, ..) => "kept: fresh size unknown (ANALYZE, or --all)".into(),
        };
        t.row(vec![
            r.index.clone(),
            r.table.clone(),
            mib(r.bytes),
            r.entries.map_or("-".into(), |n| n.to_string()),
            r.fresh_bytes().map_or("-".into(), mib),
            i.bloat.map_or("-".into(), |b| format!("{b:.1}")),
            action,
        ]);
    }
    t
}

fn summary(done: &Reindexed, dry_run: bool) -> String {
    let mut s = String::new();
    for name in &done.leftovers {
        let did = if dry_run { "would drop" } else { "dropped" };
        s.push_str(&format!(
            "{did} {name}: an invalid copy a cut rebuild had left\n"
        ));
    }
    s.push_str(&table(done, dry_run).text());
    let chosen: Vec<_> = done
        .indexes
        .iter()
        .filter(|i| i.verdict == Verdict::Rebuild)
        .collect();
    let before: i64 = chosen.iter().map(|i| i.reading.bytes).sum();
    if chosen.is_empty() {
        s.push_str("nothing to rebuild\n");
    } else if dry_run {
        s.push_str(&format!(
            "{} index(es), {} MiB, would be rebuilt (nothing was changed)\n",
            chosen.len(),
            mib(before)
        ));
    } else {
        let after: i64 = chosen
            .iter()
            .map(|i| i.bytes_after.unwrap_or(i.reading.bytes))
            .sum();
        s.push_str(&format!(
            "{} index(es) rebuilt: {} MiB -> {} MiB\n",
            chosen.len(),
            mib(before),
            mib(after)
        ));
    }
    s
}
