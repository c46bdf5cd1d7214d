//! The page's "Schedules" section: each configured `[[schedules]]` with its last slot and
//! when the next one comes (shown only when schedules are configured).

use super::text::human_secs;
use crate::domain::periodic::slot_text;
use crate::ops::periodic::{BEHIND_AFTER_S, ScheduleView};
use chrono::{DateTime, Utc};
use maud::{Markup, html};

/// The section, or nothing without schedules. `now`: the page's clock (the database's).
pub fn render_schedules(schedules: &[ScheduleView], now: DateTime<Utc>) -> Markup {
    html! {
        @if !schedules.is_empty() {
            section {
                h2 { "Schedules" }
                table {
                    thead { tr {
                        th { "schedule" } th { "cron (UTC)" } th { "consumer" } th { "catch_up" }
                        th { "last slot" } th { "next slot" }
                    } }
                    tbody {
                        @for s in schedules {
                            tr {
                                td { (s.name) }
                                td { code { (s.cron) } }
                                td { (s.consumer) @if !s.tenant.is_empty() { " (" (s.tenant) ")" } }
                                td { (s.catch_up) }
                                @match s.last_slot_utc {
                                    Some(last) if s.behind => td.bad {
                                        (slot_text(last)) " (behind: a later slot is more than "
                                        (BEHIND_AFTER_S) "s late; is any instance running?)"
                                    },
                                    Some(last) => td { (slot_text(last)) },
                                    None => td { "not run yet" },
                                }
                                @match s.next_slot_utc {
                                    Some(next) => td {
                                        (slot_text(next)) " (in "
                                        (human_secs((next - now).num_milliseconds().max(0) as f64 / 1000.0)) ")"
                                    },
                                    None => td { "none" },
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
