//! Scheduled sends (docs/flow-control.md): when a message asks to be sent no earlier than a
//! time (`Not-Before` over HTTP, the `not-before` header over AMQP, `Worker::submit_at`), as an
//! RFC 3339 time or a duration from now. Pure: parsing and the bound only.

use super::duration::Dur;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// How far ahead a send may be scheduled: a year and a day.
pub const MAX_AHEAD: Duration = Duration::from_secs(366 * 86_400);

/// Why a `Not-Before` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotBeforeError {
    /// Neither an RFC 3339 time nor a duration.
    #[error(
        "{what} must be an RFC 3339 time (2026-12-01T09:00:00Z) or a duration from now (90s, 15m, 24h, 3d); got {value:?}"
    )]
    Malformed {
        /// The header's name.
        what: &'static str,
        /// The value, as received.
        value: String,
    },
    /// Further ahead than [`MAX_AHEAD`].
    #[error("{what} {value:?} is more than 366 days ahead; the furthest a send may be scheduled")]
    TooFar {
        /// The header's name.
        what: &'static str,
        /// The value, as received.
        value: String,
    },
}

/// The time `value` names (`what`: the header, for the message), measured from `now`:
/// `Ok(None)` when it is not after `now` (the message is sent at once).
pub fn parse_not_before(
    what: &'static str,
    value: &str,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, NotBeforeError> {
    let text = value.trim();
    let at = match DateTime::parse_from_rfc3339(text) {
        Ok(t) => t.with_timezone(&Utc),
        Err(_) => match text.parse::<Dur>() {
            Ok(d) if d.0 <= MAX_AHEAD => now + chrono::Duration::from_std(d.0).unwrap_or_default(),
            Ok(_) => {
                return Err(NotBeforeError::TooFar {
                    what,
                    value: value.into(),
                });
            }
            Err(_) => {
                return Err(NotBeforeError::Malformed {
                    what,
                    value: value.into(),
                });
            }
        },
    };
    if at <= now {
        return Ok(None);
    }
    if (at - now).to_std().unwrap_or_default() > MAX_AHEAD {
        return Err(NotBeforeError::TooFar {
            what,
            value: value.into(),
        });
    }
    Ok(Some(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_times_and_durations() {
        let now: DateTime<Utc> = "2026-12-05T10:00:00Z".parse().unwrap();
        let at = |s: &str| parse_not_before("Not-Before", s, now);
        assert_eq!(
            at("2026-12-06T09:00:00+01:00").unwrap(),
            Some("2026-12-06T08:00:00Z".parse().unwrap())
        );
        assert_eq!(
            at(" 90s ").unwrap(),
            Some(now + chrono::Duration::seconds(90))
        );
        assert_eq!(at("3d").unwrap(), Some(now + chrono::Duration::days(3)));
        assert_eq!(
            at("2026-12-05T09:59:59Z").unwrap(),
            None,
            "the past: at once"
        );
        assert_eq!(at("0s").unwrap(), None);
        for bad in ["tomorrow", "", "2026-12-05 10:00", "-5s", "5"] {
            let e = at(bad).unwrap_err();
            assert!(matches!(e, NotBeforeError::Malformed { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("RFC 3339"), "{e}");
        }
        assert!(matches!(at("400d"), Err(NotBeforeError::TooFar { .. })));
        assert!(matches!(
            at("2028-01-01T00:00:00Z"),
            Err(NotBeforeError::TooFar { .. })
        ));
    }
}
