//! Periodic effects (`[[schedules]]`, docs/schedules.md): at each slot of a schedule, its
//! message goes through the claimer's ordinary intake ([`Claimer::submit`]) with the id
//! `schedule:<name>:<slot>`, so whichever instance gets there first claims it and the others'
//! submits are duplicates. Each schedule's last slot is kept in the store
//! ([`ScheduleStore`](crate::store::ScheduleStore)) and moved forward once its slots are
//! claimed; after a downtime the slots in between are missed and `catch_up` says what becomes
//! of them ([`periodic::plan`]). Every time in a decision is the store's clock.

use crate::config::{ScheduleConfig, parse_schedule_cron};
use crate::domain::periodic::{self, MAX_CATCH_UP, SCAN_LIMIT};
use crate::engine::claimer::{Accepted, Claimer, Delivery, SubmitError};
use crate::engine::metrics::schedules::SlotOutcome;
use crate::store::StoreError;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use tracing::{error, info, warn};

/// Why a schedule's slots were not all claimed at a tick: they are tried again at the next.
#[derive(Debug, thiserror::Error)]
pub enum PeriodicError {
    /// The store failed.
    #[error("schedule {schedule}: {source}")]
    Store {
        /// The schedule.
        schedule: String,
        /// The store's error.
        source: StoreError,
    },
    /// A slot could not be claimed now (busy, shutting down, store down).
    #[error("schedule {schedule}: slot {slot}: {source}")]
    Submit {
        /// The schedule.
        schedule: String,
        /// The slot, RFC 3339.
        slot: String,
        /// The claimer's answer.
        source: SubmitError,
    },
    /// The schedule's cron expression does not parse (refused at load; here for one built in
    /// code).
    #[error("schedule {schedule}: cron: {why}")]
    Cron {
        /// The schedule.
        schedule: String,
        /// Why.
        why: String,
    },
}

/// One schedule as the runner keeps it.
#[derive(Debug)]
struct Watched {
    config: ScheduleConfig,
    cron: croner::Cron,
    /// The last slot as last read or written; `None` before the first tick.
    last: Option<DateTime<Utc>>,
    /// When, by this instance's clock, the store's clock reaches the next slot: set when a
    /// tick came before it (the store's clock behind this one's), so the next tick waits for
    /// it instead of asking again at once.
    store_reaches_next: Option<DateTime<Utc>>,
}

impl Watched {
    /// When the next tick is needed for this schedule, by this instance's clock.
    fn due_at(&self) -> Option<DateTime<Utc>> {
        let Some(last) = self.last else {
            return Some(DateTime::<Utc>::MIN_UTC);
        };
        let next = periodic::next_slot(&self.cron, last)?;
        Some(self.store_reaches_next.map_or(next, |at| at.max(next)))
    }
}

/// The schedules of this instance and when it started watching them.
#[derive(Debug)]
pub struct Periodic {
    claimer: Arc<Claimer>,
    schedules: Vec<Watched>,
    /// The store's clock when this instance started watching: slots due well before it were
    /// missed ([`periodic::ON_TIME_GRACE`]).
    watching_since: DateTime<Utc>,
}

impl Periodic {
    /// Starts watching `schedules` now (the store's clock); a schedule seen for the first time
    /// starts at now, with no slot before it.
    pub async fn start(
        claimer: Arc<Claimer>,
        schedules: &[ScheduleConfig],
    ) -> Result<Periodic, PeriodicError> {
        let store_err = |source| PeriodicError::Store {
            schedule: String::new(),
            source,
        };
        let watching_since = claimer.store().now().await.map_err(store_err)?;
        let mut watched = Vec::new();
        for s in schedules {
            let cron = parse_schedule_cron(&s.cron).map_err(|why| PeriodicError::Cron {
                schedule: s.name.clone(),
                why,
            })?;
            watched.push(Watched {
                config: s.clone(),
                cron,
                last: None,
                store_reaches_next: None,
            });
        }
        let names: Vec<String> = schedules.iter().map(|s| s.name.clone()).collect();
        claimer.metrics().schedules.init(&names);
        Ok(Periodic {
            claimer,
            schedules: watched,
            watching_since,
        })
    }

