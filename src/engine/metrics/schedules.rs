//! Periodic effects' series (`[[schedules]]`, docs/schedules.md):
//! `claimd_schedule_slots_total{schedule, outcome}`, what became of each slot this instance
//! handled. `submitted`: a new claim; `duplicate`: another instance (or an earlier try)
//! claimed it first; `skipped`: missed and left out by `catch_up` (or past the catch-up
//! bound); `refused`: the consumer refused the message (a payload it cannot send), logged as
//! an error. Labels: the configured schedule names, a bounded set.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SlotLabels {
    schedule: String,
    outcome: String,
}

/// What became of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotOutcome {
    /// Claimed by this instance: a new claim.
    Submitted,
    /// Claimed before (by another instance or an earlier try).
    Duplicate,
    /// Missed and left out by `catch_up`.
    Skipped,
    /// Refused by the consumer.
    Refused,
}

impl SlotOutcome {
    const ALL: [SlotOutcome; 4] = [
        SlotOutcome::Submitted,
        SlotOutcome::Duplicate,
        SlotOutcome::Skipped,
        SlotOutcome::Refused,
    ];

    fn as_str(self) -> &'static str {
        match self {
            SlotOutcome::Submitted => "submitted",
            SlotOutcome::Duplicate => "duplicate",
            SlotOutcome::Skipped => "skipped",
            SlotOutcome::Refused => "refused",
        }
    }
}

/// The schedules' series.
#[derive(Debug, Default)]
pub struct ScheduleMetrics {
    slots: Family<SlotLabels, Counter>,
}

impl ScheduleMetrics {
    /// Registers the series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "schedule_slots",
            "Slots of periodic schedules handled by this instance, by outcome: submitted (a new claim), duplicate (claimed before), skipped (missed, left out by catch_up), refused (the consumer refused the message)",
            self.slots.clone(),
        );
    }

    /// Creates each schedule's series at zero, so `increase()` sees the first slot.
    pub fn init(&self, schedules: &[String]) {
        for s in schedules {
            for outcome in SlotOutcome::ALL {
                let _ = self.slots.get_or_create(&labels(s, outcome));
            }
        }
    }

    /// `n` slots of `schedule` came to `outcome`.
    pub fn slots(&self, schedule: &str, outcome: SlotOutcome, n: u64) {
        if n > 0 {
            self.slots
                .get_or_create(&labels(schedule, outcome))
                .inc_by(n);
        }
    }
}

fn labels(schedule: &str, outcome: SlotOutcome) -> SlotLabels {
    SlotLabels {
        schedule: schedule.to_string(),
        outcome: outcome.as_str().to_string(),
    }
}
