//! Who an operator is and what their role lets them do: the one place the rules live. The HTTP
//! routes, the operator page and the command line ask [`Role::may`] before acting, and
//! whatever shows sensitive fields asks [`Role::may_see_sensitive`].
//!
//! An [`Identity`] is a name, a role and where the identity came from ([`IdentitySource`]):
//! a personal account in the store, the break-glass admin token, the command line, or the
//! open loopback mode of a worker without any secret. A new way to sign in (OIDC) is one more
//! source that yields the same `Identity`; nothing that checks roles changes.

use std::fmt;
use std::str::FromStr;

/// An operator's role. Each includes what the one before may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads the page, claims, the report and the audit; acts on nothing.
    Viewer,
    /// A viewer who may also resolve, redrive and cancel claims.
    Operator,
    /// Everything: also erasure, key rotation and operator accounts.
    Admin,
}

/// Something an operator does that changes state, for [`Role::may`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Settle a parked or failed claim by hand.
    Resolve,
    /// Put a parked or failed claim back to `started`.
    Redrive,
    /// Cancel a scheduled send before its time.
    Cancel,
    /// Erase a claim's personal data.
    Erase,
    /// Rotate the payload encryption keys.
    RotateKeys,
    /// Add, disable or change the role of an operator account.
    ManageAccounts,
}

impl Role {
    /// Every role, least first.
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    /// Whether this role may do `action`.
    pub fn may(self, action: Action) -> bool {
        match action {
            Action::Resolve | Action::Redrive | Action::Cancel => self >= Role::Operator,
            Action::Erase | Action::RotateKeys | Action::ManageAccounts => self == Role::Admin,
        }
    }

    /// Whether this role sees sensitive fields (payloads, provider responses) unredacted:
    /// admins only.
    pub fn may_see_sensitive(self) -> bool {
        self == Role::Admin
    }

    /// `viewer`, `operator` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is none of `viewer`, `operator`, `admin`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}: use viewer, operator or admin")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Role, UnknownRole> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownRole(s.chars().take(40).collect()))
    }
}

impl Action {
    /// The action's name in the audit: `resolve`, `redrive`, `cancel`, `erase`,
    /// `rotate-keys`, `manage-accounts`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Resolve => "resolve",
            Action::Redrive => "redrive",
            Action::Cancel => "cancel",
            Action::Erase => "erase",
            Action::RotateKeys => "rotate-keys",
            Action::ManageAccounts => "manage-accounts",
        }
    }
}

/// Where an [`Identity`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdentitySource {
    /// A personal operator account (`claimd operators add`), checked against its hash.
    Account,
    /// The break-glass `[http] admin_token`: an admin that names no person.
    AdminToken,
    /// The command line: whoever runs `claimd` with the store's credentials (named by
    /// `CLAIMD_OPERATOR` or `USER`).
    Cli,
    /// A worker with neither `admin_token` nor `session_secret`, answering loopback only.
    Local,
}

impl IdentitySource {
    /// `account`, `admin_token`, `cli` or `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentitySource::Account => "account",
            IdentitySource::AdminToken => "admin_token",
            IdentitySource::Cli => "cli",
            IdentitySource::Local => "local",
        }
    }

    /// The source named by [`IdentitySource::as_str`].
    pub fn parse(s: &str) -> Option<IdentitySource> {
        [
            IdentitySource::Account,
            IdentitySource::AdminToken,
            IdentitySource::Cli,
            IdentitySource::Local,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
}

/// Who acts: a name, a role and where they were recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The account's name; `admin-token` for the admin token; the OS user for the command
    /// line; `local` for the open loopback mode.
    pub name: String,
    /// What they may do.
    pub role: Role,
    /// How they were recognised.
    pub source: IdentitySource,
}

/// The name the admin token acts under in the audit.
pub const ADMIN_TOKEN_NAME: &str = "admin-token";

impl Identity {
    /// The break-glass admin token.
    pub fn admin_token() -> Identity {
        Identity {
            name: ADMIN_TOKEN_NAME.to_string(),
            role: Role::Admin,
            source: IdentitySource::AdminToken,
        }
    }

    /// A personal account.
    pub fn account(name: &str, role: Role) -> Identity {
        Identity {
            name: name.to_string(),
            role,
            source: IdentitySource::Account,
        }
    }

    /// Whether this identity may do `action`.
    pub fn may(&self, action: Action) -> bool {
        self.role.may(action)
    }
}

/// Whether `name` may name an operator account: 1-64 of letters, digits and `._@-` (it
/// travels in the session cookie and lands in the history and the audit).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != ADMIN_TOKEN_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACTIONS: [Action; 6] = [
        Action::Resolve,
        Action::Redrive,
        Action::Cancel,
        Action::Erase,
        Action::RotateKeys,
        Action::ManageAccounts,
    ];

    #[test]
    fn a_viewer_may_do_nothing() {
        for a in ACTIONS {
            assert!(!Role::Viewer.may(a), "{a:?}");
        }
        assert!(!Role::Viewer.may_see_sensitive());
    }

    #[test]
    fn an_operator_resolves_redrives_and_cancels_only() {
        for a in ACTIONS {
            let want = matches!(a, Action::Resolve | Action::Redrive | Action::Cancel);
            assert_eq!(Role::Operator.may(a), want, "{a:?}");
        }
        assert!(!Role::Operator.may_see_sensitive());
    }

    #[test]
    fn an_admin_may_do_everything() {
        for a in ACTIONS {
            assert!(Role::Admin.may(a), "{a:?}");
        }
        assert!(Role::Admin.may_see_sensitive());
        assert!(Identity::admin_token().may(Action::Erase));
    }

    #[test]
    fn roles_round_trip_through_their_names() {
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>(), Ok(r));
        }
        assert!("root".parse::<Role>().is_err());
        assert!("Admin".parse::<Role>().is_err());
        for s in ["account", "admin_token", "cli", "local"] {
            assert_eq!(IdentitySource::parse(s).map(|x| x.as_str()), Some(s));
        }
    }

    #[test]
    fn names_are_short_plain_and_not_the_admin_token() {
        assert!(valid_name("ann.lee@example.com"));
        assert!(!valid_name(""));
        assert!(!valid_name("ann lee"));
        assert!(!valid_name("ann:lee"));
        assert!(!valid_name(&"a".repeat(65)));
        assert!(!valid_name(ADMIN_TOKEN_NAME));
    }
}
