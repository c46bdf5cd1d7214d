//! The sweeper: finds `started` claims whose lease expired (crash, timeout, lost hand-off),
//! takes them over (attempt + 1, new lease, one statement) and re-drives, reconciles or parks
//! each, as [`policy::on_takeover`] decides. No claim stays stuck (I4); no outcome is guessed (I6).

pub mod pending_poller;
mod reconcile;

use crate::domain::claim::SCHEDULE_OWNER;
use crate::domain::claim::{Claim, Handoff};
use crate::engine::claimer::{AttemptEnd, Claimer, Consumer, Hold, Slot};
use crate::engine::policy::{self, Takeover, TakeoverFacts};
use crate::engine::settle::{self, Resend};
use crate::store::{StoreError, TakenClaim};
use chrono::Utc;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{info, instrument, warn};

/// What one claim in a pass came to.
#[derive(Debug, Clone, Serialize)]
pub struct SweepItem {
    /// Consumer.
    pub consumer: String,
    /// Tenant.
    pub tenant: String,
    /// Message id.
    pub message_id: String,
    /// Attempt the sweeper made (or would make).
    pub attempt: i32,
    /// `redrive`, `resend`, `reconcile` or `park`.
    pub action: String,
    /// What came of it (on a dry run: `would ...`).
    pub result: String,
}

/// One pass.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SweepReport {
    /// Each claim taken (or that would be).
    pub items: Vec<SweepItem>,
    /// A dry run changed nothing.
    pub dry_run: bool,
}

/// The sweeper. Cheap to clone; passes never overlap within one process.
#[derive(Clone)]
pub struct Sweeper {
    claimer: Arc<Claimer>,
    batch_size: u32,
    running: Arc<Mutex<()>>,
    /// Wait for every claim a pass takes, however long (`claimd sweep`, which exits after
    /// its pass), instead of leaving slow ones to finish in the background.
    finish: bool,
}

impl std::fmt::Debug for Sweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper")
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl Sweeper {
    /// A sweeper taking up to `batch_size` claims per consumer per pass.
    pub fn new(claimer: Arc<Claimer>, batch_size: u32) -> Self {
        Sweeper {
            claimer,
            batch_size,
            running: Arc::new(Mutex::new(())),
            finish: false,
        }
    }

    /// The same sweeper, but a pass returns only once every claim it took is settled or
    /// handed back: for `claimd sweep`, whose process ends with its pass (a call cut by the
    /// exit would leave an unknown outcome behind).
    pub fn finishing_every_claim(mut self) -> Self {
        self.finish = true;
        self
    }

    /// Runs one pass unless one is already running in this process (then `None`).
    pub async fn try_pass(&self) -> Result<Option<SweepReport>, StoreError> {
        let Ok(_guard) = self.running.try_lock() else {
            return Ok(None);
        };
        self.pass_locked(false).await.map(Some)
    }

    /// Runs one pass, waiting for a running one to end. `dry_run` only reports.
    pub async fn pass(&self, dry_run: bool) -> Result<SweepReport, StoreError> {
        let _guard = self.running.lock().await;
        self.pass_locked(dry_run).await
    }

    #[instrument(skip(self), fields(instance = %self.claimer.instance()))]
    async fn pass_locked(&self, dry_run: bool) -> Result<SweepReport, StoreError> {
        let store = self.claimer.store().clone();
        let mut report = SweepReport {
            dry_run,
            ..Default::default()
        };
        if dry_run {
            for consumer in self.claimer.consumers() {
                for t in store.peek_stale(consumer.name(), self.batch_size).await? {
                    let decision = decide(consumer, &t);
                    report
                        .items
                        .push(item(&t.claim, &decision, "would do this".into()));
                }
            }
            return Ok(report);
        }
        // A pass that starts is what readiness and `report` watch.
        let marked = store.mark_sweep(self.claimer.instance()).await;
        match &marked {
            Ok(()) => self.claimer.writes().succeeded(),
            Err(e) => self.claimer.writes().failed(e),
        }
        marked?;
        let cutoff = store.now().await?;
        self.claimer.metrics().sweep_pass();
        let mut per_consumer = Vec::new();
        for consumer in self.claimer.consumers() {
            let claimer = self.claimer.clone();
            let consumer = consumer.clone();
            let batch = self.batch_size;
            let finish = self.finish;
            per_consumer.push(tokio::spawn(async move {
                let mut items = sweep_consumer(&claimer, &consumer, batch, cutoff, finish).await?;
                items.extend(
                    crate::engine::sweeper::pending_poller::poll_consumer(
                        &claimer, &consumer, batch,
                    )
                    .await?,
                );
                Ok::<_, StoreError>(items)
            }));
        }
        let mut first_error = None;
        for task in per_consumer {
            match task.await {
                Ok(Ok(items)) => report.items.extend(items),
                Ok(Err(e)) => {
                    warn!(error = %e, "sweeper could not take claims");
                    first_error.get_or_insert(e);
                }
                Err(e) => warn!(error = %e, "sweeper task failed"),
            }
        }
        if let Some(e) = first_error
            && report.items.is_empty()
        {
            return Err(e);
        }
        if !report.items.is_empty() {
            info!(claims = report.items.len(), "sweeper pass done");
        }
        Ok(report)
    }
}

