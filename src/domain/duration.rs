//! Human durations as operators write them: `250ms`, `90s`, `15m`, `24h`, `14d`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A duration written with one unit suffix (`ms`, `s`, `m`, `h`, `d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dur(pub Duration);

/// A duration string that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: expected a whole number and a unit, like 250ms, 90s, 15m, 24h or 14d"
)]
pub struct DurationError {
    /// What was written.
    pub input: String,
}

impl FromStr for Dur {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || DurationError {
            input: s.to_string(),
        };
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| err())?;
        let millis_per = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(err()),
        };
        n.checked_mul(millis_per)
            .map(|ms| Dur(Duration::from_millis(ms)))
            .ok_or_else(err)
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        for (unit, per) in [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1_000),
        ] {
            if ms >= per && ms.is_multiple_of(per) {
                return write!(f, "{}{unit}", ms / per);
            }
        }
        write!(f, "{ms}ms")
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Dur {
    /// `now` minus this duration, or `None` when that is before any representable time (an
    /// absurd window like `99999999d` then means "everything").
    pub fn before(
        self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        chrono::Duration::from_std(self.0)
            .ok()
            .and_then(|d| now.checked_sub_signed(d))
    }
}

impl From<Dur> for Duration {
    fn from(d: Dur) -> Duration {
        d.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_unit() {
        assert_eq!(
            "250ms".parse::<Dur>().unwrap().0,
            Duration::from_millis(250)
        );
        assert_eq!("90s".parse::<Dur>().unwrap().0, Duration::from_secs(90));
        assert_eq!("15m".parse::<Dur>().unwrap().0, Duration::from_secs(900));
        assert_eq!("24h".parse::<Dur>().unwrap().0, Duration::from_secs(86_400));
        assert_eq!(
            "14d".parse::<Dur>().unwrap().0,
            Duration::from_secs(14 * 86_400)
        );
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for bad in [
            "",
            "10",
            "s",
            "1.5s",
            "-3s",
            "10 years",
            "10S",
            "99999999999999999999d",
        ] {
            assert!(bad.parse::<Dur>().is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn windows_never_overflow() {
        let now = chrono::Utc::now();
        assert!("99999999d".parse::<Dur>().unwrap().before(now).is_none());
        assert_eq!(
            "1h".parse::<Dur>().unwrap().before(now),
            Some(now - chrono::Duration::hours(1))
        );
    }

    #[test]
    fn displays_in_the_largest_whole_unit() {
        assert_eq!("120s".parse::<Dur>().unwrap().to_string(), "2m");
        assert_eq!("1500ms".parse::<Dur>().unwrap().to_string(), "1500ms");
        assert_eq!("48h".parse::<Dur>().unwrap().to_string(), "2d");
    }
}
