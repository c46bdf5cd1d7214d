//! [`OperatorStore`] over a dialect: listings and searches, a claim's history, and the
//! operator moves, each one conditional update whose `WHERE` the claim model decides.

use super::SqlStore;
use crate::domain::claim::{Claim, ClaimState};
use crate::store::args::{key_args, operator_from_states};
use crate::store::dialect::{Arg, Dialect, LoggedWrite, SqlRow};
use crate::store::rows::claim_from_row;
use crate::store::{
    ClaimEvent, ClaimFilter, IntakeStore, NewEvent, OperatorStore, Seen, StoreError, StoreResult,
};
use async_trait::async_trait;
use std::str::FromStr;

impl<D: Dialect> SqlStore<D> {
    async fn state_of(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<ClaimState>> {
        let rows = self
            .fetch(
                "state_of",
                D::SQL.state_of,
                &key_args(consumer, tenant, message_id),
            )
            .await?;
        rows.first()
            .map(|r| {
                let s = r.text("state")?;
                ClaimState::from_str(&s).map_err(|e| StoreError::Corrupt(e.to_string()))
            })
            .transpose()
    }

    /// An operator move (`resolve` or `redrive`): one conditional update whose `WHERE` allows
    /// only the states the model allows, with its history line. `None`: no such claim;
    /// `Err(state)`: the claim is in a state the move is not allowed from.
    async fn operator_move(
        &self,
        name: &'static str,
        sql: &'static str,
        key: [&str; 3],
        to: ClaimState,
        expected: Option<Seen>,
        event: &NewEvent<'_>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        let [consumer, tenant, message_id] = key;
        let Some([from_a, from_b]) = operator_from_states(to, expected.map(|e| e.state)) else {
            return Ok(self.state_of(consumer, tenant, message_id).await?.map(Err));
        };
        let mut args = key_args(consumer, tenant, message_id).to_vec();
        if to != ClaimState::Started {
            args.push(Arg::Text(to.as_str()));
        }
        args.extend([
            Arg::Text(from_a),
            Arg::Text(from_b),
            Arg::OptI32(expected.and_then(|e| e.attempt)),
            Arg::OptI64(expected.and_then(|e| e.version)),
        ]);
        // An operator's resolve or redrive is always an outcome event.
        let write = LoggedWrite {
            name,
            sql,
            args: &args,
            event,
            outcomes: Some(self.outcomes().bound(true)),
            follow_ups: &[],
        };
        match self.dialect.update_logged(write).await? {
            Some(row) => Ok(Some(Ok(claim_from_row(&row)?))),
            None => Ok(self.state_of(consumer, tenant, message_id).await?.map(Err)),
        }
    }
}

#[async_trait]
impl<D: Dialect> OperatorStore for SqlStore<D> {
    async fn family(&self, id: i64) -> StoreResult<crate::store::ClaimFamily> {
        let parent = self
            .fetch("claim_parent", D::SQL.claim_parent, &[Arg::I64(id)])
            .await?;
        let children = self
            .fetch("claim_children", D::SQL.claim_children, &[Arg::I64(id)])
            .await?;
        Ok(crate::store::ClaimFamily {
            parent: parent.first().map(claim_from_row).transpose()?,
            children: children
                .iter()
                .map(claim_from_row)
                .collect::<StoreResult<_>>()?,
        })
    }

    async fn list(&self, f: &ClaimFilter) -> StoreResult<Vec<Claim>> {
        let search = f.search.as_deref().filter(|q| !q.is_empty());
        // The top of the prefix range: nothing that starts with the text sorts after it.
        let top = search.map(|q| format!("{q}\u{10FFFF}"));
        let mut args = vec![
            Arg::OptText(f.state.map(ClaimState::as_str)),
            Arg::OptText(f.consumer.as_deref()),
            Arg::Bool(f.stuck),
            Arg::OptTime(f.since),
            Arg::I64(i64::from(f.limit)),
            Arg::OptTime(f.until),
            Arg::OptText(f.tenant.as_deref()),
            Arg::OptTime(f.after.map(|c| c.received_utc)),
            Arg::OptI64(f.after.map(|c| c.id)),
        ];
        let rows = match (search, &top) {
            (Some(q), Some(top)) => {
                let _turn = self.dialect.search_turn().await?;
                args.extend([Arg::Text(q), Arg::Text(top)]);
                self.fetch("search_claims", D::SQL.search_claims, &args)
                    .await?
            }
            _ if f.stuck => {
                self.fetch("list_stuck_claims", D::SQL.list_stuck_claims, &args)
                    .await?
            }
            _ => self.fetch("list_claims", D::SQL.list_claims, &args).await?,
        };
        rows.iter().map(claim_from_row).collect()
    }