/// Takes up to `batch` stale claims of one consumer, in chunks no larger than its
/// concurrency, so a taken claim never waits for a slot longer than its lease allows. The pass
/// waits for a chunk at most one effect timeout: a claim still running then (a slow provider,
/// a long backoff) finishes in the background under its own lease, and the pass goes on.
/// After each chunk the sweeper's heartbeat is written, so a long pass shows progress.
/// `finish`: wait for every claim (`claimd sweep`). A consumer whose destination is open
/// (its provider failing, not yet due a probe) is left alone: its claims would only wait.
async fn sweep_consumer(
    claimer: &Arc<Claimer>,
    consumer: &Arc<Consumer>,
    batch: u32,
    cutoff: chrono::DateTime<Utc>,
    finish: bool,
) -> Result<Vec<SweepItem>, StoreError> {
    let cfg = &consumer.config;
    let wait = cfg.effect.timeout().min(cfg.lease.0);
    let mut items = Vec::new();
    let hold = cfg.flow.order_hold == crate::config::OrderHold::Hold;
    if consumer.order_key.is_some() {
        items.extend(release_due(claimer, consumer, batch).await?);
    }
    let mut remaining = batch;
    while remaining > 0 {
        if consumer.destination.open_until().is_some() {
            info!(consumer = %cfg.name, "provider failing (breaker open): its claims wait for the next probe");
            break;
        }
        let chunk = remaining.min(cfg.concurrency);
        // Before the statement that sets the leases: the local deadline must not fall after
        // the one the database recorded.
        let lease_start = Instant::now();
        let store = claimer.store();
        let taken = if cfg.flow.fairness == crate::config::Fairness::Tenant {
            let order = crate::store::WaitingOrder {
                lines: consumer.order_key.is_some().then_some(hold),
                fair: Some(cfg.flow.tenant_weights.clone()),
                aged: 0,
            };
            let owner = claimer.instance();
            store
                .take_stale_fair(&cfg.name, chunk, owner, cfg.lease.0, cutoff, &order)
                .await?
        } else {
            store
                .take_stale(
                    &cfg.name,
                    chunk,
                    claimer.instance(),
                    cfg.lease.0,
                    cutoff,
                    hold,
                )
                .await?
        };
        if taken.is_empty() {
            break;
        }
        remaining = remaining.saturating_sub(taken.len() as u32);
        let mut tasks = Vec::with_capacity(taken.len());
        for t in taken {
            let claimer = claimer.clone();
            let consumer = consumer.clone();
            let background = item(&t.claim, &decide(&consumer, &t), String::new());
            tasks.push((
                background,
                tokio::spawn(async move {
                    let _slot = consumer.slot().await;
                    handle(&claimer, &consumer, t, lease_start).await
                }),
            ));
        }
        let until = lease_start + wait;
        let mut in_background = 0;
        for (mut background, task) in tasks {
            let waited = if finish {
                Ok(task.await)
            } else {
                tokio::time::timeout_at(until, task).await
            };
            match waited {
                Ok(Ok(i)) => items.push(i),
                Ok(Err(e)) => warn!(error = %e, "sweeper task failed"),
                Err(_) => {
                    // Dropping the handle detaches the task; it keeps the claim's lease.
                    in_background += 1;
                    background.result = format!(
                        "still running after {}; finishing in the background",
                        crate::domain::duration::Dur(wait)
                    );
                    items.push(background);
                }
            }
        }
        if let Err(e) = claimer.store().mark_sweep(claimer.instance()).await {
            warn!(error = %e, "could not record the sweeper's progress");
        }
        info!(
            consumer = %cfg.name,
            done = items.len(),
            in_background,
            "sweeper pass progress"
        );
    }
    Ok(items)
}

