//! Periodic effects (`[[schedules]]`, docs/schedules.md): which slots of a cron schedule to
//! submit at a tick, and what a slot's message is called and carries. Pure, in UTC (no
//! daylight-saving shifts): the caller brings the times (the store's clock) and the last slot
//! submitted (the store's `schedule_slots`).
//!
//! A slot is a point in time the cron expression matches. A slot that fell due while no
//! instance was running (before [`ON_TIME_GRACE`] ahead of the moment the instance finding it
//! started watching) is *missed*, and `catch_up` says what becomes of missed slots; every
//! other slot is *due* and submitted.

use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Most slots submitted at one tick: after a long downtime with `catch_up = "all"`, only the
/// newest this many are submitted, the older ones skipped (and said so in a warning).
pub const MAX_CATCH_UP: usize = 1_000;

/// Most slots looked at in one tick, newest first: older ones (a every-second schedule after
/// days down) are skipped without being counted one by one.
pub const SCAN_LIMIT: usize = 10_000;

/// A slot that fell due this little before the instance started watching is still due, not
/// missed: another instance, running then, may be about to submit it, and a starting instance
/// must not declare it missed under it.
pub const ON_TIME_GRACE: Duration = Duration::from_secs(3);

/// What becomes of missed slots (`catch_up`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// Every missed slot is submitted, oldest first (at most [`MAX_CATCH_UP`]).
    All,
    /// Only the newest missed slot is submitted; the older ones are skipped. The default: one
    /// run catches up (one payout sweep, not one per night the service was down).
    #[default]
    Latest,
    /// Missed slots are skipped.
    None,
}

impl CatchUp {
    /// The configuration's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::All => "all",
            CatchUp::Latest => "latest",
            CatchUp::None => "none",
        }
    }
}

/// What to do at one tick, from [`plan`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotPlan {
    /// The slots to submit, oldest first.
    pub submit: Vec<DateTime<Utc>>,
    /// Slots skipped, counted (missed slots `catch_up` leaves out, and those past
    /// [`MAX_CATCH_UP`]).
    pub skipped: u64,
    /// More slots than [`SCAN_LIMIT`] were pending: older ones were skipped uncounted.
    pub skipped_uncounted: bool,
    /// How many of the pending slots were missed (fell due before the instance watched).
    pub missed: u64,
    /// The newest pending slot: the schedule's last slot once the submits succeeded. `None`:
    /// nothing was pending.
    pub through: Option<DateTime<Utc>>,
}

/// The slots pending at `now` (after `last`, at or before `now`) and what to do with each:
/// `watching_since` is when this instance started watching the schedule; slots earlier than
/// it by more than [`ON_TIME_GRACE`] are missed and follow `catch_up`, the others are due.
/// At most [`MAX_CATCH_UP`] are submitted (the newest), and at most [`SCAN_LIMIT`] looked at.
pub fn plan(
    cron: &croner::Cron,
    last: DateTime<Utc>,
    watching_since: DateTime<Utc>,
    now: DateTime<Utc>,
    catch_up: CatchUp,
) -> SlotPlan {
    let mut pending: Vec<DateTime<Utc>> = Vec::new();
    let mut skipped_uncounted = false;
    // Newest first, from `now` inclusive down to `last` exclusive. (Stepped by hand: croner's
    // backward iterator skips a second after each match.)
    let mut from = now.trunc_subsecs(0);
    let mut inclusive = true;
    while let Ok(slot) = cron.find_previous_occurrence(&from, inclusive) {
        if slot <= last {
            break;
        }
        if pending.len() == SCAN_LIMIT {
            skipped_uncounted = true;
            break;
        }
        pending.push(slot);
        (from, inclusive) = (slot, false);
    }
    let through = pending.first().copied();
    let missed_before =
        watching_since - chrono::Duration::from_std(ON_TIME_GRACE).unwrap_or_default();
    let (due, missed): (Vec<_>, Vec<_>) = pending.iter().partition(|s| **s >= missed_before);
    let mut submit: Vec<DateTime<Utc>> = due;
    match catch_up {
        CatchUp::All => submit.extend(missed.iter()),
        CatchUp::Latest => submit.extend(missed.first()),
        CatchUp::None => {}
    }
    submit.truncate(MAX_CATCH_UP);
    submit.reverse();
    SlotPlan {
        skipped: (pending.len() - submit.len()) as u64,
        missed: missed.len() as u64,
        submit,
        skipped_uncounted,
        through,
    }
}

/// The first slot after `after`; `None` when the expression matches no later time.
pub fn next_slot(cron: &croner::Cron, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    cron.find_next_occurrence(&after.trunc_subsecs(0), false)
        .ok()
}

