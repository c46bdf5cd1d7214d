//! Erasing a person's data on request (`claimd claims erase`, `POST /v1/erasures`): the
//! finished claims of one message, or of one tenant (a data-subject request), have their
//! payload, provider answer and error blanked; open claims are listed with what to do first.
//!
//! An erased claim keeps its row and fingerprint, so a redelivery is still answered as a
//! duplicate and a changed payload still refused: erasure never lets a payment through twice.
//! It is never sent again (a redrive is refused).

use crate::domain::claim::{Claim, ClaimState};
use crate::store::{ClaimCursor, ClaimFilter, ClaimStore, StoreResult};
use serde::Serialize;

/// Claims read per page when a tenant's claims are selected.
const PAGE: u32 = 500;

/// Which claims an erasure is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// One message of one consumer (and tenant, `""` when none).
    Message {
        /// Consumer.
        consumer: String,
        /// Tenant (`""`: none).
        tenant: String,
        /// Message id.
        message_id: String,
    },
    /// Every claim of one tenant, of every consumer.
    Tenant(String),
}

impl Selection {
    /// The selection from a command line's or request's fields: a consumer and message id
    /// (with the tenant, if any) name one message; a tenant alone names all its claims.
    pub fn from_parts(
        consumer: Option<&str>,
        message_id: Option<&str>,
        tenant: &str,
    ) -> Result<Selection, String> {
        match (consumer, message_id) {
            (Some(c), Some(m)) if !c.is_empty() && !m.is_empty() => Ok(Selection::Message {
                consumer: c.into(),
                tenant: tenant.into(),
                message_id: m.into(),
            }),
            (None, None) if !tenant.is_empty() => Ok(Selection::Tenant(tenant.into())),
            (None, None) => Err(
                "name what to erase: --consumer C --message ID (one message), or --tenant T (every claim of that tenant)".into(),
            ),
            _ => Err("--consumer and --message go together (one message)".into()),
        }
    }

    /// What the operator audit names as the erasure's target: the claim, or `tenant T`.
    pub fn audit_target(&self) -> String {
        match self {
            Selection::Message {
                consumer,
                tenant,
                message_id,
            } => crate::ops::audit::claim_target(consumer, tenant, message_id),
            Selection::Tenant(tenant) => format!("tenant {tenant}"),
        }
    }
}

/// What became of one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Erased now (or, on a dry run, would be).
    Erased,
    /// Erased before; nothing left to erase.
    AlreadyErased,
    /// Open: not erased (see [`Line::why`]).
    Open,
}

/// One claim of an erasure's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    /// Consumer.
    pub consumer: String,
    /// Tenant.
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// Its state when it was looked at.
    pub state: ClaimState,
    /// What became of it.
    pub verdict: Verdict,
    /// For an open claim: why it is not erased and what to do.
    pub why: Option<String>,
}

/// An erasure's report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Nothing was changed: the report says what would be.
    pub dry_run: bool,
    /// Every claim selected.
    pub claims: Vec<Line>,
}

impl Report {
    /// Claims with this verdict.
    pub fn count(&self, verdict: Verdict) -> usize {
        self.claims.iter().filter(|l| l.verdict == verdict).count()
    }
}

/// Why an open claim in `state` is not erased, and what to do.
pub fn why_open(state: ClaimState) -> &'static str {
    match state {
        ClaimState::Started => {
            "in progress (or waiting to be sent): erase it once it is completed or failed"
        }
        ClaimState::Pending => {
            "the provider has not given its final answer: erase it once the claim settles"
        }
        ClaimState::NeedsAttention => {
            "parked for a person: resolve it (claimd claims resolve ... --as completed|failed), then erase it"
        }
        ClaimState::Completed | ClaimState::Failed => "finished",
    }
}

/// Erases the finished claims `selection` names (nothing on a `dry_run`), recording `actor`
/// and `note` in each claim's history; lists open ones as not erased, with why.
pub async fn erase(
    store: &dyn ClaimStore,
    selection: &Selection,
    actor: &str,
    note: &str,
    dry_run: bool,
) -> StoreResult<Report> {
    let mut report = Report {
        dry_run,
        claims: Vec::new(),
    };
    for claim in selected(store, selection).await? {
        let line = |claim: &Claim, verdict, why: Option<&str>| Line {
            consumer: claim.consumer.clone(),
            tenant: claim.tenant.clone(),
            message_id: claim.message_id.clone(),
            state: claim.state,
            verdict,
            why: why.map(str::to_string),
        };
        let verdict = if claim.erased_utc.is_some() {
            line(&claim, Verdict::AlreadyErased, None)
        } else if !claim.state.is_terminal() {
            line(&claim, Verdict::Open, Some(why_open(claim.state)))
        } else if dry_run {
            line(&claim, Verdict::Erased, None)
        } else {
            match store.erase(claim.id, actor, note).await? {
                Some(erased) => line(&erased, Verdict::Erased, None),
                // It changed since it was read: say what it is now.
                None => match store
                    .find(&claim.consumer, &claim.tenant, &claim.message_id)
                    .await?
                {
                    Some(now) if now.erased_utc.is_some() => {
                        line(&now, Verdict::AlreadyErased, None)
                    }
                    Some(now) => line(&now, Verdict::Open, Some(why_open(now.state))),
                    None => continue,
                },
            }
        };
        report.claims.push(verdict);
    }
    Ok(report)
}

/// The claims a selection names: one message's, or a tenant's (every page of them).
async fn selected(store: &dyn ClaimStore, selection: &Selection) -> StoreResult<Vec<Claim>> {
    match selection {
        Selection::Message {
            consumer,
            tenant,
            message_id,
        } => Ok(store
            .find(consumer, tenant, message_id)
            .await?
            .into_iter()
            .collect()),
        Selection::Tenant(tenant) => {
            let mut all = Vec::new();
            let mut after = None;
            loop {
                let page = store
                    .list(&ClaimFilter {
                        tenant: Some(tenant.clone()),
                        after,
                        limit: PAGE,
                        ..Default::default()
                    })
                    .await?;
                after = ClaimCursor::next(&page, PAGE);
                all.extend(page);
                if after.is_none() {
                    return Ok(all);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_or_a_tenant_is_named() {
        assert_eq!(
            Selection::from_parts(Some("pay"), Some("m1"), ""),
            Ok(Selection::Message {
                consumer: "pay".into(),
                tenant: String::new(),
                message_id: "m1".into()
            })
        );
        assert_eq!(
            Selection::from_parts(None, None, "acme"),
            Ok(Selection::Tenant("acme".into()))
        );
        assert!(Selection::from_parts(None, None, "").is_err());
        assert!(Selection::from_parts(Some("pay"), None, "acme").is_err());
    }

    #[test]
    fn every_open_state_says_what_to_do() {
        for s in [
            ClaimState::Started,
            ClaimState::Pending,
            ClaimState::NeedsAttention,
        ] {
            assert!(why_open(s).contains("erase it"), "{s}");
        }
    }
}
