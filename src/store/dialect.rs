//! What a database supplies to the one body of the SQL drivers ([`SqlStore`](super::sql_store::SqlStore)):
//! the text of each named statement ([`Statements`]), and a [`Dialect`] that runs them.
//! Binding values and reading rows is written once here, generic over sqlx's databases
//! ([`SqlPool`], and [`SqlRow`] for every sqlx row); only how a time is stored differs, and
//! each database says so in [`ClaimDb`].

/// Columns of a claim, without the payload (lists and intake answers do not need it): one list
/// for every dialect's statements.
macro_rules! claim_cols {
    () => {
        "id, consumer, tenant, message_id, idem_key, fingerprint, content_type, state, attempt, \
         lease_owner, lease_until, received_utc, started_utc, processed_utc, last_error, \
         provider_status, provider_response, duplicate_count, mismatch_count, reconciled, \
         resent_count, handoff, handoff_attempt, claim_token, waits, provider_id, pending_utc, \
         version, order_key, not_before, trace_parent, erased_utc"
    };
}

/// The `SET` items of a take of waiting claims that clear the "not called yet" marker of those
/// for which `young` holds (received recently enough: [`crate::engine::policy::clear_marker_within`]),
/// for every dialect's takes. Both read the row's old `handoff`.
macro_rules! clear_marker {
    ($($young:tt)*) => {
        concat!(
            "handoff = CASE WHEN handoff = 'not_called' AND ", $($young)*,
            " THEN NULL ELSE handoff END, \
             handoff_attempt = CASE WHEN handoff = 'not_called' AND ", $($young)*,
            " THEN NULL ELSE handoff_attempt END"
        )
    };
}

/// The attempt a takeover sets, for every dialect's takes of stale claims: the next one, except
/// for a claim an operator redrove and nobody took since (`operator_redrive` marked at its
/// attempt, which the redrive already bumped): that attempt is the redrive's, so it keeps it,
/// and the mark moves to the attempt before, where a take reads how the last attempt let go.
/// A redrive is then one attempt, and a takeover after it counts as any other. A take of a
/// scheduled claim carries its "not called" marker to the attempt it makes: a crash before
/// that attempt's call leaves a claim its takeover knows was never sent (I11).
macro_rules! take_attempt {
    () => {
        "attempt = attempt + CASE WHEN handoff = 'operator_redrive' AND handoff_attempt = attempt \
           THEN 0 ELSE 1 END, \
         handoff_attempt = CASE WHEN handoff = 'operator_redrive' AND handoff_attempt = attempt \
           THEN attempt - 1 \
           WHEN lease_owner = 'schedule' AND handoff = 'not_called' THEN attempt + 1 \
           ELSE handoff_attempt END, "
    };
}

/// The columns of an outcome event the relay reads, for every dialect's statements.
macro_rules! outcome_cols {
    () => {
        "id, claim_id, consumer, tenant, message_id, idem_key, state, attempt, provider_status, \
         provider_id, provider_response, reason, actor, action, at_utc, tries, destination, \
         claim_version"
    };
}

use super::{ClaimOutcome, NewEvent, SettleItem, StoreError, StoreResult};
use crate::domain::claim::NewClaim;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::query::Query;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Type};