fn decide(consumer: &Consumer, t: &TakenClaim) -> Takeover {
    decide_knowing(consumer, t, None)
}

/// [`policy::on_takeover`] for a taken claim; `proven_unsent` once its history was read.
fn decide_knowing(consumer: &Consumer, t: &TakenClaim, proven_unsent: Option<bool>) -> Takeover {
    let cfg = &consumer.config;
    policy::on_takeover(TakeoverFacts {
        attempt: t.claim.attempt,
        waits: t.claim.waits,
        max_attempts: cfg.max_attempts,
        age: t.age,
        redrive_within: cfg.redrive_within.0,
        on_unknown: cfg.on_unknown,
        handoff: t.handoff,
        can_reconcile: consumer.effect.can_reconcile(),
        atomic: consumer.effect.database().is_some(),
        send_deadline: cfg.send_deadline.0,
        proven_unsent,
    })
}

fn action_name(decision: &Takeover) -> &'static str {
    match decision {
        Takeover::Perform { resend: false } => "redrive",
        Takeover::Perform { resend: true } => "resend",
        Takeover::Reconcile => "reconcile",
        Takeover::Park(_) => "park",
        Takeover::Fail(_) => "fail",
        Takeover::CheckSent => "check",
    }
}

fn item(claim: &Claim, decision: &Takeover, result: String) -> SweepItem {
    let action = action_name(decision);
    SweepItem {
        consumer: claim.consumer.clone(),
        tenant: claim.tenant.clone(),
        message_id: claim.message_id.clone(),
        attempt: claim.attempt,
        action: action.to_string(),
        result,
    }
}

fn end_name(end: &AttemptEnd) -> String {
    match end {
        AttemptEnd::Settled(s) => s.as_str().to_string(),
        AttemptEnd::LeftStarted(why) => format!("still started: {why}"),
        AttemptEnd::Lost => "taken over by another worker".into(),
    }
}

/// The scheduled claims of an ordered consumer whose time came join their order keys' lines
/// (where their place is their arrival) instead of being sent out of turn: one statement, so
/// no worker ever holds such a claim outside its line (I10). Their history says so.
async fn release_due(
    claimer: &Claimer,
    consumer: &Consumer,
    batch: u32,
) -> Result<Vec<SweepItem>, StoreError> {
    let released = claimer
        .store()
        .release_due_to_line(consumer.name(), batch)
        .await?;
    if released.is_empty() {
        return Ok(Vec::new());
    }
    let mut items = Vec::with_capacity(released.len());
    for claim in released {
        let detail = format!(
            "its scheduled time {} came; joined its order key's line",
            claim.not_before.map(|t| t.to_rfc3339()).unwrap_or_default()
        );
        claimer
            .settler()
            .note(&claim, "schedule", "due", None, Some(&detail))
            .await;
        items.push(SweepItem {
            consumer: claim.consumer.clone(),
            tenant: claim.tenant.clone(),
            message_id: claim.message_id.clone(),
            attempt: claim.attempt,
            action: "schedule".into(),
            result: "joined its order key's line".into(),
        });
    }
    // After the history lines, so a claim's history reads in the order things happened.
    consumer.wake_pickup();
    Ok(items)
}

