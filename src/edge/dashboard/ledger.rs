//! The page's section on the last ledger reconciliation of each consumer
//! (`claimd reconcile --ledger`): shown when one has run.

use crate::ops::ledger::LedgerView;
use maud::{Markup, html};

/// The section; nothing when no consumer was reconciled against its provider's ledger.
pub fn render_ledger(views: &[LedgerView]) -> Markup {
    html! {
        @if !views.is_empty() {
            section {
                h2 { "Ledger (last reconcile --ledger)" }
                table {
                    thead { tr { th { "consumer" } th { "ran" } th { "claims" } th { "objects" } th { "disagreements" } th { "differences" } } }
                    tbody {
                        @for v in views {
                            @let s = &v.summary;
                            tr {
                                td { (v.consumer) }
                                td { (v.ran_utc.format("%Y-%m-%d %H:%M:%SZ")) }
                                td.num { (s.claims) }
                                td.num { (s.objects) }
                                td {
                                    @if s.total() == 0 {
                                        span.ok { "the ledgers match" }
                                    } @else {
                                        span.bad {
                                            @for (kind, n) in s.mismatches.iter().filter(|(_, n)| **n > 0) {
                                                (kind) " " (n) " "
                                            }
                                        }
                                    }
                                }
                                td {
                                    @for d in &s.differences {
                                        (d.tenant) " " (format!("{:+}", d.difference)) " " (d.currency) " "
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
