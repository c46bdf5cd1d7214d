//! The claim store: one trait, [`ClaimStore`], implemented once by [`sql_store::SqlStore`]
//! over a [`dialect::Dialect`] per database ([`postgres::PgStore`], [`sqlite::SqliteStore`]).
//!
//! - `sql_store`: the one body — every operation, its arguments and its rules.
//! - `batch`: group commit — concurrent claims and settles written together, for both.
//! - `dialect`: what a database supplies (statement texts, how a time is stored, the extras
//!   only it has) and the binding and row reading shared by all.
//! - `args`: what each statement binds, and what a key already taken means for a claim.
//! - `error`: [`StoreError`]; `url`: store URLs redacted for display and checked at load.
//! - `rows`: claims from rows. `postgres` (`sql`, `many`) and `sqlite` (`sql`, `many`): the
//!   dialects.
//!
//! Every state change is a conditional update fenced on `attempt` and `state = 'started'`
//! (invariant I2), and bumps the claim's `version`; a write decided on what someone read (a
//! provider event, a poll, an operator's form) is fenced on that version too. Every time is
//! the database's clock, never the worker's.

#[macro_use]
pub mod dialect;
mod args;
mod batch;
mod error;
pub mod outbox;
pub mod postgres;
mod rows;
pub mod sql_store;
pub mod sqlite;
mod url;
pub mod writes;

pub use error::{StoreError, StoreResult};
pub use url::{check_url, redact_url};

pub use crate::domain::claim::Handoff;
use crate::domain::claim::{Claim, ClaimState, NewClaim};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// What an operator saw of a claim when choosing an action on it ([`ClaimStore::resolve`],
/// [`ClaimStore::redrive`]): the move happens only from that state, and at that attempt and
/// version when they are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The state shown.
    pub state: ClaimState,
    /// The attempt shown; `None`: any.
    pub attempt: Option<i32>,
    /// The version shown ([`Claim::version`]); `None`: any.
    pub version: Option<i64>,
}

impl Seen {
    /// Exactly the claim as it was read: its state, attempt and version.
    pub fn of(claim: &Claim) -> Seen {
        Seen {
            state: claim.state,
            attempt: Some(claim.attempt),
            version: Some(claim.version),
        }
    }
}

/// The answer to a claim attempt.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    /// A new claim was committed: the caller now owns attempt 1.
    Created(Claim),
    /// The same key with the same fingerprint: a success that performs nothing (I5).
    Duplicate(Claim),
    /// The same key with another payload: refused, counted (I5).
    Mismatch(Claim),
}

/// How a claim leaves `started` (or stays there, with a note).
#[derive(Debug, Clone, Default)]
pub struct Settlement {
    /// The new state. `Started` keeps the claim for the sweeper.
    pub state: Option<ClaimState>,
    /// Provider status (HTTP status or SMTP reply code).
    pub provider_status: Option<i32>,
    /// Up to 4 KiB of the provider's answer.
    pub provider_response: Option<String>,
    /// Error or reason (required for `needs_attention`).
    pub error: Option<String>,
    /// The outcome came from the status endpoint.
    pub reconciled: bool,
    /// A hand-off to the sweeper, and how the attempt let go: [`Handoff::NotApplied`] after
    /// answers that prove nothing was applied (503, 429, connection refused), so the sweeper
    /// may send again even under `on_unknown = "park"`; [`Handoff::Undecided`] when an
    /// outcome is still unknown and only waits for an answer. Either counts the attempt as a
    /// wait (`waits + 1`), not towards `max_attempts`.
    pub handoff: Option<Handoff>,
    /// Set the lease to end this long from now (database clock) instead of letting it run out:
    /// zero hands the claim to the next sweep, more makes it wait (a backoff, a destination
    /// that is down or rate limited). For a `pending` claim: when it is next polled.
    pub lease_for: Option<Duration>,
    /// The provider's own id of the effect, kept on the claim (its events find it by this).
    pub provider_id: Option<String>,
}

/// One line of a claim's history: an attempt's outcome, a sweeper decision or an operator note.
#[derive(Debug, Clone, Serialize)]
pub struct ClaimEvent {
    /// The claim's `attempt` when it happened.
    pub attempt: i32,
    /// When (database time).
    pub at_utc: DateTime<Utc>,
    /// Worker instance or operator.
    pub actor: String,
    /// `perform`, `reconcile`, `sweep`, `park`, `resolve`, `redrive`, `takeover`.
    pub action: String,
    /// What came of it (`completed`, `transient`, `unknown`, `rejected`, `found`, ...).
    pub outcome: String,
    /// Provider status, when there was an answer.
    pub provider_status: Option<i32>,
    /// Error text or operator note.
    pub detail: Option<String>,
}