/// Carries out the decision for one taken claim.
#[instrument(skip_all, fields(consumer = %t.claim.consumer, tenant = %t.claim.tenant, message_id = %t.claim.message_id, attempt = t.claim.attempt))]
async fn handle(
    claimer: &Claimer,
    consumer: &Consumer,
    t: TakenClaim,
    lease_start: Instant,
) -> SweepItem {
    let claim = &t.claim;
    if t.held_by.as_deref() == Some(SCHEDULE_OWNER) {
        let detail = format!(
            "its scheduled time {} came",
            claim.not_before.map(|t| t.to_rfc3339()).unwrap_or_default()
        );
        claimer
            .settler()
            .note(claim, "schedule", "due", None, Some(&detail))
            .await;
    }
    let mut decision = decide(consumer, &t);
    if t.handoff.is_none()
        && let Some(holder) = &t.held_by
    {
        // No clean hand-off: the holder crashed, was killed or ran out of time. Whose lease
        // it was tells a person (and the fault harness) which worker to look at.
        let detail = format!(
            "attempt {} was held by {holder}; its lease ran out without a hand-off (a crash, a kill or a timeout)",
            claim.attempt - 1
        );
        claimer
            .settler()
            .note(claim, "takeover", "lease_expired", None, Some(&detail))
            .await;
    }
    if decision == Takeover::CheckSent {
        // Whether it was ever sent decides: a claim that never reached the provider is sent
        // (or, past send_deadline, failed as never sent), one that may have is not guessed.
        let sends = match claimer.store().events(claim.id).await {
            Ok(events) => policy::read_sends(
                events.iter().map(|e| {
                    (
                        e.attempt,
                        e.action.as_str(),
                        e.outcome.as_str(),
                        e.provider_status,
                    )
                }),
                claim.attempt,
                |status| consumer.effect.proves_non_receipt(status),
            ),
            Err(e) => {
                warn!(error = %e, "could not read the claim's history; it will be decided next pass");
                return item(
                    claim,
                    &decision,
                    format!("history unreadable ({e}); left for the next pass"),
                );
            }
        };
        let cfg = &consumer.config;
        decision = match sends {
            policy::Sends::NeverSent => decide_knowing(consumer, &t, Some(true)),
            policy::Sends::Unproven(answers) if t.age > cfg.send_deadline.0 => {
                policy::unproven_past_deadline(
                    &answers,
                    &claim.idem_key,
                    cfg.send_deadline.0,
                    cfg.on_unknown,
                    consumer.effect.can_reconcile(),
                )
            }
            _ => decide_knowing(consumer, &t, Some(false)),
        };
    }
    let hold = Hold {
        since: lease_start,
        age: t.age,
        // A scheduled claim's marker moved to this attempt with the take: it is cleared,
        // fenced, just before the call, so a crash before then is a claim never sent (I11).
        not_called: t.held_by.as_deref() == Some(SCHEDULE_OWNER),
    };
    claimer.metrics().sweep_action(action_name(&decision));
    let result = match &decision {
        Takeover::CheckSent => unreachable!("decided with the history read"),
        Takeover::Fail(reason) => {
            settle_taken(
                claimer,
                claim,
                settle::never_sent(reason.clone()),
                "sweep",
                "never_sent",
            )
            .await
        }
        Takeover::Perform { resend } => end_name(
            &claimer
                .drive(
                    consumer,
                    claim,
                    hold,
                    resend.then_some(Resend::Takeover),
                    Slot::none(),
                )
                .await,
        ),
        Takeover::Park(reason) => park(claimer, claim, reason).await,
        Takeover::Reconcile => reconcile::reconcile_taken(claimer, consumer, claim, hold).await,
    };
    item(claim, &decision, result)
}

/// How long after the claim went quiet a "not found" is trusted: `not_found_after`; for a claim
/// past `send_deadline`, which the "not found" would end `failed` "never sent", at least three
/// times the effect's timeout ([`policy::never_sent_quiet`]).
fn trust_not_found_after(consumer: &Consumer, past_deadline: bool) -> Duration {
    let after = consumer.effect.not_found_after();
    if past_deadline {
        policy::never_sent_quiet(after, consumer.config.effect.timeout())
    } else {
        after
    }
}

/// Whether a "not found" may be trusted: `not_found_after` has passed since the claim went
/// quiet; `Err` says how much longer to wait. [`quiet_since`] reads that from the history.
async fn not_found_trusted(
    claimer: &Claimer,
    claim: &Claim,
    not_found_after: Duration,
) -> Result<(), Duration> {
    if not_found_after.is_zero() {
        return Ok(());
    }
    let store = claimer.store();
    let (Ok(events), Ok(now)) = (store.events(claim.id).await, store.now().await) else {
        return Err(Duration::from_secs(1).max(not_found_after / 10));
    };
    let since = quiet_since(events.iter().map(|e| (e.action.as_str(), e.at_utc)));
    let quiet = since.map_or(Duration::ZERO, |t| (now - t).to_std().unwrap_or_default());
    if quiet >= not_found_after {
        Ok(())
    } else {
        Err(not_found_after - quiet)
    }
}

