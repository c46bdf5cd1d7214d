//! SQLite's group commit: the claims (or settles) the `batch` module gathered, written in one
//! `BEGIN IMMEDIATE` transaction and made durable by one commit (`synchronous = FULL`: the
//! WAL is synced before the commit returns, so every caller's answer follows its row onto
//! disk). The statements are the one-row ones, run in turn; SQLite has one writer, and the
//! dialect's writer lock queues the writes of this process before they reach it.
//!
//! Unlike PostgreSQL's multi-row insert, a claim whose key is already taken is counted here,
//! in the same transaction, with the same rule as the one-row path.

use super::{SqliteDialect, sql};
use crate::claim::NewClaim;
use crate::store::args::{created, insert_args, repeat_args, repeat_outcome, settle_args};
use crate::store::dialect::{LoggedWrite, SqlPool, SqlRow, event_args};
use crate::store::rows::claim_from_row;
use crate::store::{ClaimOutcome, SettleItem, StoreError, StoreResult};
use sqlx::sqlite::SqliteRow;
use sqlx::{Sqlite, SqliteConnection};

fn err(query: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::from_sqlx(query, e)
}

/// Runs `w`'s update on `conn` (inside a transaction) and, when it changed a row, writes the
/// history line of that row.
pub(super) async fn logged(
    conn: &mut SqliteConnection,
    w: LoggedWrite<'_>,
) -> StoreResult<Option<SqliteRow>> {
    let Some(row) = SqlPool::<Sqlite>::query(w.sql, w.args)
        .fetch_optional(&mut *conn)
        .await
        .map_err(err(w.name))?
    else {
        return Ok(None);
    };
    let (id, attempt) = (row.i64("id")?, row.i32("attempt")?);
    SqlPool::<Sqlite>::query(
        sql::STATEMENTS.insert_event,
        &event_args(id, attempt, w.event),
    )
    .execute(&mut *conn)
    .await
    .map_err(err("insert_event"))?;
    Ok(Some(row))
}

impl SqliteDialect {
    /// The writer lock of this process, then a `BEGIN IMMEDIATE` transaction: SQLite's write
    /// lock taken at the start, so the batch never fails half-way on a busy upgrade.
    async fn write_transaction(
        &self,
    ) -> StoreResult<(
        tokio::sync::MutexGuard<'_, ()>,
        sqlx::Transaction<'static, Sqlite>,
    )> {
        let writer = self.writer.lock().await;
        let tx = self
            .sql
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(err("begin"))?;
        Ok((writer, tx))
    }

    /// Claims `new` in one transaction: each inserted, or its repeat counted, in turn.
    pub(super) async fn claim_together(
        &self,
        new: &[&NewClaim],
    ) -> StoreResult<Vec<Option<ClaimOutcome>>> {
        let (_writer, mut tx) = self.write_transaction().await?;
        let mut out = Vec::with_capacity(new.len());
        for n in new {
            let inserted = SqlPool::<Sqlite>::query(sql::STATEMENTS.insert_claim, &insert_args(n))
                .fetch_optional(&mut *tx)
                .await
                .map_err(err("insert_claim"))?;
            if let Some(row) = inserted {
                out.push(Some(created(n, claim_from_row(&row)?)));
                continue;
            }
            // The key is taken (earlier, or earlier in this batch): the same rule as the
            // one-row path. No row: left to that path (it cannot happen while this
            // transaction holds the only write lock).
            let existing = SqlPool::<Sqlite>::query(sql::STATEMENTS.count_repeat, &repeat_args(n))
                .fetch_optional(&mut *tx)
                .await
                .map_err(err("count_repeat"))?;
            out.push(
                existing
                    .map(|row| claim_from_row(&row).map(|c| repeat_outcome(n, c)))
                    .transpose()?,
            );
        }
        tx.commit().await.map_err(err("commit"))?;
        Ok(out)
    }

    /// Settles `items` (distinct ids) in one transaction, each fenced on its own attempt (I2)
    /// and written with its history line.
    pub(super) async fn settle_together(&self, items: &[SettleItem<'_>]) -> StoreResult<Vec<bool>> {
        let (_writer, mut tx) = self.write_transaction().await?;
        let mut out = Vec::with_capacity(items.len());
        for i in items {
            let args = settle_args(i.id, i.attempt, &i.settlement);
            let write = LoggedWrite {
                name: "settle",
                sql: sql::STATEMENTS.settle,
                args: &args,
                event: &i.event,
            };
            out.push(logged(&mut tx, write).await?.is_some());
        }
        tx.commit().await.map_err(err("commit"))?;
        Ok(out)
    }
}