/// A new history line (the time is the database's).
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    /// Worker instance or operator.
    pub actor: &'a str,
    /// See [`ClaimEvent::action`].
    pub action: &'a str,
    /// See [`ClaimEvent::outcome`].
    pub outcome: &'a str,
    /// Provider status.
    pub provider_status: Option<i32>,
    /// Error text or note.
    pub detail: Option<&'a str>,
}

/// One claim to settle in [`ClaimStore::settle_many`].
#[derive(Debug, Clone)]
pub struct SettleItem<'a> {
    /// Claim id.
    pub id: i64,
    /// The attempt this worker holds (the fence).
    pub attempt: i32,
    /// How it settles.
    pub settlement: Settlement,
    /// Its history line.
    pub event: NewEvent<'a>,
}

/// Which claims `claims list` and `GET /v1/claims` show.
#[derive(Debug, Clone, Default)]
pub struct ClaimFilter {
    /// Only this state.
    pub state: Option<ClaimState>,
    /// Only this consumer.
    pub consumer: Option<String>,
    /// Only `started` claims whose lease has expired.
    pub stuck: bool,
    /// Only claims received at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only claims received before this time.
    pub until: Option<DateTime<Utc>>,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only claims whose message id, idempotency key or provider id is this text or starts
    /// with it, or whose tenant is this text (empty: no search).
    pub search: Option<String>,
    /// Only claims after this position in the newest-first order: the next page.
    pub after: Option<ClaimCursor>,
    /// At most this many (newest first).
    pub limit: u32,
}

/// A position in the newest-first order of claims (receive time, then id): where the next
/// page of a listing starts. Written as `<receive time in ms>.<id>`; a keyset, so a page
/// costs the same wherever it is and claims arriving meanwhile shift nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimCursor {
    /// The receive time of the last claim shown.
    pub received_utc: DateTime<Utc>,
    /// Its id.
    pub id: i64,
}

impl ClaimCursor {
    /// The position just after `claim`.
    pub fn after(claim: &Claim) -> ClaimCursor {
        ClaimCursor {
            received_utc: claim.received_utc,
            id: claim.id,
        }
    }

    /// The cursor as text: `<µs>.<id>`, microseconds since the epoch. PostgreSQL keeps receive
    /// times to the microsecond: a cursor in milliseconds fell before the last claim it was
    /// read after, and the next page left out the claims received in that millisecond.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.received_utc.timestamp_micros(), self.id)
    }

    /// The cursor `next` of a page of `limit` claims: after its last claim when the page is
    /// full (there may be more), none otherwise.
    pub fn next(page: &[Claim], limit: u32) -> Option<ClaimCursor> {
        (page.len() >= limit as usize && limit > 0)
            .then(|| page.last().map(ClaimCursor::after))
            .flatten()
    }
}

impl std::str::FromStr for ClaimCursor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("cursor {s:?} is not one a listing gave (<µs>.<id>)");
        let (us, id) = s.split_once('.').ok_or_else(bad)?;
        let us: i64 = us.parse().map_err(|_| bad())?;
        let id: i64 = id.parse().map_err(|_| bad())?;
        let received_utc = DateTime::<Utc>::from_timestamp_micros(us).ok_or_else(bad)?;
        Ok(ClaimCursor { received_utc, id })
    }
}

/// A claim the sweeper took over: attempt already bumped, lease renewed.
#[derive(Debug, Clone)]
pub struct TakenClaim {
    /// The claim after takeover.
    pub claim: Claim,
    /// How the previous attempt let go, when it let go cleanly (not a crash or a timeout).
    pub handoff: Option<Handoff>,
    /// Seconds since it was received (database time).
    pub age: Duration,
    /// Who held the lease it was taken from (an instance name), when one was recorded.
    pub held_by: Option<String>,
}