/// Since when a claim has been quiet (no call that may have applied): the first lookup of the
/// unbroken run of lookups and hand-offs that ends its history. No call is made inside such a
/// run (a call is preceded by a `resend` line or followed by a `perform` line), and its first
/// lookup came after the last call ended (inline, after the call returned; in a takeover, after
/// the previous lease ran out), so the quiet time is carried across takeovers however long the
/// lease. `None` when the history ends with no lookup: the last call may have just happened (a
/// worker that died mid-call writes nothing).
pub fn quiet_since<T: Copy>(
    events: impl DoubleEndedIterator<Item = (impl AsRef<str>, T)>,
) -> Option<T> {
    events
        .rev()
        .take_while(|(action, _)| matches!(action.as_ref(), "lookup" | "handoff"))
        .filter(|(action, _)| action.as_ref() == "lookup")
        .last()
        .map(|(_, at)| at)
}

/// Hands a taken claim back to wait, its lease ending `wait` from now, without counting an
/// attempt (one try: if it fails, the lease runs out and the next pass decides again).
async fn wait_undecided(claimer: &Claimer, claim: &Claim, why: &str, wait: Duration) {
    let _ = claimer
        .settler()
        .hand_off(
            &mut Slot::none(),
            claim,
            why,
            None,
            Some(Handoff::Undecided),
            wait,
        )
        .await;
}

/// Parks a taken claim for a person (one try: a store error leaves it for the next pass).
async fn park(claimer: &Claimer, claim: &Claim, reason: &str) -> String {
    end_name(&park_end(claimer, claim, reason).await)
}

/// [`park`], saying how the attempt ended.
async fn park_end(claimer: &Claimer, claim: &Claim, reason: &str) -> AttemptEnd {
    settle_taken_end(
        claimer,
        claim,
        settle::park(reason.to_string(), None),
        "sweep",
        "parked",
    )
    .await
}

/// Settles a taken claim (one try: a store error leaves it for the next pass) and says how.
async fn settle_taken(
    claimer: &Claimer,
    claim: &Claim,
    s: crate::store::Settlement,
    action: &str,
    outcome: &str,
) -> String {
    end_name(&settle_taken_end(claimer, claim, s, action, outcome).await)
}

/// [`settle_taken`], saying how the attempt ended.
async fn settle_taken_end(
    claimer: &Claimer,
    claim: &Claim,
    s: crate::store::Settlement,
    action: &str,
    outcome: &str,
) -> AttemptEnd {
    claimer
        .settler()
        .settle(&mut Slot::none(), claim, None, s, action, outcome)
        .await
}

/// The interval between two firings of a six-field cron `schedule` from now.
pub fn schedule_period(schedule: &str) -> Option<Duration> {
    let cron = crate::config::parse_cron(schedule).ok()?;
    let now = Utc::now();
    let a = cron.find_next_occurrence(&now, false).ok()?;
    let b = cron.find_next_occurrence(&a, false).ok()?;
    (b - a).to_std().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quiet_time_starts_at_the_first_lookup_after_the_last_call() {
        let h = |lines: &[(&'static str, i32)]| quiet_since(lines.iter().copied());
        // A call, then lookups across takeovers: quiet since the first lookup.
        assert_eq!(
            h(&[
                ("perform", 1),
                ("lookup", 2),
                ("handoff", 3),
                ("lookup", 70),
                ("handoff", 71),
                ("lookup", 140)
            ]),
            Some(2)
        );
        // A re-send after the lookups: quiet only since the lookup after it.
        assert_eq!(
            h(&[("lookup", 2), ("resend", 5), ("perform", 6), ("lookup", 7)]),
            Some(7)
        );
        // Nothing but a call: not quiet at all.
        assert_eq!(h(&[("perform", 1)]), None);
    }

    #[test]
    fn periods_come_from_the_cron_expression() {
        assert_eq!(
            schedule_period("*/10 * * * * *"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(schedule_period("* * * * * *"), Some(Duration::from_secs(1)));
        assert_eq!(
            schedule_period("0 0 3 * * *"),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(schedule_period("nonsense"), None);
    }
}
