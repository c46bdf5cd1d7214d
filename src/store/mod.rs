//! The claim store: one trait, [`ClaimStore`], made of one trait per role ([`roles`]: intake,
//! engine, operator, outbox, ledger, reports), implemented once by [`sql_store::SqlStore`]
//! over a [`dialect::Dialect`] per database ([`postgres::PgStore`], [`sqlite::SqliteStore`]).
//!
//! - `roles`: who calls what — [`IntakeStore`], [`EngineStore`], [`OperatorStore`],
//!   [`OutboxStore`], [`LedgerStore`], [`ReportStore`].
//! - `sql_store`: the one body — every operation, its arguments and its rules, one file per
//!   role.
//! - `batch`: group commit — concurrent claims and settles written together, for both.
//! - `dialect`: what a database supplies (statement texts, how a time is stored, the extras
//!   only it has) and the binding and row reading shared by all.
//! - `args`: what each statement binds, and what a key already taken means for a claim.
//! - `db_effect`: [`db_effect::DatabaseEffect`], a write that commits with its claim's settle.
//! - `error`: [`StoreError`]; `url`: store URLs redacted for display and checked at load.
//! - `replication`: whether an acknowledged claim is on a standby yet (PostgreSQL).
//! - `read_replica`: operators' searches, reports and ledger reads on a read replica
//!   (`[store] read_url`), with its lag, and what happens when it cannot be read.
//! - `pooler`: running statements through a pooler in transaction mode (PostgreSQL).
//! - `audit`: operator accounts and the operator audit ([`AccountStore`]).
//! - `rows`: claims from rows. `postgres` (`sql`, `many`) and `sqlite` (`sql`, `many`): the
//!   dialects.
//!
//! Every state change is a conditional update fenced on `attempt` and `state = 'started'`
//! (invariant I2), and bumps the claim's `version`; a write decided on what someone read (a
//! provider event, a poll, an operator's form) is fenced on that version too. Every time is
//! the database's clock, never the worker's.

pub mod audit;
pub mod db_effect;
#[macro_use]
pub mod dialect;
mod args;
mod batch;
pub mod embedded_migrations;
pub mod enqueue;
mod error;
pub mod hosts;
pub mod index_rebuild;
pub mod migration_plan;
pub mod online_steps;
pub mod outbox;
pub mod pending_migrations;
pub mod pooler;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod read_replica;
pub mod replication;
pub mod roles;
mod rows;
pub mod schema_window;
pub mod sealing;
pub mod sql_store;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod storage_health;
mod url;
pub mod writes;

pub use error::{StoreError, StoreResult, driver_words};
pub use roles::{
    AccountStore, EngineStore, IntakeStore, LedgerStore, LineHead, LineStore, OperatorStore,
    OutboxStore, ReportStore, ScheduleSlot, ScheduleStore, SealStore,
};
pub use url::{check_url, redact_url};

pub use crate::domain::claim::Handoff;
use crate::domain::claim::{Claim, ClaimState};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// What an operator saw of a claim when choosing an action on it ([`OperatorStore::resolve`],
/// [`OperatorStore::redrive`]): the move happens only from that state, and at that attempt and
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
    /// The follow-up claims this settle creates, in its transaction, when it changes the
    /// claim (docs/follow-ups.md); empty for consumers without `follow_ups`.
    pub follow_ups: Vec<FollowUpClaim>,
}

/// A claim's follow-up chain ([`OperatorStore::family`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClaimFamily {
    /// The claim whose settle created this one, while it is stored.
    pub parent: Option<Claim>,
    /// The claims this one's settles created, oldest first.
    pub children: Vec<Claim>,
}

/// A claim a settle creates for another consumer: waiting for that consumer's pickup, its
/// parent the settled claim, `ON CONFLICT DO NOTHING` on its identity (a settle retried
/// creates it once).
#[derive(Debug, Clone, Default)]
pub struct FollowUpClaim {
    /// The consumer that performs it.
    pub consumer: String,
    /// The parent's tenant.
    pub tenant: String,
    /// `<parent message id>:<step>`.
    pub message_id: String,
    /// Rendered from the consumer's key template.
    pub idem_key: String,
    /// The fingerprint of the payload (`sealing::fingerprint`).
    pub fingerprint: String,
    /// The payload in clear: sealed as it is written when encryption at rest is on.
    pub payload: Vec<u8>,
    /// `application/json`.
    pub content_type: String,
    /// Why it is created parked (`needs_attention`) instead of waiting: a value its template
    /// points at is missing. `None`: created waiting for its pickup.
    pub parked: Option<String>,
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
    /// `perform`, `reconcile`, `sweep`, `park`, `resolve`, `redrive`, `takeover`, `restore`
    /// (a claim written back after it vanished from the store).
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

/// One claim to settle in [`EngineStore::settle_many`].
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
    /// Its priority ([`crate::domain::priority`]); the default for takes that do not read it
    /// (the sweeper's).
    pub priority: i16,
    /// The message id of a `pending` or `needs_attention` claim of its order key's line that
    /// it went ahead of (`order_hold = "skip"`); `None` for every other take.
    pub went_ahead_of: Option<String>,
}