/// A value bound to a statement. Each dialect binds it in its own encoding.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// Text.
    Text(&'a str),
    /// Text or NULL.
    OptText(Option<&'a str>),
    /// A 64-bit integer (ids, limits, milliseconds).
    I64(i64),
    /// A 32-bit integer (attempts).
    I32(i32),
    /// A 32-bit integer or NULL (provider statuses).
    OptI32(Option<i32>),
    /// A 64-bit integer or NULL (a lease's milliseconds).
    OptI64(Option<i64>),
    /// A boolean.
    Bool(bool),
    /// Bytes (payloads).
    Bytes(&'a [u8]),
    /// Bytes stored sealed when encryption is on (payloads; see the `sealing` module).
    SealedBytes(&'a [u8]),
    /// Text or NULL, stored sealed when encryption is on (provider answers, errors).
    SealedText(Option<&'a str>),
    /// A point in time.
    Time(DateTime<Utc>),
    /// A point in time or NULL.
    OptTime(Option<DateTime<Utc>>),
}

/// A result row, read by column name (implemented below for every sqlx row).
pub trait SqlRow: Send + Sync {
    /// A text column.
    fn text(&self, col: &str) -> StoreResult<String>;
    /// A nullable text column.
    fn opt_text(&self, col: &str) -> StoreResult<Option<String>>;
    /// A 64-bit integer column.
    fn i64(&self, col: &str) -> StoreResult<i64>;
    /// A nullable 64-bit integer column.
    fn opt_i64(&self, col: &str) -> StoreResult<Option<i64>>;
    /// A 32-bit integer column.
    fn i32(&self, col: &str) -> StoreResult<i32>;
    /// A nullable 32-bit integer column.
    fn opt_i32(&self, col: &str) -> StoreResult<Option<i32>>;
    /// A nullable floating-point column.
    fn opt_f64(&self, col: &str) -> StoreResult<Option<f64>>;
    /// A boolean column.
    fn boolean(&self, col: &str) -> StoreResult<bool>;
    /// A bytes column; empty when the statement did not select it.
    fn bytes_or_empty(&self, col: &str) -> Vec<u8>;
    /// A time column.
    fn time(&self, col: &str) -> StoreResult<DateTime<Utc>>;
    /// A nullable time column.
    fn opt_time(&self, col: &str) -> StoreResult<Option<DateTime<Utc>>>;
}

/// The SQL text of every statement the body runs, in one dialect. Parameters are numbered in
/// the order the body binds them (documented on each field).
#[derive(Debug)]
pub struct Statements {
    /// Insert a claim, `ON CONFLICT DO NOTHING`, returning it: consumer, tenant, message id,
    /// key, fingerprint, payload, content type, worker, lease ms, claim token.
    pub insert_claim: &'static str,
    /// Count a repeat delivery (not the call's own row), returning the claim: consumer,
    /// tenant, message id, fingerprint, claim token.
    pub count_repeat: &'static str,
    /// One claim with its payload: consumer, tenant, message id.
    pub get_claim: &'static str,
    /// [`get_claim`](Self::get_claim), else the newest archived copy (PostgreSQL's archive).
    pub find_claim: &'static str,
    /// The state of one claim: consumer, tenant, message id.
    pub state_of: &'static str,
    /// Fenced settle, bumping the version, returning `id, attempt` of the row it changed: id,
    /// attempt, state, provider status, provider response, error, reconciled, hand-off not
    /// applied, release lease, provider id, from-state, version read (NULL: any). Run through
    /// [`Dialect::update_logged`].
    pub settle: &'static str,
    /// [`Statements::settle`] for a settle that writes no outcome event (no consumer gets
    /// events, or the move is one that reports nothing): the same update, fence and history
    /// line, the same parameters but the last, and no outbox write in the statement.
    pub settle_plain: &'static str,
    /// A history line: claim id, attempt, actor, action, outcome, provider status, detail.
    pub insert_event: &'static str,
    /// A follow-up claim ([`FollowUpClaim`](super::FollowUpClaim)), `ON CONFLICT` of its key
    /// `DO NOTHING`: consumer, tenant, message id, key, fingerprint, payload, content type,
    /// parent id, reason it is parked (NULL: waiting for its pickup, as an enqueued claim).
    pub insert_follow_up: &'static str,
    /// The history line of a fenced write that lost, its detail followed by the claim's state,
    /// version and attempt as they are now: the parameters of `insert_event`.
    pub insert_fenced_out_event: &'static str,
    /// The row of a claim's key, asked after a fenced write of it found nothing to change
    /// (`id, state`): consumer, tenant, message id.
    pub locate_claim: &'static str,
    /// Write back a claim that vanished from the store (a failover lost it), `ON CONFLICT`
    /// of its key `DO NOTHING`, returning `id, attempt` of the row it inserted: consumer,
    /// tenant, message id, key, fingerprint, payload, content type, state, attempt, provider
    /// status, provider response, last error, reconciled, provider id, lease ms from now
    /// (NULL: none), received time, re-send count, order key, traceparent, waits, hand-off,
    /// lease owner. Run through [`Dialect::update_logged`] (its history line and outcome
    /// events as a settle's).
    pub restore_claim: &'static str,
    /// Erase a finished claim not erased yet (payload emptied, provider response and error
    /// cleared, `erased_utc` set, version bumped), returning it: id. Run through
    /// [`Dialect::update_logged`] (its history line; no outcome event).
    pub erase_claim: &'static str,
    /// The ids of a consumer's finished claims not erased yet whose last change is older
    /// than a window, oldest first: consumer, window ms, limit.
    pub erase_due: &'static str,
    /// How many claims [`Statements::erase_due`] would find with no limit (`n`): consumer,
    /// window ms.
    pub erase_due_count: &'static str,
    /// Start a schedule's row unless it exists: name, last slot.
    pub schedule_start: &'static str,
    /// Move a schedule's last slot forward, never back (inserting the row when missing):
    /// name, slot.
    pub schedule_advance: &'static str,
    /// Every schedule's row, by name: `name, last_slot_utc, updated_utc`.
    pub schedule_slots: &'static str,
    /// Clear the "not called yet" marker before a first call, fenced: id, attempt.
    pub mark_called: &'static str,
    /// Count a re-send, fenced: id, attempt.
    pub note_resent: &'static str,
    /// Take back a counted re-send whose call provably applied nothing, fenced: id, attempt.
    pub unnote_resent: &'static str,
    /// Claims by filter, newest first: state, consumer, stuck, since, limit, until, tenant,
    /// cursor time, cursor id (the keyset: only claims before that position).
    pub list_claims: &'static str,
    /// [`Statements::list_claims`] for stuck claims (`started`, lease expired), over the
    /// started claims' own index; the same nine parameters, the third always true.
    pub list_stuck_claims: &'static str,
    /// [`Statements::list_claims`] narrowed to a search text: its nine parameters, then the
    /// text and the text followed by U+10FFFF (the top of the prefix range).
    pub search_claims: &'static str,
    /// `needs_attention` claims of a consumer whose `last_error` starts with a prefix, newest
    /// first: consumer, prefix, limit.
    pub list_parked_by_reason: &'static str,
    /// A claim's history, oldest first: claim id.
    pub list_events: &'static str,
    /// The claim whose settle created a claim (its `parent_id`), when it is still stored:
    /// claim id.
    pub claim_parent: &'static str,
    /// The claims a claim's settles created, oldest first: claim id.
    pub claim_children: &'static str,
    /// Take stale claims (attempt + 1, version + 1, new lease), returning them with payload, `age_ms`,
    /// `handoff`, `handoff_attempt`: consumer, limit, owner, lease ms, expired before, hold
    /// (`order_hold = "hold"`). Leaves out what belongs to a line: a scheduled claim with an
    /// order key (`release_due_to_line` puts it into its line) and an ownerless claim (an
    /// operator's redrive) while its line has another claim ahead of it or in flight. A
    /// scheduled claim's "not called" marker moves to the attempt that takes it.
    pub take_stale: &'static str,
    /// Stale claims a take would return, changing nothing: consumer, limit.
    pub peek_stale: &'static str,
    /// Take pending claims whose poll is due (lease to the poller, attempt and version
    /// unchanged: the poll's settle is fenced on the version taken),
    /// returning them with payload and `age_ms` (time pending): consumer, limit, owner,
    /// lease ms.
    pub take_pending: &'static str,
    /// Take enqueued claims no worker holds yet (`started`, attempt 1, no lease owner): the
    /// aged share oldest first, the rest higher priority first, then oldest, leasing them to
    /// the taker (attempt and version unchanged), returning them with payload and `age_ms`
    /// (time since enqueued): consumer, limit, owner, lease ms, the window in ms within which the "not called yet" marker goes (negative: none), aged share.
    pub take_enqueued: &'static str,
    /// [`take_enqueued`](Statements::take_enqueued) by order keys' lines: a claim with an
    /// order key only when no other unfinished claim of its consumer, tenant and key is
    /// earlier or in flight (a `pending` or `needs_attention` one only when `hold`), the aged
    /// share oldest first, the rest by priority, then oldest, also returning `went_ahead_of`:
    /// consumer, limit, owner, lease ms, hold, lines, the marker window, aged share.
    pub take_ordered: &'static str,
    /// [`take_ordered`](Statements::take_ordered) round-robin across tenants (a tenant's
    /// n-th waiting claim by priority, then age, goes at turn n / weight): consumer, limit,
    /// owner, lease ms, hold, lines, weights (a JSON object of tenant to weight), the marker window.
    pub take_fair: &'static str,
    /// The earliest unfinished claim of a line that holds a claim (see `take_ordered`):
    /// consumer, tenant, order key, the claim's id.
    pub line_head: &'static str,
    /// Claims waiting in a line after a claim: consumer, tenant, order key, the claim's id.
    pub behind_in_line: &'static str,
    /// Claims waiting in lines per consumer: consumer, n.
    pub in_line: &'static str,
    /// The scheduled claims of ordered consumers whose time came, put into their lines in one
    /// statement (no lease owner, attempt 1, the "not called" marker kept), returning them:
    /// consumer, limit.
    pub release_due_to_line: &'static str,
    /// [`take_stale`](Statements::take_stale) round-robin across tenants by lease end:
    /// consumer, limit, owner, lease ms, expired before, weights (JSON object), hold.
    pub take_stale_fair: &'static str,
    /// Upsert a consumer's entry in the registry producers' transactions read
    /// (`claimd_consumers`): name, key template, max key length, whether the key mentions
    /// `{tenant}`, max payload bytes, whether it orders claims by an order key, the URL's
    /// path segments a message fills (JSON; PostgreSQL keeps them, SQLite ignores them), the
    /// configuration generation and the effect kind. Leaves a higher generation, or the same
    /// one with another effect kind, as it is.
    pub register_consumer: &'static str,
    /// A consumer's registered configuration generation and effect kind: name.
    pub registered_consumer: &'static str,
    /// Operator resolve, bumping the version, returning the claim: consumer, tenant, message
    /// id, to-state, two from-states the move is allowed from, the attempt and the version
    /// seen (each NULL: any). Run through [`Dialect::update_logged`].
    pub resolve: &'static str,
    /// Operator redrive, bumping the version, returning the claim: consumer, tenant, message
    /// id, two from-states, the attempt and the version seen. Run through
    /// [`Dialect::update_logged`].
    pub redrive: &'static str,
    /// Open work per consumer and state: `consumer, state, n, stuck, waiting, scheduled,
    /// in_line, oldest_ms` (the oldest in flight or stuck, for `started`).
    pub count_open: &'static str,
    /// Throughput per consumer since a time: `consumer, claims, duplicates, mismatches,
    /// completed, failed, resent, timed, p50, p95` (`timed`: completed claims no operator
    /// resolved, which the percentiles cover; seconds, NULL where the dialect computes them
    /// apart): since.
    pub count_window: &'static str,
    /// A dead letter: consumer, reason, message id.
    pub insert_dead_letter: &'static str,
    /// Dead letters per consumer since a time (`consumer, n`): since.
    pub count_dead_letters: &'static str,
    /// One batch of retention of one terminal state (re-checking the predicate on the
    /// delete): keep ms, batch, state.
    pub prune_batch: &'static str,
    /// How many claims of one terminal state retention would delete (`n`): keep ms, state.
    pub prune_count: &'static str,
    /// One batch of dead-letter records: keep ms, batch.
    pub prune_dead_letters: &'static str,
    /// How many dead-letter records retention would delete (`n`): keep ms.
    pub prune_dead_letters_count: &'static str,
    /// The sweeper's heartbeat: instance.
    pub mark_sweep: &'static str,
    /// Readiness' write probe (a heartbeat row of its own): instance.
    pub probe_write: &'static str,
    /// The last heartbeat (`at_utc`).
    pub last_sweep: &'static str,
    /// Upsert one instance's view of a consumer's provider: row name, instance, detail (JSON).
    pub mark_destination: &'static str,
    /// Every destination row (`name`, `instance`, `at_utc`, `detail`), by name.
    pub list_destinations: &'static str,
    /// Delete destination rows not written for the milliseconds given (stopped instances).
    pub prune_destinations: &'static str,
    /// A claim by provider id, newest first: consumer, provider id.
    pub find_by_provider_id: &'static str,
    /// Whether a provider event was taken (`n`): consumer, event id.
    pub provider_event_seen: &'static str,
    /// Record a provider event once: consumer, event id, type, object id, claim id, result.
    pub insert_provider_event: &'static str,
    /// Unmatched provider events, newest first (`consumer, event_id, event_type, object_id,
    /// received_utc`): since, limit.
    pub list_unmatched_events: &'static str,
    /// One batch of provider-event records older than the window: keep ms, batch.
    pub prune_provider_events: &'static str,
    /// A consumer's claims received in a window, in key order (byte order) after a keyset
    /// position (`id, tenant, message_id, idem_key, state, received_utc, payload`): consumer,
    /// from, to (exclusive), after key, after id, limit.
    pub list_ledger_claims: &'static str,
    /// Keep a consumer's last ledger run (upsert): consumer, summary (JSON).
    pub save_ledger_run: &'static str,
    /// Every consumer's last ledger run (`consumer, at_utc, summary`), by consumer.
    pub list_ledger_runs: &'static str,
    /// The database's clock (`now`).
    pub now: &'static str,
    /// A statement that only proves the store answers.
    pub ping: &'static str,
    /// Holds (or renews) the outcome relay of a consumer's destination for an owner: consumer,
    /// owner, lease ms, destination; returns a row only when the owner holds it now (it was
    /// free, expired, or its own).
    pub hold_outcome_relay: &'static str,
    /// Lets go of the outcome relay of a consumer's destination: consumer, owner, destination.
    pub release_outcome_relay: &'static str,
    /// Outcome events due to be sent to a destination, in order: consumer, limit,
    /// destination; returns `outcome_cols!()`. None of a claim whose earlier event to that
    /// destination is held back after a failed send. Writes nothing: the caller holds the
    /// destination's relay.
    pub due_outcomes: &'static str,
    /// Marks the events named in the JSON array of ids `$1` sent.
    pub mark_outcomes_sent: &'static str,
    /// Gives back the events named in `$1` (JSON ids) to be tried again after `$2` ms, with
    /// the error `$3`.
    pub retry_outcomes: &'static str,
    /// The oldest unsent event of a destination, due or not: consumer, destination; returns
    /// `outcome_cols!()`.
    pub oldest_unsent_outcome: &'static str,
    /// Makes a destination's events that wait out a backoff due now: consumer, destination.
    pub wake_outcomes: &'static str,
    /// The stored `traceparent` of the claims named in the JSON array of ids `$1` that have
    /// one: id, trace_parent.
    pub trace_parents: &'static str,
    /// Unsent events per consumer and destination: consumer, destination, n, oldest_ms.
    pub count_outcomes: &'static str,
    /// Gives a consumer's unsent events written before destinations had names (destination
    /// `''`) to the destination `$2`: consumer, destination.
    pub adopt_outcomes: &'static str,
    /// One batch of retention of sent events: keep ms, batch.
    pub prune_outcomes: &'static str,
}

/// What a database supplies to the one body.
#[async_trait]
pub trait Dialect: Clone + Send + Sync + 'static {
    /// Its result rows.
    type Row: SqlRow;

    /// What runs its statements (a [`SqlPool`]).
    type Runner: Runner<Row = Self::Row>;

    /// `postgres` or `sqlite`.
    const NAME: &'static str;

    /// Its statements.
    const SQL: Statements;

    /// Its statements of operator accounts and the audit.
    const ACCOUNT_SQL: super::audit::AccountStatements;
    /// Its statements of `claimd keys` (see the `sealing` module).
    const SEAL_SQL: super::sealing::SealStatements;

    /// Applies the embedded migrations.
    async fn migrate(&self) -> StoreResult<()>;

    /// The server's replication settings; `None` (the default) for a database without
    /// replication.
    async fn replication(
        &self,
    ) -> StoreResult<Option<crate::store::replication::ReplicationSettings>> {
        Ok(None)
    }

    /// How the store's tables are doing (sizes, dead rows, what holds back vacuum); `None`
    /// (the default) for a database without vacuum.
    async fn storage_health(
        &self,
    ) -> StoreResult<Option<crate::store::storage_health::StorageHealth>> {
        Ok(None)
    }

    /// Rebuilds bloated indexes ([`crate::store::index_rebuild`]); `None` (the default) for a
    /// database whose indexes need no rebuild.
    async fn rebuild_indexes(
        &self,
        _choice: &crate::store::index_rebuild::RebuildChoice,
        _dry_run: bool,
    ) -> StoreResult<Option<crate::store::index_rebuild::Reindexed>> {
        Ok(None)
    }

    /// Runs statements: the shared [`SqlPool`] over the dialect's database.
    fn runner(&self) -> &Self::Runner;

    /// Why no server that takes writes is in use now (PostgreSQL after a failover, until the
    /// new primary is found); `None` (the default) when the store has nothing to say.
    fn trouble(&self) -> Option<String> {
        None
    }

    /// Runs an update that returns the row it changed (with its `id` and `attempt`) and writes
    /// the event as that row's history line, both or neither.
    async fn update_logged(&self, w: LoggedWrite<'_>) -> StoreResult<Option<Self::Row>>;

    /// Runs `effect`'s write for `claim`, then `w` (the settle and its history line), in one
    /// transaction: committed when the settle changed the row, rolled back when the fence
    /// left it alone (`Ok(false)`: another worker holds the claim) or anything failed. Once
    /// begun, the transaction is cut and rolled back after `timeout`
    /// ([`DbEffectError::TimedOut`](super::db_effect::DbEffectError::TimedOut); PostgreSQL
    /// cuts each statement at `timeout` and the whole run at twice it).
    async fn update_logged_after(
        &self,
        effect: &dyn super::db_effect::DatabaseEffect,
        claim: &crate::domain::claim::Claim,
        w: LoggedWrite<'_>,
        timeout: std::time::Duration,
    ) -> Result<bool, super::db_effect::DbEffectError>;

    /// Runs a take of waiting claims by order keys' lines (`sql`, returning rows) alone for
    /// its consumer (`consumer`) across instances: on PostgreSQL in a transaction that first
    /// takes the consumer's line lock, so a take sees every claim the one before took;
    /// SQLite's one writer already runs each statement alone.
    async fn fetch_alone(
        &self,
        consumer: &str,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<Vec<Self::Row>> {
        let _ = consumer;
        self.runner().fetch(name, sql, args).await
    }

    /// Runs a read that counts over many claims (the report's counts, open work): as
    /// [`Runner::fetch`], and on PostgreSQL without JIT compilation, which costs more than it
    /// saves on such a count.
    async fn fetch_count(
        &self,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<Vec<Self::Row>> {
        self.runner().fetch(name, sql, args).await
    }

    /// Takes the lock that lets one instance prune at a time, or `None` when another holds
    /// it. [`RetentionLock::release`] gives it back; dropping it releases it too (later),
    /// whatever happens to the pruning task.
    async fn retention_lock(&self) -> StoreResult<Option<Box<dyn RetentionLock>>>;

    /// Moves one batch of finished claims last changed before `now - archive_after` out of
    /// `claims`, into the archive when their state's window is not over yet (else they are
    /// only deleted): `(archived, deleted)` by state, or `None` when the dialect keeps no
    /// archive. On a dry run, counts without moving.
    async fn archive_batch(
        &self,
        _windows: &super::RetentionWindows,
        _batch: u32,
        _dry_run: bool,
    ) -> Option<StoreResult<super::ArchiveBatch>> {
        None
    }

    /// Drops the archive's months whose retention is over (all their claims' windows ended):
    /// how many, or `None` when the dialect keeps no archive.
    async fn drop_archive_months(&self) -> Option<StoreResult<u64>> {
        None
    }

    /// Background tasks per queue of batched writes (`batch`: one queue per kind, or one for
    /// all with [`JOINT_WRITES`](Dialect::JOINT_WRITES)).
    const BATCH_WORKERS: usize;

    /// Whether a batch of one call also goes through [`insert_many`](Dialect::insert_many)
    /// and [`settle_many`](Dialect::settle_many) (SQLite: every write then queues for the one
    /// writer in process, instead of in SQLite's sleeping busy handler).
    const BATCH_SINGLES: bool = false;

    /// Claims many at once, committed together, when the dialect can: per item its outcome,
    /// or `None` when it is left to the one-row path (a key already claimed, which that path
    /// counts as a repeat).
    async fn insert_many(
        &self,
        _new: &[&NewClaim],
    ) -> Option<StoreResult<Vec<Option<ClaimOutcome>>>> {
        None
    }

    /// Settles many claims (distinct ids) in one commit, when the dialect can, each fenced on
    /// its own attempt, each with its history line and, for `outcomes`' consumers, its outcome
    /// event.
    async fn settle_many(
        &self,
        _items: &[SettleItem<'_>],
        _outcomes: &super::outbox::OutcomeConsumers,
    ) -> Option<StoreResult<Vec<bool>>> {
        None
    }

    /// How long a worker of the group commit waits for more calls before writing a small batch
    /// while under load (its last batch had more than one call); zero: never.
    const BATCH_LINGER: std::time::Duration = std::time::Duration::ZERO;

    /// Whether claims and settles wait in one queue of the group commit, so that a batch of
    /// both is written by [`insert_settle_many`](Dialect::insert_settle_many) under one
    /// commit.
    const JOINT_WRITES: bool = false;

    /// Claims many (as [`insert_many`](Dialect::insert_many)) and settles many (distinct
    /// ids, as [`settle_many`](Dialect::settle_many)) in one commit, when the dialect can: a
    /// failure fails both, and the caller then writes each kind by itself.
    async fn insert_settle_many(
        &self,
        _new: &[&NewClaim],
        _items: &[SettleItem<'_>],
        _outcomes: &super::outbox::OutcomeConsumers,
    ) -> Option<StoreResult<ClaimsAndSettles>> {
        None
    }

    /// Clears the "not called yet" marker of many claims (distinct ids) in one commit, when
    /// the dialect can, each fenced on its own attempt like
    /// [`EngineStore::mark_called`](super::EngineStore::mark_called): per item, whether it
    /// still held the claim.
    async fn mark_called_many(&self, _marks: &[(i64, i32)]) -> Option<StoreResult<Vec<bool>>> {
        None
    }

    /// Erases one batch of payload retention in one statement, when the dialect can: a
    /// consumer's finished claims due (as [`Statements::erase_due`] finds them), each with its
    /// history line by `retention`; how many it erased. `None`: left to the one-claim path
    /// ([`Statements::erase_claim`]). Arguments: consumer, window ms, limit, the history
    /// line's detail.
    async fn erase_due_batch(&self, _args: &[Arg<'_>]) -> Option<StoreResult<u64>> {
        None
    }

    /// Waits for a turn to search claims, when the dialect bounds how many run at once; the
    /// turn ends when the value is dropped. `None`: unbounded.
    async fn search_turn(&self) -> StoreResult<Option<tokio::sync::OwnedSemaphorePermit>> {
        Ok(None)
    }

    /// Median and 95th-percentile receive-to-complete seconds of `consumer` since `since`
    /// over its `completed` claims that no operator resolved, for dialects whose window
    /// statement leaves them NULL.
    async fn completion_percentiles(
        &self,
        _consumer: &str,
        _since: DateTime<Utc>,
        _completed: i64,
    ) -> StoreResult<(Option<f64>, Option<f64>)> {
        Ok((None, None))
    }
}

/// What [`Dialect::insert_settle_many`] answers: per claim its outcome (`None`: left to the
/// one-row path), per settle whether it still held the claim.
pub type ClaimsAndSettles = (Vec<Option<ClaimOutcome>>, Vec<bool>);

/// The lock that lets one instance prune at a time ([`Dialect::retention_lock`]).
#[async_trait]
pub trait RetentionLock: Send {
    /// Gives the lock back now.
    async fn release(self: Box<Self>);
}

/// An update and the history line to write with it ([`Dialect::update_logged`]).
#[derive(Debug, Clone, Copy)]
pub struct LoggedWrite<'a> {
    /// The statement's name, for errors.
    pub name: &'static str,
    /// The update, returning the row it changed.
    pub sql: &'static str,
    /// The update's arguments.
    pub args: &'a [Arg<'a>],
    /// The history line.
    pub event: &'a NewEvent<'a>,
    /// The consumers whose change writes an outcome event, as a JSON array
    /// ([`OutcomeConsumers::bound`](super::outbox::OutcomeConsumers::bound)); `[]`: none.
    /// `None`: the statement writes no outcome event and takes no such parameter
    /// ([`Statements::settle_plain`]).
    pub outcomes: Option<&'a str>,
    /// The follow-up claims written after the change, in its transaction, when it changed a
    /// row ([`Statements::insert_follow_up`]); empty: none.
    pub follow_ups: &'a [super::FollowUpClaim],
}

/// The arguments of [`Statements::insert_follow_up`] for `child` of claim `parent`: its
/// payload and reason sealed as they are bound when encryption is on.
pub(crate) fn follow_up_args(child: &super::FollowUpClaim, parent: i64) -> [Arg<'_>; 9] {
    [
        Arg::Text(&child.consumer),
        Arg::Text(&child.tenant),
        Arg::Text(&child.message_id),
        Arg::Text(&child.idem_key),
        Arg::Text(&child.fingerprint),
        Arg::SealedBytes(&child.payload),
        Arg::Text(&child.content_type),
        Arg::I64(parent),
        Arg::SealedText(child.parked.as_deref()),
    ]
}

/// Runs named statements with [`Arg`]s.
#[async_trait]
pub trait Runner: Send + Sync {
    /// The rows it returns.
    type Row: SqlRow;

    /// Runs a statement and returns its rows. `name` names it in errors.
    async fn fetch(
        &self,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<Vec<Self::Row>>;

    /// Runs a statement and returns how many rows it changed.
    async fn execute(
        &self,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<u64>;
}

/// The history line `e` of claim `id` at `attempt`, as the `insert_event` statement binds it.
pub(crate) fn event_args<'a>(id: i64, attempt: i32, e: &NewEvent<'a>) -> [Arg<'a>; 7] {
    [
        Arg::I64(id),
        Arg::I32(attempt),
        Arg::Text(e.actor),
        Arg::Text(e.action),
        Arg::Text(e.outcome),
        Arg::OptI32(e.provider_status),
        Arg::SealedText(e.detail),
    ]
}

/// What differs between the databases claimd stores claims in, below the statements: how a
/// point in time is stored, and how a result says how many rows changed.
pub trait ClaimDb: Database {
    /// Rows a statement changed.
    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// Binds a time (or NULL).
    fn bind_time(
        q: Query<'_, Self, Self::Arguments>,
        t: Option<DateTime<Utc>>,
    ) -> Query<'_, Self, Self::Arguments>;

    /// Reads a time column (or NULL).
    fn read_time(row: &Self::Row, col: &str) -> StoreResult<Option<DateTime<Utc>>>;
}

fn corrupt(e: sqlx::Error) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

impl<R> SqlRow for R
where
    R: sqlx::Row,
    R::Database: ClaimDb,
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> f64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    fn text(&self, col: &str) -> StoreResult<String> {
        self.try_get(col).map_err(corrupt)
    }
    fn opt_text(&self, col: &str) -> StoreResult<Option<String>> {
        self.try_get(col).map_err(corrupt)
    }
    fn i64(&self, col: &str) -> StoreResult<i64> {
        self.try_get(col).map_err(corrupt)
    }
    fn opt_i64(&self, col: &str) -> StoreResult<Option<i64>> {
        self.try_get(col).map_err(corrupt)
    }
    fn i32(&self, col: &str) -> StoreResult<i32> {
        self.try_get(col).map_err(corrupt)
    }
    fn opt_i32(&self, col: &str) -> StoreResult<Option<i32>> {
        self.try_get(col).map_err(corrupt)
    }
    fn opt_f64(&self, col: &str) -> StoreResult<Option<f64>> {
        self.try_get(col).map_err(corrupt)
    }
    fn boolean(&self, col: &str) -> StoreResult<bool> {
        self.try_get(col).map_err(corrupt)
    }
    fn bytes_or_empty(&self, col: &str) -> Vec<u8> {
        self.try_get(col).unwrap_or_default()
    }
    fn time(&self, col: &str) -> StoreResult<DateTime<Utc>> {
        R::Database::read_time(self, col)?
            .ok_or_else(|| StoreError::Corrupt(format!("{col} is NULL")))
    }
    fn opt_time(&self, col: &str) -> StoreResult<Option<DateTime<Utc>>> {
        R::Database::read_time(self, col)
    }
}

/// A pool that runs named statements with [`Arg`]s: the binding and the error naming, once for
/// every database.
#[derive(Debug)]
pub struct SqlPool<DB: Database> {
    /// The connection pool.
    pub pool: Pool<DB>,
    /// What sits between the pool and the database: how statements must be run
    /// ([`super::pooler`]).
    pub pooler: super::pooler::Pooler,
}

impl<DB: Database> Clone for SqlPool<DB> {
    fn clone(&self) -> Self {
        SqlPool {
            pool: self.pool.clone(),
            pooler: self.pooler,
        }
    }
}

/// A database whose pool runs [`Arg`]-bound statements: every database with the encodings
/// claimd binds (implemented for any such sqlx database; the bounds are stated once, here).
pub trait SqlDb: ClaimDb
where
    Self::Arguments: IntoArguments<Self>,
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
{
    /// `sql` with `args` bound in order.
    fn query(sql: &'static str, args: &[Arg<'_>]) -> Query<'static, Self, Self::Arguments>;
}

impl<DB> SqlDb for DB
where
    DB: ClaimDb,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> Option<&'t str>: Encode<'t, DB> + Type<DB>,
    for<'t> &'t [u8]: Encode<'t, DB> + Type<DB>,
    for<'t> Vec<u8>: Encode<'t, DB> + Type<DB>,
    for<'t> Option<String>: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
    for<'t> i32: Encode<'t, DB> + Type<DB>,
    for<'t> Option<i32>: Encode<'t, DB> + Type<DB>,
    for<'t> Option<i64>: Encode<'t, DB> + Type<DB>,
    for<'t> bool: Encode<'t, DB> + Type<DB>,
{
    fn query(sql: &'static str, args: &[Arg<'_>]) -> Query<'static, DB, DB::Arguments> {
        let mut q = sqlx::query(sql);
        for a in args {
            q = match *a {
                Arg::Text(v) => q.bind(v),
                Arg::OptText(v) => q.bind(v),
                Arg::I64(v) => q.bind(v),
                Arg::I32(v) => q.bind(v),
                Arg::OptI32(v) => q.bind(v),
                Arg::OptI64(v) => q.bind(v),
                Arg::Bool(v) => q.bind(v),
                Arg::Bytes(v) => q.bind(v),
                // Encryption off binds the value itself, as `Bytes` and `OptText` do.
                Arg::SealedBytes(v) => match super::sealing::keyring() {
                    Some(k) => q.bind(k.seal(v)),
                    None => q.bind(v),
                },
                Arg::SealedText(v) => match super::sealing::keyring() {
                    Some(k) => q.bind(v.map(|t| k.seal_text(t))),
                    None => q.bind(v),
                },
                Arg::Time(t) => DB::bind_time(q, Some(t)),
                Arg::OptTime(t) => DB::bind_time(q, t),
            };
        }
        q
    }
}

impl<DB> SqlPool<DB>
where
    DB: SqlDb,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// `sql` with `args` bound in order.
    pub fn query(sql: &'static str, args: &[Arg<'_>]) -> Query<'static, DB, DB::Arguments> {
        DB::query(sql, args)
    }
}

#[async_trait]
impl<DB> Runner for SqlPool<DB>
where
    DB: SqlDb + sqlx::database::HasStatementCache,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Row: SqlRow,
{
    type Row = DB::Row;

    async fn fetch(
        &self,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<Vec<DB::Row>> {
        self.all(Self::query(sql, args))
            .await
            .map_err(|e| StoreError::from_sqlx(name, e))
    }

    async fn execute(
        &self,
        name: &'static str,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> StoreResult<u64> {
        self.run(Self::query(sql, args))
            .await
            .map(|done| DB::rows_affected(&done))
            .map_err(|e| StoreError::from_sqlx(name, e))
    }
}

/// Running statements as [`SqlPool::pooler`] requires ([`super::pooler`]).
impl<DB> SqlPool<DB>
where
    DB: ClaimDb + sqlx::database::HasStatementCache,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// Runs `q` and returns its rows: on the pool, or under a pooler in transaction mode
    /// unnamed inside a transaction of its own (see [`super::pooler`]).
    pub async fn all(&self, q: Query<'_, DB, DB::Arguments>) -> Result<Vec<DB::Row>, sqlx::Error> {
        if !self.pooler.per_transaction() {
            return q.fetch_all(&self.pool).await;
        }
        let mut tx = self.pool.begin().await?;
        let rows = q.persistent(false).fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// [`all`](SqlPool::all) for a statement that returns at most one row.
    pub async fn optional(
        &self,
        q: Query<'_, DB, DB::Arguments>,
    ) -> Result<Option<DB::Row>, sqlx::Error> {
        if !self.pooler.per_transaction() {
            return q.fetch_optional(&self.pool).await;
        }
        let mut tx = self.pool.begin().await?;
        let row = q.persistent(false).fetch_optional(&mut *tx).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Runs `q` and returns what it did, as [`all`](SqlPool::all) runs it.
    pub async fn run(
        &self,
        q: Query<'_, DB, DB::Arguments>,
    ) -> Result<DB::QueryResult, sqlx::Error> {
        if !self.pooler.per_transaction() {
            return q.execute(&self.pool).await;
        }
        let mut tx = self.pool.begin().await?;
        let done = q.persistent(false).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done)
    }

    /// `q` as it runs inside a transaction claimd already holds: unnamed under a pooler in
    /// transaction mode, so it never meets another client's statement of the same name.
    pub fn in_tx<'q>(&self, q: Query<'q, DB, DB::Arguments>) -> Query<'q, DB, DB::Arguments> {
        if self.pooler.per_transaction() {
            q.persistent(false)
        } else {
            q
        }
    }
}