/// A provider event as it is recorded ([`ClaimStore::record_provider_event`]).
#[derive(Debug, Clone)]
pub struct ProviderEventRecord<'a> {
    /// Consumer.
    pub consumer: &'a str,
    /// The provider's event id (unique per consumer).
    pub event_id: &'a str,
    /// The event's type, like `payment_intent.succeeded` (`""` when it has none).
    pub event_type: &'a str,
    /// The provider's id of the object the event is about.
    pub object_id: Option<&'a str>,
    /// The claim it was applied to; `None`: claimd has no claim for the object.
    pub claim_id: Option<i64>,
    /// What came of it (`settled`, `same`, `stale`, `conflict`, `unmapped`,
    /// `unknown_object`).
    pub result: &'a str,
}

/// A provider event about an object claimd has no claim for, listed for reconciliation.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UnmatchedEvent {
    /// Consumer.
    pub consumer: String,
    /// The provider's event id.
    pub event_id: String,
    /// Its type.
    pub event_type: String,
    /// The provider's id of the object.
    pub object_id: Option<String>,
    /// When it was received (database time).
    pub received_utc: DateTime<Utc>,
}

/// A claim as `claimd reconcile --ledger` reads it (in key order, with its payload).
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerClaim {
    /// Row id (the keyset's tie-breaker).
    pub id: i64,
    /// Tenant.
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// The idempotency key the provider saw.
    pub idem_key: String,
    /// State.
    pub state: ClaimState,
    /// When it was received (database time).
    pub received_utc: DateTime<Utc>,
    /// The message.
    pub payload: Vec<u8>,
    /// The provider's id of the effect, when the claim recorded one.
    pub provider_id: Option<String>,
}

/// A consumer's last ledger reconciliation, as stored.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LedgerRunRecord {
    /// Consumer.
    pub consumer: String,
    /// When it was stored (database time).
    pub at_utc: DateTime<Utc>,
    /// Its summary (JSON, [`crate::ops::ledger::Summary`]).
    pub summary: serde_json::Value,
}

/// One instance's view of a consumer's provider, as it last wrote it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DestinationRecord {
    /// Consumer.
    pub consumer: String,
    /// The instance that wrote it.
    pub instance: String,
    /// When (database time).
    pub at_utc: DateTime<Utc>,
    /// What it wrote (JSON: state, rate, resumes_in_s, failures).
    pub detail: serde_json::Value,
}

/// Per-consumer counts for the report.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ConsumerCounts {
    /// Consumer name.
    pub consumer: String,
    /// Deliveries seen: claims + duplicates + mismatches.
    pub received: i64,
    /// Duplicate deliveries recognised.
    pub duplicates: i64,
    /// Deliveries that reused a key with another payload.
    pub payload_mismatches: i64,
    /// Claims in `started`.
    pub started: i64,
    /// `started` claims whose lease has expired.
    pub stuck: i64,
    /// `started` claims waiting for their provider, not stuck: handed back after answers that
    /// applied nothing, held back by its breaker or rate limit, or after a status lookup
    /// without an answer, each until its lease ends.
    pub waiting: i64,
    /// Claims in `pending`: accepted by the provider, not final (not stuck, not completed).
    pub pending: i64,
    /// Claims in `completed`.
    pub completed: i64,
    /// Claims in `failed`.
    pub failed: i64,
    /// Claims in `needs_attention`.
    pub needs_attention: i64,
    /// Claims whose effect was sent again after an unknown outcome.
    pub resent: i64,
    /// Broker messages refused and published to the dead-letter exchange (bad id, body too
    /// large, payload mismatch, unusable payload), within the report window.
    pub dead_lettered: i64,
    /// Age of the oldest `started` claim, in seconds.
    pub oldest_started_age_s: Option<f64>,
    /// How long the oldest `pending` claim has been pending, in seconds.
    pub oldest_pending_age_s: Option<f64>,
    /// Median receive-to-complete time, seconds.
    pub p50_complete_s: Option<f64>,
    /// 95th percentile receive-to-complete time, seconds.
    pub p95_complete_s: Option<f64>,
}

/// Per-consumer counts assembled from several queries (window, dead letters, open work), in
/// consumer order. Shared by the drivers.
#[derive(Debug, Default)]
pub(crate) struct CountsByConsumer(std::collections::BTreeMap<String, ConsumerCounts>);

impl CountsByConsumer {
    /// The counts of `consumer`, zero until filled.
    pub(crate) fn get(&mut self, consumer: String) -> &mut ConsumerCounts {
        self.0
            .entry(consumer.clone())
            .or_insert_with(|| ConsumerCounts {
                consumer,
                ..Default::default()
            })
    }

