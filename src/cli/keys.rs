//! `claimd keys status` and `claimd keys rotate` (see [`crate::ops::keys`]).

use super::*;
use crate::ops::keys::{self, KeyStatus, KeysError, RotateProgress};

/// `claimd keys ...`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Count the stored values per key id (reads every row); exit 3 when a value's key is
    /// not among the keys.
    Status {
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Seal again under the active key every value sealed under an older key (or clear), in
    /// small fenced writes, while claimd runs. Safe to stop and run again.
    Rotate {
        /// Start after this claim id (a stopped rotation's last claim id).
        #[arg(long, default_value_t = 0)]
        after: i64,
    },
}

fn failed(app: &App, e: KeysError) -> Output {
    match e {
        KeysError::Off => Output::fail(2, e),
        KeysError::Store(e) => Output::store(app, &e),
    }
}

pub(super) async fn keys_cmd(app: &App, command: KeysCommand) -> Output {
    match command {
        KeysCommand::Status { format } => match keys::status(app.store.as_ref()).await {
            Ok(s) => {
                let code = if s.unreadable_total > 0 { 3 } else { 0 };
                let stdout = match format {
                    Format::Json => to_json(&s),
                    Format::Table => status_table(&s).text(),
                    Format::Csv => status_table(&s).csv(),
                };
                Output {
                    stdout,
                    code,
                    ..Default::default()
                }
            }
            Err(e) => failed(app, e),
        },
        KeysCommand::Rotate { after } => {
            let log = |p: &RotateProgress| {
                tracing::info!(
                    table = p.table,
                    last_id = p.last_id,
                    read = p.read,
                    resealed = p.resealed,
                    changed_meanwhile = p.changed_meanwhile,
                    "keys rotate: {} up to id {}",
                    p.table,
                    p.last_id
                );
            };
            let rotated = keys::rotate(app.store.as_ref(), after, log).await;
            // A rotation, finished or not, is an admin's act: a line of the operator audit.
            if let Ok(who) = super::cli_audit::cli_identity() {
                let (result, detail) = match &rotated {
                    Ok(p) => (
                        crate::ops::audit::AuditResult::Done,
                        format!(
                            "to {:?}: {} read, {} sealed again, {} unreadable",
                            app.config.encryption.active,
                            p.read,
                            p.resealed,
                            p.unreadable.len()
                        ),
                    ),
                    Err(e) => (
                        crate::ops::audit::AuditResult::Refused(e.to_string()),
                        String::new(),
                    ),
                };
                super::cli_audit::record_cli(
                    app,
                    &who,
                    crate::ops::audit::AuditAction::Act(
                        crate::domain::operator_role::Action::RotateKeys,
                    ),
                    "keys",
                    result,
                    &detail,
                )
                .await;
            }
            match rotated {
                Ok(p) => {
                    let mut stdout = format!(
                        "rotated to key {:?}: {} rows read, {} sealed again, {} changed meanwhile (already under the active key)\n",
                        app.config.encryption.active, p.read, p.resealed, p.changed_meanwhile
                    );
                    for u in &p.unreadable {
                        let _ = writeln!(stdout, "not rotated: {} {}: {}", u.table, u.id, u.why);
                    }
                    Output {
                        stdout,
                        code: if p.unreadable.is_empty() { 0 } else { 3 },
                        ..Default::default()
                    }
                }
                Err(e) => failed(app, e),
            }
        }
    }
}

fn status_table(s: &KeyStatus) -> Table {
    let mut t = Table::new(&["column", "key", "values", "note"]);
    for (column, by_key) in &s.counts {
        for (key, n) in by_key {
            let note = if *key == s.active {
                "active"
            } else if key == keys::CLEAR {
                "clear: rotate seals it"
            } else if s.keys.contains(key) {
                "older key: rotate seals it again"
            } else {
                "KEY MISSING: never sent"
            };
            t.row(vec![
                column.clone(),
                key.clone(),
                n.to_string(),
                note.into(),
            ]);
        }
    }
    for u in &s.unreadable {
        t.row(vec![
            format!("{}.{}", u.table, u.column),
            format!("id {}", u.id),
            String::new(),
            u.why.clone(),
        ]);
    }
    t
}
