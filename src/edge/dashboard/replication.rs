//! The page's notice on the store's replication: shown when an acknowledged claim can be lost
//! (PostgreSQL without a synchronous standby, or `synchronous_commit = off`), in the words of
//! the start-up warning (docs/postgresql.md, "Replication: when an acknowledged claim can be
//! lost"). Nothing for SQLite or a synchronous standby.

use crate::store::read_replica::ReadFrom;
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

/// Where the page's figures or search results were read, with a read replica (`[store]
/// read_url`): the replica and its lag (a warning when it is behind or not a standby), or the
/// primary because the replica could not be read. Nothing without a replica.
pub fn render_read_from(from: Option<&ReadFrom>) -> Markup {
    html! {
        @if let Some(from) = from {
            @if let Some(text) = from.notice() {
                @let calm = from.up_to_date();
                p.read-from.note[calm].warn[!calm] { (text) }
            }
        }
    }
}