    /// Takes the open-work fields from `open` (the rows of `open_counts`).
    pub(crate) fn add_open(&mut self, open: Vec<ConsumerCounts>) {
        for o in open {
            let c = self.get(o.consumer);
            c.started = o.started;
            c.stuck = o.stuck;
            c.waiting = o.waiting;
            c.needs_attention = o.needs_attention;
            c.pending = o.pending;
            c.oldest_started_age_s = o.oldest_started_age_s;
            c.oldest_pending_age_s = o.oldest_pending_age_s;
        }
    }

    /// The counts, by consumer name.
    pub(crate) fn into_vec(self) -> Vec<ConsumerCounts> {
        self.0.into_values().collect()
    }
}

/// What retention did (or would do).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneResult {
    /// Rows deleted (or eligible, on a dry run).
    pub deleted: u64,
    /// Statements issued.
    pub batches: u32,
    /// Another instance held the retention lock; nothing was done.
    pub skipped_locked: bool,
    /// Dead-letter records (counts only; the messages live in the broker) deleted, or
    /// eligible on a dry run, by the same window.
    pub dead_letters_deleted: u64,
}

/// The claim store. Implementations: [`postgres::PgStore`], [`sqlite::SqliteStore`].
#[async_trait]
pub trait ClaimStore: Send + Sync + 'static {
    /// `postgres` or `sqlite`.
    fn dialect(&self) -> &'static str;

    /// Applies the embedded migrations.
    async fn migrate(&self) -> StoreResult<()>;

    /// Checks the store answers.
    async fn ping(&self) -> StoreResult<()>;

    /// The database's clock.
    async fn now(&self) -> StoreResult<DateTime<Utc>>;

    /// Inserts the claim in a transaction of its own and commits it, or recognises a duplicate
    /// or a mismatch (counting it). Only the unique key decides "duplicate".
    async fn claim(&self, new: &NewClaim) -> StoreResult<ClaimOutcome>;

    /// Claims many at once (one round trip where the driver can); same answers as [`claim`].
    ///
    /// [`claim`]: ClaimStore::claim
    async fn claim_many(&self, new: &[NewClaim]) -> StoreResult<Vec<ClaimOutcome>> {
        let mut out = Vec::with_capacity(new.len());
        for n in new {
            out.push(self.claim(n).await?);
        }
        Ok(out)
    }

    /// One claim by its identity.
    async fn get(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> StoreResult<Option<Claim>>;

    /// Settles (or annotates) a claim and records the event, fenced on `attempt` and
    /// `state = 'started'`. Returns `false` when the claim was taken over: nothing changed.
    async fn settle(
        &self,
        id: i64,
        attempt: i32,
        settlement: &Settlement,
        event: &NewEvent<'_>,
    ) -> StoreResult<bool>;

    /// Settles many claims in one round trip where the driver can, each fenced on its own
    /// `attempt` and `state = 'started'` exactly like [`settle`] (I2), each with its history
    /// line. Ids must be distinct. Returns, per item in order, whether it changed anything.
    ///
    /// [`settle`]: ClaimStore::settle
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
    /// [`settle`]: ClaimStore::settle
    async fn settle_from(
        &self,
        id: i64,
        attempt: i32,
        version: i64,
        from: ClaimState,
        settlement: &Settlement,
        event: &NewEvent<'_>,
    ) -> StoreResult<bool>;

    /// The claim of `consumer` whose provider id is `provider_id` (the most recent when the
    /// provider reused one).
    async fn find_by_provider_id(
        &self,
        consumer: &str,
        provider_id: &str,
    ) -> StoreResult<Option<Claim>>;

    /// Whether `consumer` already took the provider event `event_id`.
    async fn provider_event_seen(&self, consumer: &str, event_id: &str) -> StoreResult<bool>;

    /// Records a provider event once (a second record of the same id changes nothing).
    async fn record_provider_event(&self, event: &ProviderEventRecord<'_>) -> StoreResult<()>;

    /// Claims of `consumer` received in `[from, to)`, in key order (byte order, then id)
    /// after the keyset position `after` (`("", 0)` for the first page), at most `limit`.
    async fn ledger_claims(
        &self,
        consumer: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        after: (&str, i64),
        limit: u32,
    ) -> StoreResult<Vec<LedgerClaim>>;

    /// Keeps `consumer`'s last ledger run's summary (JSON), replacing the one before.
    async fn save_ledger_run(&self, consumer: &str, summary: &str) -> StoreResult<()>;

    /// Every consumer's last ledger run.
    async fn ledger_runs(&self) -> StoreResult<Vec<LedgerRunRecord>>;

    /// Provider events about objects claimd has no claim for, received since `since` (all
    /// when `None`), newest first, at most `limit`.
    async fn unmatched_provider_events(
        &self,
        since: Option<DateTime<Utc>>,
        limit: u32,
    ) -> StoreResult<Vec<UnmatchedEvent>>;

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

    /// Before the first call of attempt 1, clears the claim's "not called yet" marker
    /// ([`NewClaim::mark_not_called`]), fenced like `settle`. `false`: the claim was taken
    /// over; do not call.
    async fn mark_called(&self, id: i64, attempt: i32) -> StoreResult<bool>;

    /// Counts one re-send after an unknown outcome (for `report`), fenced like `settle`.
    async fn note_resent(&self, id: i64, attempt: i32) -> StoreResult<bool>;

    /// Takes back one counted re-send whose call provably applied nothing (refused, a
    /// not-applied status), fenced like `settle`: such a send brings no claim closer to
    /// `max_sends`. A crash before it leaves the count one too high, never too low.
    async fn unnote_resent(&self, id: i64, attempt: i32) -> StoreResult<bool>;

    /// Claims matching the filter, newest first.
    async fn list(&self, filter: &ClaimFilter) -> StoreResult<Vec<Claim>>;

    /// Parked (`needs_attention`) claims of `consumer` whose reason (`last_error`) starts with
    /// `reason_prefix` (empty: any), newest first, at most `limit`: what a bulk operator action
    /// selects.
    async fn parked_by_reason(
        &self,
        consumer: &str,
        reason_prefix: &str,
        limit: u32,
    ) -> StoreResult<Vec<Claim>>;

    /// The claim's history, oldest first.
    async fn events(&self, id: i64) -> StoreResult<Vec<ClaimEvent>>;

    /// Takes up to `limit` claims of `consumer` still `started` whose lease ended before
    /// `expired_before` (database time; a pass passes its start so claims handed off during
    /// the pass wait for the next one): bumps `attempt`, sets the lease to `owner` for `lease`,
    /// all in one statement, skipping rows other sweepers hold.
    async fn take_stale(
        &self,
        consumer: &str,
        limit: u32,
        owner: &str,
        lease: Duration,
        expired_before: DateTime<Utc>,
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

    /// Stuck claims of `consumer` the sweeper would take (dry run), oldest lease first,
    /// shown with the attempt number a takeover would give them. Changes nothing.
    async fn peek_stale(&self, consumer: &str, limit: u32) -> StoreResult<Vec<TakenClaim>>;

    /// Operator decision on a `needs_attention` or `failed` claim. Returns the claim after
    /// the change, or `None` when no such claim exists. Refuses other states, and with
    /// `expected` (what the operator saw) every state but that one and every other attempt,
    /// in the same statement, so a claim another operator or a sweep moved in between is left
    /// as they left it.
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
    ) -> StoreResult<Option<Result<Claim, ClaimState>>>;

    /// Puts a `needs_attention` or `failed` claim back to `started` with an expired lease
    /// (and a new attempt number) so the next sweep performs it with the same key. `expected`
    /// as for [`ClaimStore::resolve`].
    async fn redrive(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        actor: &str,
        expected: Option<Seen>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>> {
        self.redrive_noted(consumer, tenant, message_id, actor, "", expected)
            .await
    }

    /// [`ClaimStore::redrive`] with the operator's `note` (empty: none) kept in the same
    /// history line as the state the claim left.
    async fn redrive_noted(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
        actor: &str,
        note: &str,
        expected: Option<Seen>,
    ) -> StoreResult<Option<Result<Claim, ClaimState>>>;

    /// Records that a broker message of `consumer` was dead-lettered for `reason` (a reason
    /// class such as `payload_mismatch`). `message_id` is stored printable and cut to 255 bytes.
    async fn record_dead_letter(
        &self,
        consumer: &str,
        reason: &str,
        message_id: Option<&str>,
    ) -> StoreResult<()>;

    /// Per-consumer counts, over claims received (and messages dead-lettered) since `since`
    /// (all when `None`).
    async fn counts(&self, since: Option<DateTime<Utc>>) -> StoreResult<Vec<ConsumerCounts>>;

    /// Open work per consumer over the whole table (`started`, stuck, `needs_attention`,
    /// oldest started age); the other fields stay zero. Cheap: partial indexes.
    async fn open_counts(&self) -> StoreResult<Vec<ConsumerCounts>>;

    /// Records that a sweeper pass ended now.
    async fn mark_sweep(&self, instance: &str) -> StoreResult<()>;

    /// Commits a one-row write that changes nothing else (this instance's write-probe
    /// heartbeat), to learn whether the store takes writes (readiness, [`writes`]).
    async fn probe_write(&self, instance: &str) -> StoreResult<()>;

    /// When the last sweeper pass (any instance) ended.
    async fn last_sweep(&self) -> StoreResult<Option<DateTime<Utc>>>;

    /// Writes this instance's view of `consumer`'s provider (JSON `detail`), and forgets the
    /// views no instance wrote for a day (stopped instances).
    async fn mark_destination(
        &self,
        consumer: &str,
        instance: &str,
        detail: &str,
    ) -> StoreResult<()>;

    /// Every instance's latest view of each consumer's provider.
    async fn destinations(&self) -> StoreResult<Vec<DestinationRecord>>;

    /// Makes the settles of `consumers` (those with an outcome destination) write outcome
    /// events ([`outbox`]). Set once, before the first settle; later calls change nothing.
    fn set_outcome_consumers(&self, consumers: Vec<String>);

    /// The consumers whose settles write outcome events.
    fn outcome_consumers(&self) -> Vec<String>;

    /// Holds `consumer`'s outcome relay for `owner` for `lease` from now (taking it when it
    /// is free or its holder's lease ran out, renewing it when it is `owner`'s already).
    /// `false`: another owner holds it. One row write.
    async fn hold_outcome_relay(
        &self,
        consumer: &str,
        owner: &str,
        lease: Duration,
    ) -> StoreResult<bool>;

    /// Up to `limit` unsent outcome events of `consumer` that are due, in order; a claim's
    /// event only when every earlier event of that claim was sent. Reads only: the caller
    /// holds the consumer's relay ([`ClaimStore::hold_outcome_relay`]).
    async fn due_outcomes(
        &self,
        consumer: &str,
        limit: u32,
    ) -> StoreResult<Vec<outbox::OutcomeEvent>>;

    /// Lets go of `consumer`'s relay if `owner` holds it (at shutdown), so that another
    /// instance takes it over at once rather than when the lease runs out.
    async fn release_outcome_relay(&self, consumer: &str, owner: &str) -> StoreResult<()>;

    /// Marks these events sent (their destination confirmed them). Returns how many changed.
    async fn mark_outcomes_sent(&self, seqs: &[i64]) -> StoreResult<u64>;

    /// Gives these events back, to be tried again after `after`, recording `error`.
    async fn retry_outcomes(&self, seqs: &[i64], after: Duration, error: &str) -> StoreResult<()>;

    /// Unsent outcome events per consumer, with the oldest one's age.
    async fn outbox_backlog(&self) -> StoreResult<Vec<outbox::OutboxBacklog>>;

    /// Deletes terminal claims last changed before `now - keep`, `batch` rows per statement,
    /// under a lock so one instance prunes at a time. `dry_run` only counts.
    async fn prune(&self, keep: Duration, batch: u32, dry_run: bool) -> StoreResult<PruneResult>;
}

/// A shared store handle.
pub type Store = Arc<dyn ClaimStore>;

/// Opens the store named by `url`, with batched writes (see [`open_with`]).
pub async fn open(url: &str, max_connections: u32) -> StoreResult<Store> {
    open_with(url, max_connections, true).await
}

/// Opens the store named by `url`. `batch_writes` lets the driver commit concurrent claims
/// and settles together (see [`sql_store::SqlStore`]); `false` commits each on its own.
pub async fn open_with(url: &str, max_connections: u32, batch_writes: bool) -> StoreResult<Store> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let pg = postgres::PgStore::connect(url, max_connections).await?;
        Ok(Arc::new(if batch_writes { pg } else { pg.unbatched() }))
    } else if url.starts_with("sqlite:") {
        let lite = sqlite::SqliteStore::connect(url, max_connections).await?;
        Ok(Arc::new(if batch_writes { lite } else { lite.unbatched() }))
    } else {
        Err(StoreError::BadUrl(url.to_string()))
    }
}

/// A message id as a dead-letter record keeps it: control characters escaped, at most 255 bytes.
pub fn printable_id(id: &str) -> String {
    let escaped: String = id.chars().flat_map(char::escape_default).collect();
    truncate(&escaped, 255)
}

/// Cuts text to at most `max` bytes on a character boundary.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}
