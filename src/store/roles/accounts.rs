//! Operator accounts and the append-only operator audit.

use crate::domain::operator_role::Role;
use crate::store::StoreResult;
use crate::store::audit::{AuditEntry, AuditFilter, NewAuditEntry, OperatorAccount};
use async_trait::async_trait;

/// The accounts' and the audit's part of the store, used by `ops::accounts`, `ops::audit`,
/// the HTTP sign-in and its checks on every request.
#[async_trait]
pub trait AccountStore: Send + Sync {
    /// Adds an account; `false` when one of that name exists (active or disabled).
    async fn add_operator(
        &self,
        name: &str,
        role: Role,
        credential_hash: &str,
    ) -> StoreResult<bool>;

    /// The account of that name.
    async fn operator(&self, name: &str) -> StoreResult<Option<OperatorAccount>>;

    /// Every account, by name.
    async fn operators(&self) -> StoreResult<Vec<OperatorAccount>>;

    /// Disables an active account; `false` when there is no active account of that name.
    async fn disable_operator(&self, name: &str) -> StoreResult<bool>;

    /// Changes an account's role; `false` when there is no account of that name.
    async fn set_operator_role(&self, name: &str, role: Role) -> StoreResult<bool>;

    /// Appends a line to the audit. Lines are never changed or deleted.
    async fn record_audit(&self, entry: &NewAuditEntry<'_>) -> StoreResult<()>;

    /// Audit lines matching `filter`, newest first.
    async fn audit(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditEntry>>;
}
