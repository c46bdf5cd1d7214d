//! The sweeper: finds `started` claims whose lease expired (crash, timeout, lost hand-off),
//! takes them over (attempt + 1, new lease, one statement) and re-drives, reconciles or parks
//! each, as [`policy::on_takeover`] decides. No claim stays stuck (I4); no outcome is guessed (I6).

use crate::claim::Claim;
use crate::claimer::{AttemptEnd, Claimer, Consumer, Hold, Slot};
use crate::effect::Lookup;
use crate::policy::{self, Takeover, TakeoverFacts};
use crate::settle::{self, Resend};
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
        }
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
            per_consumer.push(tokio::spawn(async move {
                sweep_consumer(&claimer, &consumer, batch, cutoff).await
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
async fn sweep_consumer(
    claimer: &Arc<Claimer>,
    consumer: &Arc<Consumer>,
    batch: u32,
    cutoff: chrono::DateTime<Utc>,
) -> Result<Vec<SweepItem>, StoreError> {
    let cfg = &consumer.config;
    let wait = cfg.effect.timeout().min(cfg.lease.0);
    let mut items = Vec::new();
    let mut remaining = batch;
    while remaining > 0 {
        let chunk = remaining.min(cfg.concurrency);
        // Before the statement that sets the leases: the local deadline must not fall after
        // the one the database recorded.
        let lease_start = Instant::now();
        let taken = claimer
            .store()
            .take_stale(&cfg.name, chunk, claimer.instance(), cfg.lease.0, cutoff)
            .await?;
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
            match tokio::time::timeout_at(until, task).await {
                Ok(Ok(i)) => items.push(i),
                Ok(Err(e)) => warn!(error = %e, "sweeper task failed"),
                Err(_) => {
                    // Dropping the handle detaches the task; it keeps the claim's lease.
                    in_background += 1;
                    background.result = format!(
                        "still running after {}; finishing in the background",
                        crate::duration::Dur(wait)
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
    let cfg = &consumer.config;
    policy::on_takeover(TakeoverFacts {
        attempt: t.claim.attempt,
        max_attempts: cfg.max_attempts,
        age: t.age,
        redrive_within: cfg.redrive_within.0,
        on_unknown: cfg.on_unknown,
        handoff: t.handoff,
        can_reconcile: consumer.effect.can_reconcile(),
    })
}

fn action_name(decision: &Takeover) -> &'static str {
    match decision {
        Takeover::Perform { resend: false } => "redrive",
        Takeover::Perform { resend: true } => "resend",
        Takeover::Reconcile => "reconcile",
        Takeover::Park(_) => "park",
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

/// Carries out the decision for one taken claim.
#[instrument(skip_all, fields(consumer = %t.claim.consumer, tenant = %t.claim.tenant, message_id = %t.claim.message_id, attempt = t.claim.attempt))]
async fn handle(
    claimer: &Claimer,
    consumer: &Consumer,
    t: TakenClaim,
    lease_start: Instant,
) -> SweepItem {
    let decision = decide(consumer, &t);
    let claim = &t.claim;
    let hold = Hold {
        since: lease_start,
        age: t.age,
    };
    claimer.metrics().sweep_action(action_name(&decision));
    let result = match &decision {
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
        Takeover::Reconcile => match claimer.lookup(consumer, claim).await {
            Some(Lookup::Found {
                status, response, ..
            }) => end_name(
                &claimer
                    .settler()
                    .settle(
                        &mut Slot::none(),
                        claim,
                        None,
                        settle::completed(status, response, true),
                        "reconcile",
                        "found",
                    )
                    .await,
            ),
            Some(Lookup::NotFound { .. })
                if !not_found_trusted(claimer, claim, consumer.effect.not_found_after()).await =>
            {
                // Keep the lease: the next pass asks again once the provider's search has
                // had not_found_after to catch up.
                format!(
                    "not found, but too soon after the last call to trust (not_found_after = {}); will ask again",
                    crate::duration::Dur(consumer.effect.not_found_after())
                )
            }
            Some(Lookup::NotFound { .. }) => {
                match policy::after_not_found(hold.age_now(), consumer.config.redrive_within.0) {
                    Takeover::Perform { .. } => {
                        let end = claimer
                            .drive(consumer, claim, hold, Some(Resend::NotFound), Slot::none())
                            .await;
                        format!("not found at provider; redriven: {}", end_name(&end))
                    }
                    Takeover::Park(reason) => park(claimer, claim, &reason).await,
                    Takeover::Reconcile => unreachable!("after_not_found never reconciles"),
                }
            }
            Some(Lookup::Unknown { error }) => {
                // Keep the lease: the next pass after it expires asks again, and
                // max_attempts parks it eventually. (The lookup wrote its own history line.)
                format!("status unknown ({error}); will ask again")
            }
            None => park(claimer, claim, "no status endpoint to reconcile with").await,
        },
    };
    item(claim, &decision, result)
}

/// Whether a "not found" may be trusted: `not_found_after` has passed since the last call.
/// The history proves when the claim was last quiet: a lookup line (this one aside) followed
/// by nothing but hand-offs means no call was made after it (a call is preceded by a `resend`
/// line or followed by a `perform` line). Without such proof the last call may have just
/// happened (a worker that died mid-call writes nothing), so it is not trusted yet.
async fn not_found_trusted(claimer: &Claimer, claim: &Claim, not_found_after: Duration) -> bool {
    if not_found_after.is_zero() {
        return true;
    }
    let store = claimer.store();
    let (Ok(events), Ok(now)) = (store.events(claim.id).await, store.now().await) else {
        return false;
    };
    let quiet_since = events
        .iter()
        .rev()
        // This attempt's own lookup line.
        .skip_while(|e| e.attempt == claim.attempt && e.action == "lookup")
        .find(|e| e.action != "handoff")
        .filter(|e| e.action == "lookup")
        .map(|e| e.at_utc);
    quiet_since.is_some_and(|t| (now - t).to_std().unwrap_or_default() >= not_found_after)
}

/// Parks a taken claim for a person (one try: a store error leaves it for the next pass).
async fn park(claimer: &Claimer, claim: &Claim, reason: &str) -> String {
    end_name(
        &claimer
            .settler()
            .settle(
                &mut Slot::none(),
                claim,
                None,
                settle::park(reason.to_string(), None),
                "sweep",
                "parked",
            )
            .await,
    )
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