/// How [`EngineStore::take_waiting`] chooses among waiting claims (docs/flow-control.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaitingOrder {
    /// `Some(hold)`: claims with an order key are taken only at the head of their line (no
    /// earlier unfinished claim of the key, none of it in flight); `hold`: a `pending` or
    /// `needs_attention` claim holds the claims behind it. `None`: order keys are ignored.
    pub lines: Option<bool>,
    /// `Some(weights)`: round-robin over the tenants with waiting claims, a tenant taking
    /// its weight (default 1) per round, each tenant's claims by priority, then oldest.
    /// `None`: by priority, then oldest.
    pub fair: Option<std::collections::BTreeMap<String, u32>>,
    /// How many of the take go oldest first whatever their priority (the aged share,
    /// [`crate::domain::priority::aged_share`]); not under `fair`, whose turns bound a
    /// tenant's wait instead.
    pub aged: u32,
}

impl WaitingOrder {
    /// The tenants' weights as the statements read them: a JSON object.
    pub(crate) fn weights_json(&self) -> String {
        serde_json::to_string(self.fair.as_ref().unwrap_or(&Default::default()))
            .unwrap_or_else(|_| "{}".into())
    }
}

/// A provider event as it is recorded ([`IntakeStore::record_provider_event`]).
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
    /// `started` claims that wait, not stuck and not in flight: for their provider (handed
    /// back after answers that applied nothing, held back by its breaker or rate limit, or
    /// after a status lookup without an answer, each until its lease ends), in their order
    /// key's line (`in_line`), or for their scheduled time (`scheduled`).
    pub waiting: i64,
    /// Of `waiting`: claims waiting in their order key's line.
    pub in_line: i64,
    /// Of `waiting`: scheduled sends whose time has not come.
    pub scheduled: i64,
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
    /// Age of the oldest `started` claim in flight or stuck, in seconds: from its receipt, or
    /// from its scheduled time for a scheduled send. Claims that wait in their line or for
    /// their time are left out (`None` when every started claim waits so).
    pub oldest_started_age_s: Option<f64>,
    /// How long the oldest `pending` claim has been pending, in seconds.
    pub oldest_pending_age_s: Option<f64>,
    /// Median time to complete, seconds: from receipt, or from the scheduled time of a
    /// scheduled send.
    pub p50_complete_s: Option<f64>,
    /// 95th percentile time to complete (as `p50_complete_s`), seconds.
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
            c.in_line = o.in_line;
            c.scheduled = o.scheduled;
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

/// How long retention keeps each kind of finished record, and when finished claims move to
/// the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionWindows {
    /// `completed` claims, from their last change.
    pub completed: Duration,
    /// `failed` claims, from their last change.
    pub failed: Duration,
    /// Dead-letter records.
    pub dead_letters: Duration,
    /// Sent outcome events and recorded provider events.
    pub records: Duration,
    /// PostgreSQL: finished claims last changed longer ago than this leave `claims` for the
    /// archive (`claims_archive`, partitioned by the month their retention ends); `None`: they
    /// stay in `claims` until they are deleted.
    pub archive_after: Option<Duration>,
}

impl RetentionWindows {
    /// The same window for everything, no archive.
    pub fn uniform(keep: Duration) -> RetentionWindows {
        RetentionWindows {
            completed: keep,
            failed: keep,
            dead_letters: keep,
            records: keep,
            archive_after: None,
        }
    }
}

/// One batch of the archive's move ([`RetentionWindows::archive_after`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchiveBatch {
    /// Claims moved into the archive.
    pub archived: u64,
    /// `completed` claims only deleted: their window was over when they were moved.
    pub deleted_completed: u64,
    /// `failed` claims only deleted, likewise.
    pub deleted_failed: u64,
}

impl ArchiveBatch {
    /// Claims the batch took out of `claims`.
    pub fn moved(&self) -> u64 {
        self.archived + self.deleted_completed + self.deleted_failed
    }
}

