//! What drives claims to an outcome: settling an attempt (fenced on it), the markers and counts
//! a call keeps on its claim, taking over stale and due pending claims, and pruning old ones.

use crate::domain::claim::ClaimState;
use crate::store::enqueue::Registration;
use crate::store::{
    NewEvent, PruneResult, RetentionWindows, SettleItem, Settlement, StoreResult, TakenClaim,
    WaitingOrder,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// The engine's part of the store, used by the claimer (`mark_called`, settles), `settle`
/// (`Settler`: every settle, history line and re-send count), the sweeper (`take_stale`,
/// `peek_stale`, `mark_sweep`), the pending poller (`take_pending`, `settle_from`), the
/// run loop (`mark_destination`) and retention (`prune`). Every write that changes a claim is
/// fenced on the attempt its caller holds (I2).
#[async_trait]
pub trait EngineStore: Send + Sync {
    /// Settles (or annotates) a claim and records the event, fenced on `attempt` and
    /// `state = 'started'`. Returns `false` when the claim was taken over: nothing changed.
    async fn settle(
        &self,
        id: i64,
        attempt: i32,
        settlement: &Settlement,
        event: &NewEvent<'_>,
    ) -> StoreResult<bool>;

    /// Runs a database effect's write for `claim` and settles it as `settlement` says, in one
    /// transaction fenced like [`settle`](EngineStore::settle): `Ok(true)` committed both,
    /// `Ok(false)` the claim was taken over and nothing was applied; an error rolled both back
    /// (the transaction is cut after `timeout`, once it has its connection).
    async fn settle_applied(
        &self,
        effect: &dyn crate::store::db_effect::DatabaseEffect,
        claim: &crate::domain::claim::Claim,
        settlement: &Settlement,
        event: &NewEvent<'_>,
        timeout: std::time::Duration,
    ) -> Result<bool, crate::store::db_effect::DbEffectError>;

    /// Settles many claims in one round trip where the driver can, each fenced on its own
    /// `attempt` and `state = 'started'` exactly like [`settle`] (I2), each with its history
    /// line. Ids must be distinct. Returns, per item in order, whether it changed anything.
    ///
    /// [`settle`]: EngineStore::settle
    async fn settle_many(&self, items: &[SettleItem<'_>]) -> StoreResult<Vec<bool>> {
        let mut out = Vec::with_capacity(items.len());
        for i in items {
            out.push(
                self.settle(i.id, i.attempt, &i.settlement, &i.event)
                    .await?,
            );
        }
        Ok(out)
    }

    /// Settles a claim that is in state `from` at `attempt` and `version`, as [`settle`] does
    /// from `started`: a poll of a `pending` claim, a provider event on a claim in any state.
    /// The fence is the state, attempt and version the caller read (the version tells a claim
    /// that left the state and came back from the one read); `false`: it changed meanwhile,
    /// nothing was written.
    ///
    /// [`settle`]: EngineStore::settle
    async fn settle_from(
        &self,
        id: i64,
        attempt: i32,
        version: i64,
        from: ClaimState,
        settlement: &Settlement,
        event: &NewEvent<'_>,
    ) -> StoreResult<bool>;

    /// Records a history line without changing the claim.
    async fn record_event(&self, id: i64, attempt: i32, event: &NewEvent<'_>) -> StoreResult<()>;

    /// Records the answer of a fenced write that lost (the claim moved before it landed) as a
    /// history line of `attempt`, unfenced and changing nothing else: its detail is followed by
    /// what the claim had become (`(claim was pending@v7, attempt 2)`), read in the same
    /// statement. Nothing is written when the claim is gone.
    async fn record_fenced_out(
        &self,
        id: i64,
        attempt: i32,
        event: &NewEvent<'_>,
    ) -> StoreResult<()>;

    /// The id and state of the claim of (`consumer`, `tenant`, `message_id`), asked when a
    /// fenced write of it found nothing to change: `None` when no row has the key, so the
    /// claim vanished from the store (a failover to a standby that had not received it).
    /// Found by its key, not its id: a re-sent message may have created it again under a new
    /// id, and a new primary may hand a lost claim's id to another claim.
    async fn locate_claim(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<(i64, ClaimState)>>;

    /// Writes back `claim`, which vanished from the store while its worker held it, in
    /// `state` with what `settlement` says (the outcome its worker got), at its attempt and
    /// under a new id, with `event` as its history line and, when the state ends or pauses
    /// the claim, its outcome events as a settle writes them, in one transaction. A
    /// `started` claim is written back held by `event.actor` with its lease ended, for the
    /// next sweep. `None`: a row of its key exists (created again meanwhile) and nothing was
    /// written; never overwrites one.
    async fn restore_claim(
        &self,
        claim: &crate::domain::claim::Claim,
        settlement: &Settlement,
        state: ClaimState,
        event: &NewEvent<'_>,
    ) -> StoreResult<Option<i64>>;

    /// Before the first call of attempt 1, clears the claim's "not called yet" marker
    /// ([`NewClaim::mark_not_called`](crate::domain::claim::NewClaim::mark_not_called)), fenced like `settle`. `false`: the claim was taken
    /// over; do not call.
    async fn mark_called(&self, id: i64, attempt: i32) -> StoreResult<bool>;

    /// Counts one re-send after an unknown outcome (for `report`), fenced like `settle`.
    async fn note_resent(&self, id: i64, attempt: i32) -> StoreResult<bool>;

    /// Takes back one counted re-send whose call provably applied nothing (refused, a
    /// not-applied status), fenced like `settle`: such a send brings no claim closer to
    /// `max_sends`. A crash before it leaves the count one too high, never too low.
    async fn unnote_resent(&self, id: i64, attempt: i32) -> StoreResult<bool>;

    /// Takes up to `limit` claims of `consumer` still `started` whose lease ended before
    /// `expired_before` (database time; a pass passes its start so claims handed off during
    /// the pass wait for the next one): bumps `attempt`, sets the lease to `owner` for `lease`,
    /// all in one statement, skipping rows other sweepers hold. What belongs to an order key's
    /// line is left to it (I10): a scheduled claim with an order key
    /// ([`release_due_to_line`](crate::store::LineStore::release_due_to_line)), and an
    /// operator's redrive while its line has an earlier unfinished claim or another in flight
    /// (`hold`: `order_hold = "hold"`, a `pending` or parked claim holds it too).
    async fn take_stale(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        expired_before: DateTime<Utc>,
        hold: bool,
    ) -> StoreResult<Vec<TakenClaim>>;

    /// Takes up to `limit` `pending` claims of `consumer` whose next poll is due (their lease
    /// ended): leases them to `owner` for `lease` so no other poller asks meanwhile, attempt
    /// unchanged. [`TakenClaim::age`] is the time since the claim became pending.
    async fn take_pending(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
    ) -> StoreResult<Vec<TakenClaim>>;

    /// Takes up to `limit` enqueued claims of `consumer` that no worker holds yet (a
    /// producer's committed [`crate::store::enqueue`]: `started`, attempt 1, no lease owner):
    /// `aged` of them oldest first, the rest higher priority first, then oldest
    /// ([`crate::domain::priority`]): leases them to `owner` for `lease`, attempt unchanged, skipping rows
    /// another instance is taking. [`TakenClaim::age`] is the time since each was enqueued.
    /// `clear_marker_within`: the "not called yet" markers of those received within it go in
    /// the same write ([`crate::engine::policy::clear_marker_within`]; `None`: none); the taker
    /// clears any other with [`mark_called`](Self::mark_called) just before its call.
    async fn take_enqueued(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        clear_marker_within: Option<Duration>,
        aged: u32,
    ) -> StoreResult<Vec<TakenClaim>>;

    /// Takes up to `limit` waiting claims of `consumer` (`started`, attempt 1, no lease owner:
    /// enqueued, or waiting for their order key's line) in `order`: a claim with an order key
    /// only at the head of its line, and round-robin across tenants when `order.fair` is set.
    /// Leases them to `owner` for `lease`, attempt unchanged. Takes of one consumer's lines
    /// run one at a time across instances (PostgreSQL: a transaction-scoped advisory lock), so
    /// two claims of one line are never taken together. `clear_marker_within` as for
    /// [`take_enqueued`](Self::take_enqueued).
    async fn take_waiting(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        order: &WaitingOrder,
        clear_marker_within: Option<Duration>,
    ) -> StoreResult<Vec<TakenClaim>>;

    /// [`take_stale`](EngineStore::take_stale), round-robin across tenants by lease end
    /// (`fairness = "tenant"`), a tenant taking its weight in `weights` (default 1) per round;
    /// lines as `take_stale`, held as [`WaitingOrder::lines`] says.
    async fn take_stale_fair(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        expired_before: DateTime<Utc>,
        order: &WaitingOrder,
    ) -> StoreResult<Vec<TakenClaim>>;

    /// Writes (or rewrites) `consumer`'s entry in the registry producers' transactions read.
    async fn register_consumer(&self, consumer: &Registration) -> StoreResult<()>;

    /// `consumer`'s registered configuration generation and effect kind (the newest an
    /// instance registered); `None` when it is not registered.
    async fn registered_consumer(
        &self,
        consumer: &str,
    ) -> StoreResult<Option<crate::domain::generation::ConsumerGeneration>>;

    /// Stuck claims of `consumer` the sweeper would take (dry run), oldest lease first,
    /// shown with the attempt number a takeover would give them. Changes nothing.
    async fn peek_stale(&self, consumer: &str, limit: u32) -> StoreResult<Vec<TakenClaim>>;

    /// Records that a sweeper pass ended now.
    async fn mark_sweep(&self, instance: &str) -> StoreResult<()>;

    /// Writes this instance's view of `consumer`'s provider (JSON `detail`), and forgets the
    /// views no instance wrote for a day (stopped instances).
    async fn mark_destination(
        &self,
        consumer: &str,
        instance: &str,
        detail: &str,
    ) -> StoreResult<()>;

    /// Retention of finished records, `batch` rows per statement, under a lock so one instance
    /// prunes at a time: moves finished claims older than `windows.archive_after` to the
    /// archive (PostgreSQL), drops the archive's days whose retention is over, deletes
    /// terminal claims last changed before `now` minus their state's window, then old
    /// dead-letter records, sent outcome events and provider events. `dry_run` only counts.
    async fn prune(
        &self,
        windows: &RetentionWindows,
        batch: u32,
        dry_run: bool,
    ) -> StoreResult<PruneResult>;

    /// Erases `consumer`'s finished (`completed`, `failed`) claims last changed more than
    /// `keep` ago and not erased yet — payload emptied, provider response and error cleared,
    /// `erased_utc` set, a history line by `retention` — `batch` per statement; the rows and
    /// their fingerprints stay. Returns how many it erased.
    async fn erase_due(&self, consumer: &str, keep: Duration, batch: u32) -> StoreResult<u64>;

    /// How many claims [`EngineStore::erase_due`] would erase now, changing nothing.
    async fn erase_due_count(&self, consumer: &str, keep: Duration) -> StoreResult<u64>;
}