    /// When the next tick is needed by this instance's clock: the earliest next slot after each
    /// schedule's last one (now for a schedule not read yet). `None`: no schedule.
    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        self.schedules.iter().filter_map(Watched::due_at).min()
    }

    /// Submits the pending slots of every schedule whose next slot came by this instance's
    /// clock. A schedule that failed is tried again at the next tick; its error is returned.
    pub async fn tick(&mut self) -> Vec<PeriodicError> {
        let now = Utc::now();
        let mut errors = Vec::new();
        for i in 0..self.schedules.len() {
            let due = self.schedules[i].due_at().is_some_and(|at| at <= now);
            if due && let Err(e) = self.run(i).await {
                errors.push(e);
            }
        }
        errors
    }

    /// Reads schedule `i`'s last slot, plans, submits and moves the last slot forward.
    async fn run(&mut self, i: usize) -> Result<(), PeriodicError> {
        let claimer = self.claimer.clone();
        let store = claimer.store();
        let w = &mut self.schedules[i];
        let name = w.config.name.clone();
        let store_err = |source| PeriodicError::Store {
            schedule: name.clone(),
            source,
        };
        let now = store.now().await.map_err(store_err)?;
        let last = store.start_schedule(&name, now).await.map_err(store_err)?;
        w.last = Some(last);
        w.store_reaches_next = None;
        let plan = periodic::plan(&w.cron, last, self.watching_since, now, w.config.catch_up);
        let Some(through) = plan.through else {
            // Nothing pending by the store's clock: it is behind ours (or another instance
            // claimed the slot). Wake when it reaches the next slot.
            if let Some(next) = periodic::next_slot(&w.cron, last) {
                w.store_reaches_next = Some(Utc::now() + (next - now));
            }
            return Ok(());
        };
        let metrics = &claimer.metrics().schedules;
        if plan.skipped > 0 || plan.skipped_uncounted {
            metrics.slots(&name, SlotOutcome::Skipped, plan.skipped);
            warn!(
                schedule = %name,
                missed = plan.missed,
                skipped = plan.skipped,
                more_skipped = plan.skipped_uncounted,
                catch_up = w.config.catch_up.as_str(),
                "{}",
                skipped_words(&plan)
            );
        }
        let mut done: Option<DateTime<Utc>> = None;
        for slot in &plan.submit {
            match submit(&claimer, &w.config, *slot).await {
                Ok(outcome) => {
                    metrics.slots(&name, outcome, 1);
                    done = Some(*slot);
                }
                Err(source) => {
                    // The slots claimed so far stay claimed: the last slot moves up to them.
                    if let Some(done) = done {
                        store
                            .advance_schedule(&name, done)
                            .await
                            .map_err(store_err)?;
                        w.last = Some(done);
                    }
                    return Err(PeriodicError::Submit {
                        schedule: name.clone(),
                        slot: periodic::slot_text(*slot),
                        source,
                    });
                }
            }
        }
        store
            .advance_schedule(&name, through)
            .await
            .map_err(store_err)?;
        w.last = Some(through);
        Ok(())
    }
}

