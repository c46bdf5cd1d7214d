//! `claimd operators add|list|disable|set-role` and `claimd audit`: operator accounts and the
//! operator audit from the command line. Whoever runs these holds the store's credentials, so
//! they act as an admin; each account change is a line of the audit, by the operator the
//! command line names (`CLAIMD_OPERATOR` or `USER`) from `cli:<OS user>`.

use super::cli_audit::cli_identity;
use super::{App, Format, Output};
use crate::domain::operator_role::Role;
use crate::domain::table::Table;
use crate::ops::accounts::{self, AccountError};
use crate::ops::audit::{self, AuditAction, AuditQuery, AuditResult, Origin, Record};
use clap::{Subcommand, ValueEnum};
use std::io::BufRead;

/// `claimd operators ...`
#[derive(Debug, Subcommand)]
pub enum OperatorsCommand {
    /// Add an account; prints its credential once (only a hash is kept).
    Add {
        /// The person's name: 1-64 letters, digits or ._@-
        name: String,
        /// What they may do.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// Read the credential from the first line of stdin instead of generating one (at
        /// least 16 characters).
        #[arg(long)]
        credential_stdin: bool,
    },
    /// List the accounts.
    List {
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Disable an account: it signs in no more, and its sessions end at their next request.
    Disable {
        /// The account's name.
        name: String,
    },
    /// Change an account's role (in effect from its next request).
    SetRole {
        /// The account's name.
        name: String,
        /// The new role.
        #[arg(value_enum)]
        role: RoleArg,
    },
}

/// A role on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    /// Reads only.
    Viewer,
    /// Also resolves, redrives and cancels.
    Operator,
    /// Everything.
    Admin,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Role {
        match r {
            RoleArg::Viewer => Role::Viewer,
            RoleArg::Operator => Role::Operator,
            RoleArg::Admin => Role::Admin,
        }
    }
}

fn failed(app: &App, e: AccountError) -> Output {
    match e {
        AccountError::Store(e) => Output::store(app, &e),
        e => Output::fail(2, e),
    }
}

/// Runs `claimd operators ...`.
pub(super) async fn operators(app: &App, command: OperatorsCommand) -> Output {
    let store = app.store.as_ref();
    if let OperatorsCommand::List { format } = command {
        return match accounts::list(store).await {
            Ok(list) if format == Format::Json => Output::ok(format!(
                "{}\n",
                serde_json::to_string_pretty(&list).unwrap_or_default()
            )),
            Ok(list) => {
                let mut t = Table::new(&["name", "role", "created_utc", "disabled_utc"]);
                for a in &list {
                    t.row(vec![
                        a.name.clone(),
                        a.role.to_string(),
                        super::claims::time_or_dash(Some(a.created_utc)),
                        super::claims::time_or_dash(a.disabled_utc),
                    ]);
                }
                Output::ok(if format == Format::Csv {
                    t.csv()
                } else {
                    t.text()
                })
            }
            Err(e) => failed(app, e),
        };
    }
    let who = match cli_identity() {
        Ok(w) => w,
        Err(out) => return out,
    };
    let (action, target, detail, done) = match command {
        OperatorsCommand::Add {
            name,
            role,
            credential_stdin,
        } => {
            let chosen = if credential_stdin {
                let mut line = String::new();
                if let Err(e) = std::io::stdin().lock().read_line(&mut line) {
                    return Output::fail(
                        2,
                        format!("could not read the credential from stdin: {e}"),
                    );
                }
                Some(line.trim_end_matches(['\r', '\n']).to_string())
            } else {
                None
            };
            let role = Role::from(role);
            let done = accounts::add(store, &name, role, chosen).await.map(|cred| {
                if credential_stdin {
                    format!("added {name} ({role}) with the credential from stdin\n")
                } else {
                    format!(
                        "added {name} ({role}); its credential, shown only now:\n{cred}\nsign in at /signin, or send Authorization: Bearer {name}:<credential>\n"
                    )
                }
            });
            (AuditAction::AccountAdd, name, format!("role {role}"), done)
        }
        OperatorsCommand::Disable { name } => {
            let done = accounts::disable(store, &name)
                .await
                .map(|()| format!("disabled {name}\n"));
            (AuditAction::AccountDisable, name, String::new(), done)
        }
        OperatorsCommand::SetRole { name, role } => {
            let role = Role::from(role);
            let done = accounts::set_role(store, &name, role)
                .await
                .map(|()| format!("{name} is now {role}\n"));
            (
                AuditAction::AccountSetRole,
                name,
                format!("role {role}"),
                done,
            )
        }
        OperatorsCommand::List { .. } => unreachable!("answered above"),
    };
    let result = match &done {
        Ok(_) => AuditResult::Done,
        Err(e) => AuditResult::Refused(e.to_string()),
    };
    let origin = Origin::cli();
    let recorded = audit::record(
        store,
        &Record {
            who: &who,
            action,
            target: &target,
            origin: &origin,
            result,
            detail: &detail,
        },
    )
    .await;
    match (done, recorded) {
        (Ok(text), Ok(())) => Output::ok(text),
        (Ok(text), Err(e)) => {
            let mut out = Output::store(app, &e);
            out.stdout = text;
            out.stderr
                .insert_str(0, "claimd: done, but the audit line could not be written\n");
            out
        }
        (Err(e), _) => failed(app, e),
    }
}

/// Runs `claimd audit`.
pub(super) async fn audit_cmd(app: &App, query: AuditQuery, format: Format) -> Output {
    let now = match app.store.now().await {
        Ok(n) => n,
        Err(e) => return Output::store(app, &e),
    };
    let filter = match query.filter(now) {
        Ok(f) => f,
        Err(why) => return Output::fail(2, why),
    };
    let entries = match audit::list(app.store.as_ref(), &filter).await {
        Ok(e) => e,
        Err(e) => return Output::store(app, &e),
    };
    if format == Format::Json {
        return Output::ok(format!(
            "{}\n",
            serde_json::to_string_pretty(&entries).unwrap_or_default()
        ));
    }
    let mut t = Table::new(&[
        "id", "at_utc", "actor", "source", "action", "target", "origin", "result", "detail",
    ]);
    for e in &entries {
        t.row(vec![
            e.id.to_string(),
            e.at_utc.format("%Y-%m-%d %H:%M:%S").to_string(),
            e.actor.clone(),
            e.source.clone(),
            e.action.clone(),
            e.target.clone(),
            e.origin.clone(),
            e.result.clone(),
            e.detail.clone(),
        ]);
    }
    Output::ok(if format == Format::Csv {
        t.csv()
    } else {
        t.text()
    })
}
