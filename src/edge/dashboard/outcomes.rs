//! The page's "Outcome events" section: the relay's backlog per outcome destination of each
//! consumer (shown only when there is one).

use super::text::human_secs;
use crate::ops::report::Report;
use maud::{Markup, html};

/// An unsent event older than this is shown as a problem.
const LATE_S: f64 = 60.0;

/// The section, or nothing when no consumer has an outcome destination.
pub fn render_outcome_events(r: &Report) -> Markup {
    html! {
        @if !r.outcome_events.is_empty() {
            section {
                h2 { "Outcome events" }
                table {
                    thead { tr { th { "consumer" } th { "destination" } th { "unsent" } th { "oldest unsent" } } }
                    tbody {
                        @for b in &r.outcome_events {
                            tr {
                                td { (b.consumer) }
                                td { (b.destination) }
                                td.num { (b.unsent) }
                                @match b.oldest_unsent_age_s {
                                    Some(age) => {
                                        @if age > LATE_S {
                                            td.num.bad { (human_secs(age)) " (relay behind or destination down)" }
                                        } @else {
                                            td.num { (human_secs(age)) }
                                        }
                                    }
                                    None => td.num.ok { "none" },
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