/// A slot as its message id and payload write it: RFC 3339 in UTC, to the second
/// (`2026-12-01T02:00:00Z`).
pub fn slot_text(slot: DateTime<Utc>) -> String {
    slot.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The message id of a slot: `schedule:<name>:<slot>`. The same for every instance, so the
/// claim key (consumer, tenant, message id) makes a slot happen once across all of them.
pub fn message_id(schedule: &str, slot: DateTime<Utc>) -> String {
    format!("schedule:{schedule}:{}", slot_text(slot))
}

/// The longest schedule name: its message ids stay well within the 255 characters of one.
pub const MAX_NAME_LEN: usize = 64;

/// Checks a schedule name: 1 to [`MAX_NAME_LEN`] letters, digits, `-`, `_` or `.` (it is part
/// of message ids and of a metric label).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{name:?}: a name is 1 to {MAX_NAME_LEN} characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "{name:?}: {c:?} is not allowed; a name is letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}

/// The payload template when none is given.
pub const DEFAULT_PAYLOAD: &str = r#"{"schedule": "{{schedule}}", "slot": "{{slot}}"}"#;

/// A slot's payload: `template` with `{{slot}}` replaced by the slot ([`slot_text`]),
/// `{{slot_unix}}` by its Unix time in seconds and `{{schedule}}` by the schedule's name. The
/// values have no character JSON would need escaped, so a template that is JSON stays JSON.
pub fn render_payload(template: &str, schedule: &str, slot: DateTime<Utc>) -> String {
    template
        .replace("{{slot}}", &slot_text(slot))
        .replace("{{slot_unix}}", &slot.timestamp().to_string())
        .replace("{{schedule}}", schedule)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn cron(s: &str) -> croner::Cron {
        croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Required)
            .build()
            .parse(s)
            .unwrap()
    }

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, h, m, s).unwrap()
    }

    #[test]
    fn a_running_instance_submits_the_slot_that_came_due() {
        let every_5s = cron("*/5 * * * * *");
        let p = plan(
            &every_5s,
            at(9, 0, 0),
            at(8, 0, 0),
            at(9, 0, 5),
            CatchUp::None,
        );
        assert_eq!(p.submit, vec![at(9, 0, 5)]);
        assert_eq!((p.skipped, p.missed, p.through), (0, 0, Some(at(9, 0, 5))));
        // A tick a little late still submits every slot that came due while it ran.
        let p = plan(
            &every_5s,
            at(9, 0, 0),
            at(8, 0, 0),
            at(9, 0, 11),
            CatchUp::None,
        );
        assert_eq!(p.submit, vec![at(9, 0, 5), at(9, 0, 10)]);
        // Nothing pending: nothing to do, nothing to advance.
        let p = plan(
            &every_5s,
            at(9, 0, 5),
            at(8, 0, 0),
            at(9, 0, 9),
            CatchUp::All,
        );
        assert_eq!(p, SlotPlan::default());
    }

    #[test]
    fn missed_slots_follow_catch_up() {
        // Down from 9:00:00 to 9:00:30; slots every 5 s: 9:00:05 .. 9:00:25 were missed (9:00:30
        // is within the grace of the start), 9:00:35 is due.
        let every_5s = cron("*/5 * * * * *");
        let (last, since, now) = (at(9, 0, 0), at(9, 0, 31), at(9, 0, 35));
        let all = plan(&every_5s, last, since, now, CatchUp::All);
        assert_eq!(
            all.submit,
            vec![
                at(9, 0, 5),
                at(9, 0, 10),
                at(9, 0, 15),
                at(9, 0, 20),
                at(9, 0, 25),
                at(9, 0, 30),
                at(9, 0, 35)
            ]
        );
        assert_eq!((all.skipped, all.missed), (0, 5));
        let latest = plan(&every_5s, last, since, now, CatchUp::Latest);
        assert_eq!(
            latest.submit,
            vec![at(9, 0, 25), at(9, 0, 30), at(9, 0, 35)]
        );
        assert_eq!((latest.skipped, latest.missed), (4, 5));
        let none = plan(&every_5s, last, since, now, CatchUp::None);
        assert_eq!(none.submit, vec![at(9, 0, 30), at(9, 0, 35)]);
        assert_eq!(none.skipped, 5);
        for p in [all, latest, none] {
            assert_eq!(
                p.through,
                Some(at(9, 0, 35)),
                "every pending slot is passed"
            );
        }
    }

    #[test]
    fn catch_up_is_bounded() {
        // Every second, down a day: 86,399 slots missed.
        let every_s = cron("* * * * * *");
        let (last, since) = (at(0, 0, 0), at(23, 59, 59));
        let p = plan(&every_s, last, since, since, CatchUp::All);
        assert_eq!(p.submit.len(), MAX_CATCH_UP);
        assert_eq!(p.submit.last(), Some(&since));
        assert_eq!(
            p.submit.first(),
            Some(&(since - chrono::Duration::seconds(999)))
        );
        assert!(p.skipped_uncounted);
        assert_eq!(p.skipped, (SCAN_LIMIT - MAX_CATCH_UP) as u64);
        assert_eq!(p.through, Some(since));
        let p = plan(&every_s, last, since, since, CatchUp::Latest);
        // The newest slots within the grace are due; the newest missed one is caught up.
        assert_eq!(p.submit.len(), 5);
    }

    #[test]
    fn a_nightly_slot_missed_over_a_week_runs_once_with_latest() {
        let nightly = cron("0 0 2 * * *");
        let last = Utc.with_ymd_and_hms(2026, 11, 24, 2, 0, 0).unwrap();
        let since = Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap();
        let p = plan(&nightly, last, since, since, CatchUp::Latest);
        assert_eq!(p.submit, vec![at(2, 0, 0)]);
        assert_eq!((p.skipped, p.missed), (6, 7));
        assert_eq!(
            next_slot(&nightly, since),
            Some(Utc.with_ymd_and_hms(2026, 12, 2, 2, 0, 0).unwrap())
        );
    }

    #[test]
    fn ids_and_payloads_name_the_slot() {
        let slot = Utc.with_ymd_and_hms(2026, 12, 1, 2, 0, 0).unwrap();
        assert_eq!(
            message_id("nightly-payouts", slot),
            "schedule:nightly-payouts:2026-12-01T02:00:00Z"
        );
        let body = render_payload(DEFAULT_PAYLOAD, "nightly", slot);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["slot"], "2026-12-01T02:00:00Z");
        assert_eq!(v["schedule"], "nightly");
        assert_eq!(render_payload("{{slot_unix}}", "n", slot), "1796090400");
        assert!(check_name("nightly-payouts.v2").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a b").unwrap_err().contains("' '"));
        assert!(check_name(&"x".repeat(65)).is_err());
    }
}
