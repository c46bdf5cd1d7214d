//! Operator actions on parked claims, shared by the page (`/actions/preview|apply`) and the
//! command line (`claimd claims resolve|redrive --consumer ... --reason-prefix ...`): which
//! claims a bulk action selects, and acting on one claim through the store's guarded
//! transitions. Both front ends show the selection before acting and act on the claims they
//! showed, moving each only from the state, attempt and version it was shown at (parked,
//! attempt N, version V), so a claim that changed in between (another operator resolved it as
//! failed, or redrove it and its new attempt was parked again, or a provider event moved it
//! away and back) is reported, not changed.

use crate::domain::claim::{Claim, ClaimState};
use crate::store::{ClaimStore, Seen, StoreError, StoreResult};

/// The most claims one bulk action takes (a larger set: narrow the reason, or repeat).
pub const BULK_LIMIT: u32 = 200;

/// What an action does to each claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Settle as `completed` (the provider has the effect).
    Complete,
    /// Settle as `failed` (it does not and will not).
    Fail,
    /// Back to `started` for the next sweep, same key.
    Redrive,
}

impl Action {
    /// The resolve action for a decided state (`completed` or `failed`).
    pub fn resolve_as(to: ClaimState) -> Action {
        if to == ClaimState::Completed {
            Action::Complete
        } else {
            Action::Fail
        }
    }

    /// The form value: `complete`, `fail` or `redrive`.
    pub fn parse(s: &str) -> Option<Action> {
        match s {
            "complete" => Some(Action::Complete),
            "fail" => Some(Action::Fail),
            "redrive" => Some(Action::Redrive),
            _ => None,
        }
    }

    /// The state a resolve settles the claim in; `None` for a redrive.
    pub fn resolved_state(self) -> Option<ClaimState> {
        match self {
            Action::Complete => Some(ClaimState::Completed),
            Action::Fail => Some(ClaimState::Failed),
            Action::Redrive => None,
        }
    }

    /// The action in a few words: `resolve as completed`, `resolve as failed`, `redrive`.
    pub fn verb(self) -> &'static str {
        match self {
            Action::Complete => "resolve as completed",
            Action::Fail => "resolve as failed",
            Action::Redrive => "redrive",
        }
    }

    /// The form value.
    pub fn name(self) -> &'static str {
        match self {
            Action::Complete => "complete",
            Action::Fail => "fail",
            Action::Redrive => "redrive",
        }
    }

    /// What it does, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Action::Complete => "resolve as completed (the provider has the effect)",
            Action::Fail => "resolve as failed (the provider does not have it and never will)",
            Action::Redrive => {
                "redrive: back to started, sent again with the same key by the next sweep"
            }
        }
    }
}

/// One claim an action is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Consumer.
    pub consumer: String,
    /// Tenant (empty: none).
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// The attempt the claim was at when it was shown (`None`: a form from before this field,
    /// acting at any attempt).
    pub attempt: Option<i32>,
    /// The claim's version when it was shown ([`Claim::version`]; `None`: a form from before
    /// this field, acting at any version).
    pub version: Option<i64>,
}

impl Target {
    /// The claim's address, and the attempt and version it is at.
    pub fn of(claim: &Claim) -> Target {
        Target {
            consumer: claim.consumer.clone(),
            tenant: claim.tenant.clone(),
            message_id: claim.message_id.clone(),
            attempt: Some(claim.attempt),
            version: Some(claim.version),
        }
    }

    /// The form value: `consumer`, tab, `tenant`, tab, `message_id`, tab, attempt, tab,
    /// version (none of the first three can hold a tab).
    pub fn encode(&self) -> String {
        let attempt = self.attempt.map(|a| a.to_string()).unwrap_or_default();
        let version = self.version.map(|v| v.to_string()).unwrap_or_default();
        format!(
            "{}\t{}\t{}\t{attempt}\t{version}",
            self.consumer, self.tenant, self.message_id
        )
    }

    /// Reads [`Target::encode`]'s value (also the three- and four-field values of earlier
    /// pages).
    pub fn decode(s: &str) -> Option<Target> {
        let mut p = s.splitn(5, '\t');
        let (consumer, tenant, message_id) = (p.next()?, p.next()?, p.next()?);
        let attempt = match p.next() {
            None | Some("") => None,
            Some(a) => Some(a.parse().ok()?),
        };
        let version = match p.next() {
            None | Some("") => None,
            Some(v) => Some(v.parse().ok()?),
        };
        Some(Target {
            consumer: consumer.to_string(),
            tenant: tenant.to_string(),
            message_id: message_id.to_string(),
            attempt,
            version,
        })
    }

    /// `consumer/message_id`, with the tenant only when there is one (an empty tenant is no
    /// part of what a person reads).
    pub fn label(&self) -> String {
        if self.tenant.is_empty() {
            format!("{}/{}", self.consumer, self.message_id)
        } else {
            format!(
                "{}/{} (tenant {})",
                self.consumer, self.message_id, self.tenant
            )
        }
    }
}

/// The claims a bulk action selects.
#[derive(Debug, Clone)]
pub struct Selection {
    /// At most [`BULK_LIMIT`] parked claims, newest first.
    pub claims: Vec<Claim>,
    /// More than [`BULK_LIMIT`] matched: `claims` holds the newest of them.
    pub more: bool,
}