/// What retention did (or would do).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneResult {
    /// Claims deleted (or eligible, on a dry run): `deleted_completed + deleted_failed`.
    pub deleted: u64,
    /// `completed` claims deleted (or eligible).
    pub deleted_completed: u64,
    /// `failed` claims deleted (or eligible).
    pub deleted_failed: u64,
    /// Finished claims moved to the archive (or eligible).
    pub archived: u64,
    /// Why the archive's part of the run did not finish (tried again at the next run; the
    /// rest of retention ran).
    pub archive_error: Option<String>,
    /// Months of the archive dropped whole, their retention over.
    pub archive_months_dropped: u64,
    /// Statements issued.
    pub batches: u32,
    /// Another instance held the retention lock; nothing was done.
    pub skipped_locked: bool,
    /// Dead-letter records (counts only; the messages live in the broker) deleted, or
    /// eligible on a dry run, by the same window.
    pub dead_letters_deleted: u64,
    /// Finished claims whose payload, provider answer and error were erased by their
    /// consumer's `payload_retention` (or, on a dry run, would be).
    pub erased: u64,
}

/// The claim store: every role's part together ([`roles`]), and what all of them share.
/// Callers hold it as a [`Store`]. Implementations: [`postgres::PgStore`],
/// [`sqlite::SqliteStore`].
#[async_trait]
pub trait ClaimStore:
    IntakeStore
    + AccountStore
    + EngineStore
    + OperatorStore
    + OutboxStore
    + LedgerStore
    + LineStore
    + ReportStore
    + ScheduleStore
    + SealStore
    + Send
    + Sync
    + 'static
{
    /// `postgres` or `sqlite`.
    fn dialect(&self) -> &'static str;

    /// Applies the embedded migrations.
    async fn migrate(&self) -> StoreResult<()>;

    /// Checks the store answers.
    async fn ping(&self) -> StoreResult<()>;

    /// Why no server that takes writes is in use now, while a failover is under way
    /// (PostgreSQL with its failover monitor); `None` otherwise.
    fn trouble(&self) -> Option<String> {
        None
    }

    /// The database's clock.
    async fn now(&self) -> StoreResult<DateTime<Utc>>;

    /// Commits a one-row write that changes nothing else (this instance's write-probe
    /// heartbeat), to learn whether the store takes writes (readiness, [`writes`]).
    async fn probe_write(&self, instance: &str) -> StoreResult<()>;

    /// The server's replication settings ([`replication`]); `None` for a store that has no
    /// replication (SQLite, a single file).
    async fn replication(&self) -> StoreResult<Option<replication::ReplicationSettings>>;

    /// How the store's tables are doing ([`storage_health`]); `None` for SQLite.
    async fn storage_health(&self) -> StoreResult<Option<storage_health::StorageHealth>>;

    /// Rebuilds the bloated indexes of claimd's churned tables as `choice` says, changing
    /// nothing when `dry_run` ([`index_rebuild`]); `None` for SQLite, whose file `VACUUM`
    /// compacts.
    async fn rebuild_indexes(
        &self,
        choice: &index_rebuild::RebuildChoice,
        dry_run: bool,
    ) -> StoreResult<Option<index_rebuild::Reindexed>>;
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
    open_through(url, max_connections, batch_writes, pooler::Pooler::None).await
}

/// [`open_with`], PostgreSQL reached through `pooler` ([`pooler`]; SQLite ignores it).
pub async fn open_through(
    url: &str,
    max_connections: u32,
    batch_writes: bool,
    pooler: pooler::Pooler,
) -> StoreResult<Store> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            let pg = postgres::PgStore::connect_with(url, max_connections, pooler).await?;
            Ok(Arc::new(if batch_writes { pg } else { pg.unbatched() }))
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = (max_connections, batch_writes, pooler);
            Err(StoreError::NotBuiltIn(url.to_string(), "postgres"))
        }
    } else if url.starts_with("sqlite:") {
        #[cfg(feature = "sqlite")]
        {
            let lite = sqlite::SqliteStore::connect(url, max_connections).await?;
            Ok(Arc::new(if batch_writes { lite } else { lite.unbatched() }))
        }
        #[cfg(not(feature = "sqlite"))]
        {
            let _ = (max_connections, batch_writes);
            Err(StoreError::NotBuiltIn(url.to_string(), "sqlite"))
        }
    } else {
        Err(StoreError::BadUrl(url.to_string()))
    }
}

/// The database file a `sqlite:` URL names; `None` for another store, an in-memory database
/// (sqlx names one `file:sqlx-in-memory-<n>`), a URL it cannot read, or a build without SQLite.
pub fn sqlite_filename(url: &str) -> Option<std::path::PathBuf> {
    if !url.starts_with("sqlite:") {
        return None;
    }
    #[cfg(feature = "sqlite")]
    {
        use std::str::FromStr;
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
        let file = options.get_filename();
        let name = file.to_string_lossy();
        if name.is_empty() || name.contains(":memory:") || name.starts_with("file:sqlx-in-memory") {
            return None;
        }
        Some(file.to_path_buf())
    }
    #[cfg(not(feature = "sqlite"))]
    None
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
