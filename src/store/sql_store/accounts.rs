//! [`AccountStore`] over a dialect.

use super::SqlStore;
use crate::domain::operator_role::Role;
use crate::store::audit::{AuditEntry, AuditFilter, NewAuditEntry, OperatorAccount};
use crate::store::dialect::{Arg, Dialect, SqlRow};
use crate::store::{AccountStore, StoreError, StoreResult};
use async_trait::async_trait;

fn account_from<R: SqlRow>(r: &R) -> StoreResult<OperatorAccount> {
    Ok(OperatorAccount {
        name: r.text("name")?,
        role: r
            .text("role")?
            .parse()
            .map_err(|e: crate::domain::operator_role::UnknownRole| {
                StoreError::Corrupt(e.to_string())
            })?,
        credential_hash: r.text("credential_hash")?,
        created_utc: r.time("created_utc")?,
        disabled_utc: r.opt_time("disabled_utc")?,
    })
}

fn entry_from<R: SqlRow>(r: &R) -> StoreResult<AuditEntry> {
    Ok(AuditEntry {
        id: r.i64("id")?,
        at_utc: r.time("at_utc")?,
        actor: r.text("actor")?,
        source: r.text("source")?,
        action: r.text("action")?,
        target: r.text("target")?,
        origin: r.text("origin")?,
        result: r.text("result")?,
        detail: r.text("detail")?,
    })
}

#[async_trait]
impl<D: Dialect> AccountStore for SqlStore<D> {
    async fn add_operator(
        &self,
        name: &str,
        role: Role,
        credential_hash: &str,
    ) -> StoreResult<bool> {
        let n = self
            .execute(
                "insert_operator",
                D::ACCOUNT_SQL.insert_operator,
                &[
                    Arg::Text(name),
                    Arg::Text(role.as_str()),
                    Arg::Text(credential_hash),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    async fn operator(&self, name: &str) -> StoreResult<Option<OperatorAccount>> {
        let rows = self
            .fetch(
                "get_operator",
                D::ACCOUNT_SQL.get_operator,
                &[Arg::Text(name)],
            )
            .await?;
        rows.first().map(account_from).transpose()
    }

    async fn operators(&self) -> StoreResult<Vec<OperatorAccount>> {
        let rows = self
            .fetch("list_operators", D::ACCOUNT_SQL.list_operators, &[])
            .await?;
        rows.iter().map(account_from).collect()
    }

    async fn disable_operator(&self, name: &str) -> StoreResult<bool> {
        let n = self
            .execute(
                "disable_operator",
                D::ACCOUNT_SQL.disable_operator,
                &[Arg::Text(name)],
            )
            .await?;
        Ok(n == 1)
    }

    async fn set_operator_role(&self, name: &str, role: Role) -> StoreResult<bool> {
        let n = self
            .execute(
                "set_operator_role",
                D::ACCOUNT_SQL.set_operator_role,
                &[Arg::Text(name), Arg::Text(role.as_str())],
            )
            .await?;
        Ok(n == 1)
    }

    async fn record_audit(&self, e: &NewAuditEntry<'_>) -> StoreResult<()> {
        self.execute(
            "insert_audit",
            D::ACCOUNT_SQL.insert_audit,
            &[
                Arg::Text(e.actor),
                Arg::Text(e.source),
                Arg::Text(e.action),
                Arg::Text(e.target),
                Arg::Text(e.origin),
                Arg::Text(e.result),
                Arg::Text(e.detail),
            ],
        )
        .await
        .map(|_| ())
    }

    async fn audit(&self, f: &AuditFilter) -> StoreResult<Vec<AuditEntry>> {
        let rows = self
            .fetch(
                "list_audit",
                D::ACCOUNT_SQL.list_audit,
                &[
                    Arg::OptTime(f.since),
                    Arg::OptText(f.actor.as_deref()),
                    Arg::OptI64(f.before_id),
                    Arg::I64(i64::from(f.limit)),
                ],
            )
            .await?;
        rows.iter().map(entry_from).collect()
    }
}
