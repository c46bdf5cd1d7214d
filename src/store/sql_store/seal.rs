//! [`SealStore`] over a dialect: pages of the sealed columns as stored, fenced writes back.

use super::SqlStore;
use crate::store::dialect::{Arg, Dialect, SqlRow};
use crate::store::sealing::{self, SealedRow, SealedTable};
use crate::store::{SealStore, StoreResult};
use async_trait::async_trait;

/// A row of `table` from a page or one-claim statement.
fn row_of<R: SqlRow>(table: SealedTable, r: &R) -> StoreResult<SealedRow> {
    let mut values = Vec::with_capacity(table.columns().len());
    for col in table.columns() {
        values.push(match *col {
            "payload" => Some(r.bytes_or_empty("payload")),
            text => r.opt_text(text)?.map(String::into_bytes),
        });
    }
    Ok(SealedRow {
        id: r.i64("id")?,
        version: match table {
            SealedTable::Claims => r.i64("version")?,
            _ => 0,
        },
        values,
    })
}

/// A text column's value as bound: sealed values and clear text are UTF-8 (a clear value read
/// as text is).
fn text(v: &Option<Vec<u8>>) -> Option<&str> {
    v.as_deref()
        .map(|b| std::str::from_utf8(b).unwrap_or_default())
}

#[async_trait]
impl<D: Dialect> SealStore for SqlStore<D> {
    async fn sealed_page(
        &self,
        table: SealedTable,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<SealedRow>> {
        let (name, sql) = match table {
            SealedTable::Claims => ("claims_page", D::SEAL_SQL.claims_page),
            SealedTable::OutcomeEvents => ("outcome_events_page", D::SEAL_SQL.outcome_events_page),
            SealedTable::ClaimEvents => ("claim_events_page", D::SEAL_SQL.claim_events_page),
        };
        let rows = self
            .fetch(name, sql, &[Arg::I64(after), Arg::I64(i64::from(limit))])
            .await?;
        rows.iter().map(|r| row_of(table, r)).collect()
    }

    async fn reseal(
        &self,
        table: SealedTable,
        was: &SealedRow,
        new: &SealedRow,
    ) -> StoreResult<bool> {
        let (w, n) = (&was.values, &new.values);
        let n = match table {
            SealedTable::Claims => {
                let empty = Vec::new();
                let payload = |v: &Option<Vec<u8>>| v.as_ref().unwrap_or(&empty).clone();
                let (np, wp) = (payload(&n[0]), payload(&w[0]));
                self.execute(
                    "reseal_claim",
                    D::SEAL_SQL.reseal_claim,
                    &[
                        Arg::I64(was.id),
                        Arg::Bytes(&np),
                        Arg::OptText(text(&n[1])),
                        Arg::OptText(text(&n[2])),
                        Arg::I64(was.version),
                        Arg::Bytes(&wp),
                        Arg::OptText(text(&w[1])),
                        Arg::OptText(text(&w[2])),
                    ],
                )
                .await?
            }
            SealedTable::OutcomeEvents => {
                self.execute(
                    "reseal_outcome_event",
                    D::SEAL_SQL.reseal_outcome_event,
                    &[
                        Arg::I64(was.id),
                        Arg::OptText(text(&n[0])),
                        Arg::OptText(text(&n[1])),
                        Arg::OptText(text(&n[2])),
                        Arg::OptText(text(&w[0])),
                        Arg::OptText(text(&w[1])),
                        Arg::OptText(text(&w[2])),
                    ],
                )
                .await?
            }
            SealedTable::ClaimEvents => {
                self.execute(
                    "reseal_claim_event",
                    D::SEAL_SQL.reseal_claim_event,
                    &[
                        Arg::I64(was.id),
                        Arg::OptText(text(&n[0])),
                        Arg::OptText(text(&w[0])),
                    ],
                )
                .await?
            }
        };
        Ok(n == 1)
    }

    async fn seal_claim(&self, id: i64) -> StoreResult<bool> {
        let Some(keys) = sealing::keyring() else {
            return Ok(false);
        };
        let rows = self
            .fetch("claim_one", D::SEAL_SQL.claim_one, &[Arg::I64(id)])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(false);
        };
        let was = row_of(SealedTable::Claims, row)?;
        match sealing::resealed(keys, &was) {
            Ok(Some(new)) => self.reseal(SealedTable::Claims, &was, &new).await,
            // Nothing to do, or a value whose key is missing: left as it is (the engine parks
            // such a claim rather than send it).
            Ok(None) | Err(_) => Ok(false),
        }
    }
}
