//! The page's notice on the store's replication: shown when an acknowledged claim can be lost
//! (PostgreSQL without a synchronous standby, or `synchronous_commit = off`), in the words of
//! the start-up warning (docs/postgresql.md, "Replication: when an acknowledged claim can be
//! lost"). Nothing for SQLite or a synchronous standby.

use crate::store::replication::Replication;
use maud::{Markup, html};

/// The notice; nothing when no acknowledged claim can be lost, or nothing was read.
pub fn render_replication(replication: Option<&Replication>) -> Markup {
    html! {
        @if let Some(r) = replication.filter(|r| r.can_lose_acknowledged() || r.unflushed) {
            section {
                h2 { "Replication: " (r.mode.as_str()) }
                p.warn { (r.describe()) }
            }
        }
    }
}
