//! The consumer a command names, checked before it runs: a mistyped name (`paymnts`) is bad
//! usage (exit 2) with the configured names and the closest one, never an empty listing, a
//! clean report or "nothing to do" that a cron check would read as healthy.
//!
//! A consumer taken out of the configuration may still have claims in the store (kept until
//! retention prunes them, parked ones until someone decides): the commands that read claims
//! (`report`, `claims list|show|erase`) and `claims resolve` (so its parked claims can be decided)
//! take such a name with a note on stderr. `claims redrive` (no worker would send it),
//! `reconcile` and `reconcile --ledger` (they need the consumer's provider settings) take only
//! configured consumers.

use super::{ClaimsCommand, Command};
use crate::config::Config;
use crate::store::{ClaimFilter, ClaimStore};

/// What a command does with the consumer it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerUse {
    /// Reads or decides claims already in the store: a consumer no longer configured is
    /// taken while the store has claims of it.
    StoredClaims,
    /// Needs the consumer's configuration (its provider, its sweeper).
    Configured,
}

/// The consumer `command` names and what it does with it; `None` when it names none.
pub fn named_consumer(command: &Command) -> Option<(&str, ConsumerUse)> {
    use ConsumerUse::*;
    match command {
        Command::Report { consumer, .. } => consumer.as_deref().map(|c| (c, StoredClaims)),
        Command::Reconcile { consumer, .. } => consumer.as_deref().map(|c| (c, Configured)),
        Command::Claims { command } => match command {
            ClaimsCommand::List { consumer, .. } => consumer.as_deref().map(|c| (c, StoredClaims)),
            ClaimsCommand::Show { consumer, .. } | ClaimsCommand::Cancel { consumer, .. } => {
                Some((consumer.as_str(), StoredClaims))
            }
            ClaimsCommand::Resolve { consumer, bulk, .. } => consumer
                .as_deref()
                .or(bulk.consumer.as_deref())
                .map(|c| (c, StoredClaims)),
            ClaimsCommand::Redrive { consumer, bulk, .. } => consumer
                .as_deref()
                .or(bulk.consumer.as_deref())
                .map(|c| (c, Configured)),
            ClaimsCommand::Erase { consumer, .. } => consumer.as_deref().map(|c| (c, StoredClaims)),
        },
        _ => None,
    }
}

/// What the check decided about a name that is configured or known to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// A configured consumer.
    Configured,
    /// Not configured, but the store has claims of it: the note to print on stderr.
    OnlyInStore(String),
}

/// Checks `name` against the configuration, then (for [`ConsumerUse::StoredClaims`]) the
/// store. `Err((code, message))`: exit 2 with a message naming the mistake, or 1 when the
/// store could not be read.
pub async fn check_consumer(
    config: &Config,
    store: &dyn ClaimStore,
    name: &str,
    usage: ConsumerUse,
) -> Result<Checked, (i32, String)> {
    let names = config.consumer_names();
    if names.iter().any(|n| n == name) {
        return Ok(Checked::Configured);
    }
    let file = config
        .file
        .as_deref()
        .map(|f| f.display().to_string())
        .unwrap_or_else(|| "the configuration".into());
    if usage == ConsumerUse::StoredClaims {
        let filter = ClaimFilter {
            consumer: Some(name.to_string()),
            limit: 1,
            ..Default::default()
        };
        match store.list(&filter).await {
            Ok(found) if !found.is_empty() => {
                return Ok(Checked::OnlyInStore(format!(
                    "note: no consumer named {name:?} in {file}; showing the claims the store still has of it\n"
                )));
            }
            Ok(_) => {}
            Err(e) => return Err((1, e.to_string())),
        }
    }
    Err((2, unknown_consumer(name, &file, &names)))
}

/// `no consumer named "paymnts" in <file>; consumers: payments, refunds (did you mean
/// "payments"?)`
pub fn unknown_consumer(name: &str, file: &str, names: &[String]) -> String {
    let listed = if names.is_empty() {
        "it configures no consumer".to_string()
    } else {
        format!("consumers: {}", names.join(", "))
    };
    let hint = closest(name, names)
        .map(|c| format!(" (did you mean {c:?}?)"))
        .unwrap_or_default();
    format!("no consumer named {name:?} in {file}; {listed}{hint}")
}

/// The configured name nearest to `name` by edit distance, when it is near enough to be a
/// typo (at most a third of its length, at least one edit).
pub fn closest<'a>(name: &str, names: &'a [String]) -> Option<&'a str> {
    let typed = name.to_lowercase();
    names
        .iter()
        .map(|n| (edit_distance(&typed, &n.to_lowercase()), n))
        .filter(|(d, n)| *d <= (n.chars().count() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n.as_str())
}

/// Levenshtein distance over characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["payments".into(), "refunds".into()]
    }

    #[test]
    fn a_typo_gets_the_nearest_name() {
        assert_eq!(closest("paymnts", &names()), Some("payments"));
        assert_eq!(closest("Refund", &names()), Some("refunds"));
        assert_eq!(closest("emails", &names()), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn the_message_names_the_file_and_the_consumers() {
        assert_eq!(
            unknown_consumer("paymnts", "/etc/claimd.toml", &names()),
            "no consumer named \"paymnts\" in /etc/claimd.toml; consumers: payments, refunds (did you mean \"payments\"?)"
        );
        assert_eq!(
            unknown_consumer("x", "c.toml", &[]),
            "no consumer named \"x\" in c.toml; it configures no consumer"
        );
    }
}
