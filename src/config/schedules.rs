//! `[[schedules]]`: periodic effects (docs/schedules.md). Each slot of a cron expression is a
//! message to a consumer, with the id `schedule:<name>:<slot>`, so it is claimed once across
//! every instance.

use super::Config;
use crate::domain::periodic::{self, CatchUp};
use serde::{Deserialize, Serialize};

/// One `[[schedules]]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Unique name: letters, digits, `-`, `_`, `.` (part of each slot's message id).
    pub name: String,
    /// Cron expression in UTC: five fields (minute first) or six (seconds first).
    pub cron: String,
    /// The consumer each slot's message goes to.
    pub consumer: String,
    /// The messages' tenant (empty: none); the consumer's key must contain `{tenant}`.
    #[serde(default)]
    pub tenant: String,
    /// The JSON payload of each slot's message, with `{{slot}}`, `{{slot_unix}}` and
    /// `{{schedule}}` filled in ([`periodic::render_payload`]).
    #[serde(default = "default_payload")]
    pub payload: String,
    /// What becomes of slots missed while no instance ran (default `"latest"`).
    #[serde(default)]
    pub catch_up: CatchUp,
}

fn default_payload() -> String {
    periodic::DEFAULT_PAYLOAD.to_string()
}

/// Parses a schedule's cron expression: five fields (minute first, at second 0) or six
/// (seconds first), in UTC.
pub fn parse_schedule_cron(cron: &str) -> Result<croner::Cron, String> {
    let fields = cron.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!(
            "{cron:?}: expected 5 fields (min hour day month weekday) or 6 (sec min hour day month weekday)"
        ));
    }
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(cron)
        .map_err(|e| format!("{cron:?}: {e}"))
}

impl Config {
    /// Checks `[[schedules]]`: each error names the schedule and its key.
    pub(super) fn validate_schedules(&self) -> Result<(), (String, String)> {
        let mut seen = std::collections::BTreeSet::new();
        for (i, s) in self.schedules.iter().enumerate() {
            let at = |key: &str, why: String| {
                (
                    format!("schedules[{i}].{key}"),
                    format!("schedule {:?}: {why}", s.name),
                )
            };
            periodic::check_name(&s.name).map_err(|why| at("name", why))?;
            if !seen.insert(s.name.as_str()) {
                return Err(at("name", "another schedule has this name".into()));
            }
            let cron = parse_schedule_cron(&s.cron).map_err(|why| at("cron", why))?;
            if periodic::next_slot(&cron, chrono::Utc::now()).is_none() {
                return Err(at("cron", format!("{:?} matches no time to come", s.cron)));
            }
            let Some(consumer) = self.consumer(&s.consumer) else {
                return Err(at(
                    "consumer",
                    format!(
                        "no consumer {:?} (configured: {})",
                        s.consumer,
                        self.consumer_names().join(", ")
                    ),
                ));
            };
            if !s.tenant.is_empty() {
                crate::domain::claim::validate_tenant(s.tenant.as_bytes())
                    .map_err(|e| at("tenant", e.to_string()))?;
                let keyed = consumer
                    .key
                    .parse::<crate::domain::claim::KeyTemplate>()
                    .is_ok_and(|t| t.mentions_tenant());
                if !keyed {
                    return Err(at(
                        "tenant",
                        format!(
                            "consumer {:?} has no {{tenant}} in its key {:?}: its messages carry no tenant",
                            consumer.name, consumer.key
                        ),
                    ));
                }
            }
            let sample = periodic::render_payload(&s.payload, &s.name, chrono::Utc::now());
            if let Err(e) = serde_json::from_str::<serde_json::Value>(&sample) {
                return Err(at(
                    "payload",
                    format!("not JSON once {{{{slot}}}} and {{{{schedule}}}} are filled in: {e}"),
                ));
            }
        }
        Ok(())
    }

    /// The schedule with this name.
    pub fn schedule(&self, name: &str) -> Option<&ScheduleConfig> {
        self.schedules.iter().find(|s| s.name == name)
    }
}