/// Parked (`needs_attention`) claims of `consumer` whose reason starts with `reason_prefix`
/// (empty: any reason), at most [`BULK_LIMIT`] of them.
pub async fn select_parked(
    store: &dyn ClaimStore,
    consumer: &str,
    reason_prefix: &str,
) -> StoreResult<Selection> {
    let mut claims = store
        .parked_by_reason(consumer, reason_prefix, BULK_LIMIT + 1)
        .await?;
    let more = claims.len() > BULK_LIMIT as usize;
    claims.truncate(BULK_LIMIT as usize);
    Ok(Selection { claims, more })
}

/// What an action did to one claim.
#[derive(Debug)]
pub enum Outcome {
    /// Done: the claim after the change.
    Done(Box<Claim>),
    /// Not changed: the claim is in a state the action does not apply to (it moved since it
    /// was shown).
    Skipped(ClaimState),
    /// Not changed: the claim is in the state it was shown in, but it changed since (another
    /// attempt, or moved away and back): what was shown no longer holds.
    Changed {
        /// The version shown.
        seen: i64,
        /// Its version now.
        now: i64,
    },
    /// Not changed: no such claim any more (pruned).
    Gone,
    /// Not changed: the store failed.
    Failed(StoreError),
}

impl Outcome {
    /// Whether the claim changed.
    pub fn done(&self) -> bool {
        matches!(self, Outcome::Done(_))
    }

    /// One line for a person: `now completed (attempt 2)`, `not changed: it is started now`.
    pub fn describe(&self) -> String {
        match self {
            Outcome::Done(c) => format!("now {} (attempt {})", c.state, c.attempt),
            Outcome::Skipped(s) => format!("not changed: it is {s} now"),
            Outcome::Changed { seen, now } => changed_since(*seen, *now),
            Outcome::Gone => "not changed: no such claim any more".to_string(),
            Outcome::Failed(e) => format!("not changed: the store failed ({e})"),
        }
    }
}

/// The refusal of an action on a claim that changed since it was read.
pub fn changed_since(seen: i64, now: i64) -> String {
    format!("not changed: the claim changed since you read it (version {seen}, now {now}); reload")
}

/// Acts on one claim of a [`Selection`] through the store's guarded transition, recorded in
/// its history as `actor` with `note`. The claim moves only if it is still parked at the
/// attempt and version it was shown at: one that another operator resolved or redrove since
/// (even if a later attempt parked it again), or that a provider event moved away and back,
/// is skipped.
pub async fn act(
    store: &dyn ClaimStore,
    action: Action,
    target: &Target,
    actor: &str,
    note: &str,
) -> Outcome {
    let t = target;
    // Every claim of a selection was parked when it was shown, at the attempt it carries.
    let seen = Some(Seen {
        state: ClaimState::NeedsAttention,
        attempt: t.attempt,
        version: t.version,
    });
    let result = match action.resolved_state() {
        Some(to) => {
            store
                .resolve(&t.consumer, &t.tenant, &t.message_id, to, actor, note, seen)
                .await
        }
        None => {
            store
                .redrive_noted(&t.consumer, &t.tenant, &t.message_id, actor, note, seen)
                .await
        }
    };
    match result {
        Ok(Some(Ok(c))) => Outcome::Done(Box::new(c)),
        Ok(Some(Err(s))) => refused(store, t, s).await,
        Ok(None) => Outcome::Gone,
        Err(e) => Outcome::Failed(e),
    }
}

/// Why a guarded transition refused `t`: the state it is in, or, when it is still in the state
/// it was shown in, the version it moved on to.
async fn refused(store: &dyn ClaimStore, t: &Target, state: ClaimState) -> Outcome {
    let (Some(seen), ClaimState::NeedsAttention) = (t.version, state) else {
        return Outcome::Skipped(state);
    };
    match store.get(&t.consumer, &t.tenant, &t.message_id).await {
        Ok(Some(c)) if c.version != seen && c.state == state => Outcome::Changed {
            seen,
            now: c.version,
        },
        Ok(Some(c)) => Outcome::Skipped(c.state),
        Ok(None) => Outcome::Gone,
        Err(e) => Outcome::Failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_round_trip_through_the_form() {
        let mut t = Target {
            consumer: "payments".into(),
            tenant: "".into(),
            message_id: "-odd id:1".into(),
            attempt: Some(3),
            version: Some(7),
        };
        assert_eq!(Target::decode(&t.encode()), Some(t.clone()));
        // A form from before the version was carried: any version.
        t.version = None;
        assert_eq!(Target::decode("payments\t\t-odd id:1\t3"), Some(t.clone()));
        assert_eq!(Target::decode("no-tabs"), None);
        assert_eq!(Target::decode("payments\t\tm\tthree"), None);
        // A form from before the attempt was carried: any attempt.
        t.attempt = None;
        assert_eq!(Target::decode("payments\t\t-odd id:1"), Some(t.clone()));
        assert_eq!(Target::decode(&t.encode()), Some(t.clone()));
        assert_eq!(t.label(), "payments/-odd id:1");
    }
}
