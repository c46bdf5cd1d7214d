//! The statements of periodic effects' slots (`Statements::schedule_start`,
//! `Statements::schedule_advance`, `Statements::schedule_slots`): one row per schedule, its
//! last slot only ever moved forward.

/// Start a schedule's row unless another instance did: name, last slot.
pub(super) const SCHEDULE_START: &str = "\
    INSERT INTO schedule_slots (name, last_slot_utc) VALUES ($1, $2) \
    ON CONFLICT (name) DO NOTHING";

/// Move a schedule's last slot forward (`GREATEST`: an instance late with an older slot never
/// moves it back): name, slot.
pub(super) const SCHEDULE_ADVANCE: &str = "\
    INSERT INTO schedule_slots (name, last_slot_utc) VALUES ($1, $2) \
    ON CONFLICT (name) DO UPDATE SET \
      last_slot_utc = GREATEST(schedule_slots.last_slot_utc, EXCLUDED.last_slot_utc), \
      updated_utc = now()";

/// Every schedule's row, by name.
pub(super) const SCHEDULE_SLOTS: &str = "\
    SELECT name, last_slot_utc, updated_utc FROM schedule_slots ORDER BY name";
