//! The ledger run as text: a table per consumer (findings worst first, then totals), or one
//! CSV of findings and totals' differences.

use super::LedgerRun;
use super::matching::{Bucket, ConsumerLedger, Finding};
use crate::domain::table::Table;
use std::fmt::Write as _;

const FINDING_COLUMNS: [&str; 10] = [
    "consumer",
    "kind",
    "key",
    "tenant",
    "message_id",
    "state",
    "objects",
    "store_amount",
    "provider_amount",
    "action",
];

fn amount(a: Option<i64>, currency: &str) -> String {
    a.map(|a| format!("{a} {currency}")).unwrap_or_default()
}

fn finding_row(consumer: &str, f: &Finding) -> Vec<String> {
    let objects: Vec<String> = f
        .object_ids
        .iter()
        .zip(&f.provider_statuses)
        .map(|(id, s)| {
            if s.is_empty() {
                id.clone()
            } else {
                format!("{id} ({s})")
            }
        })
        .collect();
    vec![
        consumer.to_string(),
        f.kind.as_str().to_string(),
        f.key.clone(),
        f.tenant.clone(),
        f.message_id.clone().unwrap_or_default(),
        f.state.clone().unwrap_or_default(),
        objects.join(" "),
        amount(f.store_amount, &f.currency),
        amount(
            f.provider_amount,
            f.provider_currency.as_deref().unwrap_or(&f.currency),
        ),
        f.action.clone(),
    ]
}

const TOTALS_COLUMNS: [&str; 9] = [
    "consumer",
    "tenant",
    "currency",
    "claims",
    "store_amount",
    "objects",
    "provider_amount",
    "difference",
    "made_up_of",
];

fn totals_row(consumer: &str, b: &Bucket) -> Vec<String> {
    let mut items = b.items.join(" ");
    if b.more_items > 0 {
        let _ = write!(items, " (+{} more)", b.more_items);
    }
    vec![
        consumer.to_string(),
        b.tenant.clone(),
        b.currency.clone(),
        b.claims.to_string(),
        b.store_amount.to_string(),
        b.objects.to_string(),
        b.provider_amount.to_string(),
        b.difference.to_string(),
        items,
    ]
}

fn totals_table(totals: &[Bucket]) -> Table {
    let mut t = Table::new(&TOTALS_COLUMNS[1..]);
    for b in totals {
        t.row(totals_row("", b)[1..].to_vec());
    }
    t
}

fn consumer_text(s: &mut String, l: &ConsumerLedger) {
    let c = &l.counts;
    let found: u64 = l.by_kind.values().sum();
    let _ = writeln!(
        s,
        "consumer {}: {} claims, {} provider objects ({} pages; {} without a claimd key), {} keys agree{}, {} disagree{}",
        l.consumer,
        c.claims,
        c.objects,
        c.pages,
        c.without_key,
        c.agreeing,
        if c.refunded > 0 {
            format!(" ({} extra objects refunded in full: settled)", c.refunded)
        } else {
            String::new()
        },
        found,
        if l.by_kind.is_empty() {
            String::new()
        } else {
            let kinds: Vec<String> = l.by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
            format!(" ({})", kinds.join(", "))
        }
    );
    if !l.findings.is_empty() {
        let mut t = Table::new(&FINDING_COLUMNS[1..]);
        for f in &l.findings {
            t.row(finding_row(&l.consumer, f)[1..].to_vec());
        }
        s.push_str(&t.text());
        if l.findings_left_out > 0 {
            let _ = writeln!(
                s,
                "... and {} more findings (narrow the window)",
                l.findings_left_out
            );
        }
    }
    s.push_str("totals (provider minus store):\n");
    s.push_str(&totals_table(&l.totals).text());
}

/// The table output.
pub fn text(run: &LedgerRun) -> String {
    let mut s = format!(
        "ledger reconciliation {} .. {}: {}\n",
        run.from.to_rfc3339(),
        run.to.to_rfc3339(),
        if run.disagrees() {
            "the ledgers disagree"
        } else {
            "the ledgers match"
        }
    );
    for l in &run.consumers {
        s.push('\n');
        consumer_text(&mut s, l);
    }
    for c in &run.skipped_consumers {
        let _ = writeln!(
            s,
            "consumer {c}: no [consumers.effect.ledger]; not reconciled"
        );
    }
    s
}

/// The CSV output: one row per finding, then, after a blank line, the totals per consumer,
/// tenant and currency (as the text lists them after the findings).
pub fn csv(run: &LedgerRun) -> String {
    let mut t = Table::new(&FINDING_COLUMNS);
    let mut totals = Table::new(&TOTALS_COLUMNS);
    for l in &run.consumers {
        for f in &l.findings {
            t.row(finding_row(&l.consumer, f));
        }
        for b in &l.totals {
            totals.row(totals_row(&l.consumer, b));
        }
    }
    let mut out = t.csv();
    out.push('\n');
    out.push_str(&totals.csv());
    out
}

/// The `report` table's section on the last ledger runs (empty when there was none).
pub fn report_section(views: &[super::LedgerView]) -> String {
    if views.is_empty() {
        return String::new();
    }
    let mut t = Table::new(&[
        "consumer",
        "ran_utc",
        "window",
        "claims",
        "objects",
        "double",
        "missing",
        "orphan",
        "amount",
        "currency",
        "status",
        "differences",
    ]);
    for v in views {
        let s = &v.summary;
        let n = |k: &str| s.mismatches.get(k).copied().unwrap_or(0).to_string();
        let differences: Vec<String> = s
            .differences
            .iter()
            .map(|d| {
                let tenant = if d.tenant.is_empty() {
                    String::new()
                } else {
                    format!("{}:", d.tenant)
                };
                format!("{tenant}{:+} {}", d.difference, d.currency)
            })
            .collect();
        t.row(vec![
            v.consumer.clone(),
            v.ran_utc.to_rfc3339(),
            format!("{} .. {}", s.from.to_rfc3339(), s.to.to_rfc3339()),
            s.claims.to_string(),
            s.objects.to_string(),
            n("double"),
            n("missing"),
            n("orphan"),
            n("amount_mismatch"),
            n("currency_mismatch"),
            n("status_mismatch"),
            differences.join(" "),
        ]);
    }
    format!("\nledger (last `claimd reconcile --ledger`):\n{}", t.text())
}
