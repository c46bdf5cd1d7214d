//! The operator audit: every sign-in (and refused one), sign-out, action on a claim, erasure,
//! key rotation and account change, with who, what, on what, when, from where and how it
//! ended. Lines are appended and read, never changed: the tables refuse `UPDATE` and `DELETE`
//! (and on PostgreSQL the runtime role is granted neither), and retention never prunes them.
//!
//! Front ends call [`record`] (or [`record_or_log`] where a failed write must not change the
//! answer) once per decision, and read with [`list`].

use crate::domain::operator_role::{Action, Identity};
use crate::store::audit::{AuditEntry, AuditFilter, NewAuditEntry};
use crate::store::{ClaimStore, StoreResult};
use std::fmt;
use std::net::SocketAddr;

/// The most lines one read returns.
pub const MAX_LIMIT: u32 = 1000;

/// What was done or tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditAction {
    /// Signed in (page form or a first bearer use is not one: only the form).
    SignIn,
    /// A sign-in with a wrong name or credential, or by a disabled account.
    SignInRefused,
    /// Signed out.
    SignOut,
    /// An action on state ([`Action`]).
    Act(Action),
    /// An account added.
    AccountAdd,
    /// An account disabled.
    AccountDisable,
    /// An account's role changed.
    AccountSetRole,
    /// A change through a route with no action of its own (`target` names the route).
    Request,
}

impl AuditAction {
    /// The action's name in the audit: `sign-in`, `sign-in-refused`, `sign-out`, `resolve`,
    /// `redrive`, `cancel`, `erase`, `rotate-keys`, `account-add`, `account-disable`,
    /// `account-set-role`, `request`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::SignIn => "sign-in",
            AuditAction::SignInRefused => "sign-in-refused",
            AuditAction::SignOut => "sign-out",
            AuditAction::Act(Action::ManageAccounts) => "manage-accounts",
            AuditAction::Act(a) => a.as_str(),
            AuditAction::AccountAdd => "account-add",
            AuditAction::AccountDisable => "account-disable",
            AuditAction::AccountSetRole => "account-set-role",
            AuditAction::Request => "request",
        }
    }
}

/// Where a request came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// An HTTP client's address (as the listener saw it).
    Address(SocketAddr),
    /// The command line, run by this OS user.
    Cli(String),
    /// Not known (the router called in-process).
    Unknown,
}

impl Origin {
    /// The command line, with the OS user from `$USER` (`?` when unset).
    pub fn cli() -> Origin {
        Origin::Cli(
            std::env::var("USER")
                .ok()
                .filter(|u| !u.trim().is_empty())
                .unwrap_or_else(|| "?".into()),
        )
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Address(a) => write!(f, "{}", a.ip()),
            Origin::Cli(user) => write!(f, "cli:{user}"),
            Origin::Unknown => f.write_str("unknown"),
        }
    }
}

/// How it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditResult {
    /// Done.
    Done,
    /// Refused, and why (`403 forbidden for role viewer`, `409 changed since read`, ...).
    Refused(String),
}

impl fmt::Display for AuditResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuditResult::Done => f.write_str("done"),
            AuditResult::Refused(why) => write!(f, "refused: {why}"),
        }
    }
}

/// One decision to append to the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Who.
    pub who: &'a Identity,
    /// What.
    pub action: AuditAction,
    /// On what: `consumer/message_id` (with ` tenant T` when there is one), an account's name,
    /// a route.
    pub target: &'a str,
    /// From where.
    pub origin: &'a Origin,
    /// How it ended.
    pub result: AuditResult,
    /// Anything else worth keeping (a note, a role given); may be empty.
    pub detail: &'a str,
}

/// Appends `r` to the audit.
pub async fn record(store: &dyn ClaimStore, r: &Record<'_>) -> StoreResult<()> {
    let origin = r.origin.to_string();
    let result = r.result.to_string();
    let detail: String = r.detail.chars().take(1000).collect();
    store
        .record_audit(&NewAuditEntry {
            actor: &r.who.name,
            source: r.who.source.as_str(),
            action: r.action.as_str(),
            target: r.target,
            origin: &origin,
            result: &result,
            detail: &detail,
        })
        .await
}