/// Whether each schedule's messages can be sent by its consumer, checked on a sample slot as
/// intake checks a message before claiming (the effect's checks of the payload and its URL
/// values, the order key, the rate-limit key, the idempotency key's length): a schedule whose
/// every slot would be refused is refused at start instead. `Err`: the first such schedule,
/// in words.
pub fn check_messages(claimer: &Claimer, schedules: &[ScheduleConfig]) -> Result<(), String> {
    let slot = Utc::now();
    for s in schedules {
        let Some(consumer) = claimer.consumer(&s.consumer) else {
            return Err(format!(
                "schedule {:?}: no consumer {:?}",
                s.name, s.consumer
            ));
        };
        let message_id = periodic::message_id(&s.name, slot);
        let payload = periodic::render_payload(&s.payload, &s.name, slot);
        crate::engine::claimer::check_payload(
            consumer,
            &message_id,
            &s.tenant,
            payload.as_bytes(),
            "application/json",
        )
        .map_err(|(e, _)| {
            format!(
                "schedule {:?}: consumer {:?} would refuse its messages: {e}",
                s.name, s.consumer
            )
        })?;
    }
    Ok(())
}

/// The warning of a catch-up that skipped slots.
fn skipped_words(plan: &periodic::SlotPlan) -> String {
    if plan.skipped_uncounted {
        format!(
            "more than {SCAN_LIMIT} slots were pending: only the newest {} are submitted (at most {MAX_CATCH_UP} at once), the older ones skipped",
            plan.submit.len()
        )
    } else if plan.submit.len() == MAX_CATCH_UP {
        format!(
            "{} slots were pending: the newest {MAX_CATCH_UP} are submitted, {} older ones skipped",
            plan.submit.len() as u64 + plan.skipped,
            plan.skipped
        )
    } else {
        format!(
            "{} slots were missed while no instance ran; {} skipped as catch_up says",
            plan.missed, plan.skipped
        )
    }
}

/// Submits one slot's message. `Err`: not claimed now, try again (busy, shutting down, the
/// store); a message the consumer refuses is logged and counted, never retried (it would be
/// refused again).
async fn submit(
    claimer: &Arc<Claimer>,
    s: &ScheduleConfig,
    slot: DateTime<Utc>,
) -> Result<SlotOutcome, SubmitError> {
    let message_id = periodic::message_id(&s.name, slot);
    let delivery = Delivery {
        consumer: s.consumer.clone(),
        tenant: s.tenant.clone().into_bytes(),
        message_id: message_id.clone().into_bytes(),
        payload: periodic::render_payload(&s.payload, &s.name, slot).into(),
        content_type: b"application/json".to_vec(),
        not_before: None,
        trace_parent: None,
        priority: 0,
    };
    match claimer.submit(delivery).await {
        Ok(Accepted::New(_)) => {
            info!(schedule = %s.name, consumer = %s.consumer, %message_id, "schedule slot claimed");
            Ok(SlotOutcome::Submitted)
        }
        Ok(Accepted::Duplicate(_)) => Ok(SlotOutcome::Duplicate),
        Err(SubmitError::Conflict { .. }) => {
            // Claimed before with another payload: the template changed since (a rolling
            // upgrade). The slot is claimed; its first payload stands.
            warn!(schedule = %s.name, %message_id, "schedule slot claimed before with another payload; that one stands");
            Ok(SlotOutcome::Duplicate)
        }
        Err(
            e @ (SubmitError::Busy(_)
            | SubmitError::ShuttingDown
            | SubmitError::NotReplicated(_)
            | SubmitError::Store(_)
            | SubmitError::Interrupted),
        ) => Err(e),
        // What the consumer refuses of this message: listed one by one, so a variant added
        // later is decided here, not passed over as a refusal.
        Err(
            e @ (SubmitError::UnknownConsumer(_)
            | SubmitError::BadId(_)
            | SubmitError::BadPayload(_)
            | SubmitError::BadContentType(_)
            | SubmitError::NotJson(_)
            | SubmitError::UnsafeUrlValue(_)
            | SubmitError::TenantNotKeyed(_)
            | SubmitError::KeyTooLong(_)),
        ) => {
            error!(schedule = %s.name, consumer = %s.consumer, %message_id, error = %e, "schedule slot refused by its consumer; it is not performed");
            Ok(SlotOutcome::Refused)
        }
    }
}
