//! Operator accounts and the operator audit as the store keeps them ([`AccountStore`]): the
//! rows, what a new audit line holds, how the audit is filtered, and the statements each
//! dialect supplies for them ([`AccountStatements`]).
//!
//! [`AccountStore`]: super::AccountStore

use crate::domain::operator_role::Role;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// An operator account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperatorAccount {
    /// The person's name (unique, [`valid_name`](crate::domain::operator_role::valid_name)).
    pub name: String,
    /// What they may do.
    pub role: Role,
    /// The credential's hash ([`credential`](crate::domain::credential)); never shown.
    #[serde(skip)]
    pub credential_hash: String,
    /// When the account was added.
    pub created_utc: DateTime<Utc>,
    /// When it was disabled; `None`: active.
    pub disabled_utc: Option<DateTime<Utc>>,
}

impl OperatorAccount {
    /// Whether the account may sign in.
    pub fn active(&self) -> bool {
        self.disabled_utc.is_none()
    }
}

/// A line to append to the audit (the store adds its id and the database's time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewAuditEntry<'a> {
    /// Who: an account's name, `admin-token`, the command line's operator.
    pub actor: &'a str,
    /// How they were recognised: `account`, `admin_token`, `cli`, `local`.
    pub source: &'a str,
    /// What: `sign-in`, `resolve`, `operator-add`, ... (`ops::audit::AuditAction`).
    pub action: &'a str,
    /// What it was done to: a claim (`consumer/message_id`), an account, a route.
    pub target: &'a str,
    /// From where: the client's address, or `cli:<os user>`.
    pub origin: &'a str,
    /// How it ended: `done`, `refused: ...`.
    pub result: &'a str,
    /// Anything else worth keeping (a note, the role given).
    pub detail: &'a str,
}

/// A line of the audit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    /// Increasing with every line.
    pub id: i64,
    /// When (the database's clock).
    pub at_utc: DateTime<Utc>,
    /// Who.
    pub actor: String,
    /// How they were recognised.
    pub source: String,
    /// What.
    pub action: String,
    /// What it was done to.
    pub target: String,
    /// From where.
    pub origin: String,
    /// How it ended.
    pub result: String,
    /// Anything else.
    pub detail: String,
}

/// Which audit lines to read, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only lines at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only this actor's lines.
    pub actor: Option<String>,
    /// Only lines older than this id (the next page after a page ending at it).
    pub before_id: Option<i64>,
    /// At most this many lines.
    pub limit: u32,
}

/// The account and audit statements of one dialect. Parameters in the order the body binds
/// them (each field says).
#[derive(Debug)]
pub struct AccountStatements {
    /// Add an account unless the name exists: name, role, credential hash.
    pub insert_operator: &'static str,
    /// One account: name.
    pub get_operator: &'static str,
    /// Every account, by name.
    pub list_operators: &'static str,
    /// Disable an active account: name.
    pub disable_operator: &'static str,
    /// Change an account's role: name, role.
    pub set_operator_role: &'static str,
    /// Append an audit line: actor, source, action, target, origin, result, detail.
    pub insert_audit: &'static str,
    /// Audit lines, newest first: since (NULL: any), actor (NULL: any), before id (NULL:
    /// none), limit.
    pub list_audit: &'static str,
}