/// [`record`], logging a failure at `error` instead of returning it: for the answers that
/// are decided already (a refusal, an action done).
pub async fn record_or_log(store: &dyn ClaimStore, r: &Record<'_>) {
    if let Err(e) = record(store, r).await {
        tracing::error!(
            actor = %r.who.name,
            action = r.action.as_str(),
            target = r.target,
            result = %r.result,
            error = %e,
            "could not append to the operator audit"
        );
    }
}

/// Audit lines matching `filter`, newest first (`limit` capped at [`MAX_LIMIT`], 0 read as
/// 50).
pub async fn list(store: &dyn ClaimStore, filter: &AuditFilter) -> StoreResult<Vec<AuditEntry>> {
    let mut f = filter.clone();
    f.limit = match f.limit {
        0 => 50,
        n => n.min(MAX_LIMIT),
    };
    store.audit(&f).await
}

/// What a reader of the audit asks for, as typed (the page's query, the CLI's options).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct AuditQuery {
    /// Lines at or after: a duration back from now (`24h`, `7d`), or a time (RFC 3339,
    /// `2026-05-01 12:00`, a date).
    pub since: Option<String>,
    /// One actor's lines only.
    pub actor: Option<String>,
    /// Lines older than this id (the next page).
    pub before: Option<i64>,
    /// At most this many lines (default 50, at most [`MAX_LIMIT`]).
    pub limit: Option<u32>,
}

impl AuditQuery {
    /// The store's filter, with `since` read against `now`; or what is wrong with the query.
    pub fn filter(&self, now: chrono::DateTime<chrono::Utc>) -> Result<AuditFilter, String> {
        let since = match self.since.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => Some(crate::ops::claim_query::time_bound(s, now).ok_or_else(|| {
                format!(
                    "since {:?} is neither a duration (24h, 7d) nor a time (2026-05-01 12:00, RFC 3339)",
                    s.chars().take(60).collect::<String>()
                )
            })?),
        };
        let actor = self
            .actor
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        if let Some(a) = &actor {
            crate::ops::params::text("actor", a).map_err(|e| e.to_string())?;
        }
        let limit = self.limit.unwrap_or(50);
        if limit == 0 || limit > MAX_LIMIT {
            return Err(format!("limit must be 1-{MAX_LIMIT}"));
        }
        Ok(AuditFilter {
            since,
            actor,
            before_id: self.before.filter(|b| *b > 0),
            limit,
        })
    }
}

/// A claim as an audit target: `consumer/message_id`, and ` tenant T` when it has one.
pub fn claim_target(consumer: &str, tenant: &str, message_id: &str) -> String {
    if tenant.is_empty() {
        format!("{consumer}/{message_id}")
    } else {
        format!("{consumer}/{message_id} tenant {tenant}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_read_or_refused_clearly() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-05-02T00:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let q = AuditQuery {
            since: Some("24h".into()),
            actor: Some(" ann ".into()),
            before: Some(10),
            limit: None,
        };
        let f = q.filter(now).unwrap();
        assert_eq!(f.since.unwrap().to_rfc3339(), "2026-05-01T00:00:00+00:00");
        assert_eq!(f.actor.as_deref(), Some("ann"));
        assert_eq!((f.before_id, f.limit), (Some(10), 50));
        let bad = AuditQuery {
            since: Some("yesterday".into()),
            ..Default::default()
        };
        assert!(bad.filter(now).unwrap_err().contains("neither a duration"));
        let big = AuditQuery {
            limit: Some(MAX_LIMIT + 1),
            ..Default::default()
        };
        assert!(big.filter(now).unwrap_err().contains("limit must be"));
    }

    #[test]
    fn lines_read_as_a_person_would_write_them() {
        assert_eq!(AuditAction::Act(Action::Resolve).as_str(), "resolve");
        assert_eq!(AuditAction::SignInRefused.as_str(), "sign-in-refused");
        assert_eq!(
            Origin::Address("10.1.2.3:5555".parse().unwrap()).to_string(),
            "10.1.2.3"
        );
        assert_eq!(Origin::Cli("ann".into()).to_string(), "cli:ann");
        assert_eq!(
            AuditResult::Refused("403 role viewer".into()).to_string(),
            "refused: 403 role viewer"
        );
        assert_eq!(claim_target("pay", "", "m1"), "pay/m1");
        assert_eq!(claim_target("pay", "acme", "m1"), "pay/m1 tenant acme");
    }
}