    async fn parked_by_reason(
        &self,
        consumer: &str,
        reason_prefix: &str,
        limit: u32,
    ) -> StoreResult<Vec<Claim>> {
        // Sealed errors cannot be compared in SQL: every parked claim of the consumer is read,
        // opened, and compared here.
        let sealed = crate::store::sealing::keyring().is_some();
        let (prefix, most) = match sealed {
            true => ("", i64::MAX),
            false => (reason_prefix, i64::from(limit)),
        };
        let rows = self
            .fetch(
                "list_parked_by_reason",
                D::SQL.list_parked_by_reason,
                &[Arg::Text(consumer), Arg::Text(prefix), Arg::I64(most)],
            )
            .await?;
        let claims = rows.iter().map(claim_from_row);
        if !sealed {
            return claims.collect();
        }
        let mut out = Vec::new();
        for claim in claims {
            let claim = claim?;
            let reason = claim.last_error.as_deref().unwrap_or_default();
            if reason.starts_with(reason_prefix) && out.len() < limit as usize {
                out.push(claim);
            }
        }
        Ok(out)
    }

    async fn events(&self, id: i64) -> StoreResult<Vec<ClaimEvent>> {
        let rows = self
            .fetch("list_events", D::SQL.list_events, &[Arg::I64(id)])
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ClaimEvent {
                    attempt: r.i32("attempt")?,
                    at_utc: r.time("at_utc")?,
                    actor: r.text("actor")?,
                    action: r.text("action")?,
                    outcome: r.text("outcome")?,
                    provider_status: r.opt_i32("provider_status")?,
                    detail: crate::store::sealing::open_text(r.opt_text("detail")?, &|| {
                        format!("claim {id}'s history")
                    }),
                })
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    async fn resolve(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        to: ClaimState,
        actor: &str,
        note: &str,
        expected: Option<Seen>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        if !to.is_terminal() {
            return Ok(self.state_of(consumer, tenant, message_id).await?.map(Err));
        }
        let event = NewEvent {
            actor,
            action: "resolve",
            outcome: to.as_str(),
            provider_status: None,
            detail: Some(note),
        };
        self.operator_move(
            "resolve",
            D::SQL.resolve,
            [consumer, tenant, message_id],
            to,
            expected,
            &event,
        )
        .await
    }

    async fn redrive_noted(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        actor: &str,
        note: &str,
        expected: Option<Seen>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        // For the history line only: the move itself is decided by the update's WHERE.
        let was = self.state_of(consumer, tenant, message_id).await?.map(|s| {
            // The operator's note, when given, is kept in the same history line.
            if note.is_empty() {
                format!("was {s}")
            } else {
                format!("was {s}: {note}")
            }
        });
        let event = NewEvent {
            actor,
            action: "redrive",
            outcome: "started",
            provider_status: None,
            detail: was.as_deref(),
        };
        let moved = self
            .operator_move(
                "redrive",
                D::SQL.redrive,
                [consumer, tenant, message_id],
                ClaimState::Started,
                expected,
                &event,
            )
            .await?;
        // The statement leaves an erased claim alone (`erased_utc IS NULL`): say why.
        if let Some(Err(_)) = moved
            && let Some(claim) = self.get(consumer, tenant, message_id).await?
            && claim.erased_utc.is_some()
        {
            let who = if tenant.is_empty() {
                format!("{consumer}/{message_id}")
            } else {
                format!("{consumer}/{message_id} (tenant {tenant})")
            };
            return Err(StoreError::Erased(who));
        }
        Ok(moved)
    }

    async fn erase(&self, id: i64, actor: &str, note: &str) -> StoreResult<Option<Claim>> {
        let event = NewEvent {
            actor,
            action: "erase",
            outcome: "erased",
            provider_status: None,
            detail: (!note.is_empty()).then_some(note),
        };
        self.erase_one(id, &event).await
    }

    async fn find(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<Claim>> {
        let args = crate::store::args::key_args(consumer, tenant, message_id);
        let rows = self.fetch("find_claim", D::SQL.find_claim, &args).await?;
        rows.first().map(claim_from_row).transpose()
    }
}
