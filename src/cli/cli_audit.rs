//! The command line in the operator audit: who it is (the operator `CLAIMD_OPERATOR` or
//! `USER` names, as an admin: whoever runs `claimd` holds the store's credentials) and the
//! lines it appends, from `cli:<OS user>`.

use super::actor::operator_name;
use super::{App, Output};
use crate::domain::operator_role::{Identity, IdentitySource, Role};
use crate::ops::audit::{self, AuditAction, AuditResult, Origin, Record};

/// The command line's identity: the named operator, as an admin.
pub(super) fn cli_identity() -> Result<Identity, Output> {
    let name = operator_name().map_err(|why| Output::fail(2, why))?;
    Ok(Identity {
        name: name.trim_start_matches("operator:").to_string(),
        role: Role::Admin,
        source: IdentitySource::Cli,
    })
}

/// Appends a command-line line to the audit, logging a failure.
pub(super) async fn record_cli(
    app: &App,
    who: &Identity,
    action: AuditAction,
    target: &str,
    result: AuditResult,
    detail: &str,
) {
    let origin = Origin::cli();
    let r = Record {
        who,
        action,
        target,
        origin: &origin,
        result,
        detail,
    };
    audit::record_or_log(app.store.as_ref(), &r).await;
}

/// The command line's identity, for the bulk actions' audit lines.
pub(super) fn cli_who() -> Option<Identity> {
    cli_identity().ok()
}
