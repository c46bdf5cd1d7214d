//! What every route checks in the text and times it hands to the store, before the store is
//! asked: both stores then refuse the same input the same way (`400` naming the parameter),
//! instead of SQLite answering it and PostgreSQL failing with an error that reads like an
//! outage.
//!
//! - Text (ids, tenants, consumers, search text, cursors, notes) must not hold a NUL: a
//!   PostgreSQL `TEXT` cannot (every other character of a Rust string it can), and no claim
//!   can have one (intake takes visible ASCII only).
//! - Times are kept within years 1–9999 UTC ([`earliest`], [`latest`]): what RFC 3339 writes,
//!   inside what PostgreSQL (4713 BC–294276 AD) and SQLite (64-bit milliseconds) hold.
//! - A window back from now (`since=7d`) is at most [`MAX_WINDOW_DAYS`] days.
//!
//! Pure; `edge::http::problem::bad_parameter` is the HTTP answer, the CLI prints the error and exits 2.

use crate::domain::duration::Dur;
use crate::ops::report::Window;
use chrono::{DateTime, NaiveDate, Utc};

/// The longest window back from now a filter or a report takes: 100 years.
pub const MAX_WINDOW_DAYS: u64 = 36_500;

/// A parameter the store cannot be asked with, naming it and the bound it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// Text holding a NUL character.
    #[error("{field} contains a NUL byte (at byte {position}); no claim can have one")]
    Nul {
        /// The parameter (`tenant`, `q`, `message_id`, a header's name, ...).
        field: String,
        /// Byte position of the first NUL.
        position: usize,
    },
    /// A duration back from now longer than [`MAX_WINDOW_DAYS`].
    #[error(
        "{field} {value:?} reaches further back than {MAX_WINDOW_DAYS}d (100 years), the longest window claimd reads"
    )]
    WindowTooLong {
        /// `since`, `until`, `--since`, ...
        field: String,
        /// As given.
        value: String,
    },
    /// A time (or a cursor's time) outside years 1–9999.
    #[error(
        "{field} {value:?} is outside the times claimd stores: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z"
    )]
    TimeOutOfRange {
        /// `since`, `until`, `cursor`, ...
        field: String,
        /// As given.
        value: String,
    },
}

/// The first time claimd stores: 0001-01-01T00:00:00Z.
pub fn earliest() -> DateTime<Utc> {
    NaiveDate::from_ymd_opt(1, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc())
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The last time claimd stores: 9999-12-31T23:59:59.999999Z.
pub fn latest() -> DateTime<Utc> {
    NaiveDate::from_ymd_opt(9999, 12, 31)
        .and_then(|d| d.and_hms_micro_opt(23, 59, 59, 999_999))
        .map(|t| t.and_utc())
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Refuses `value` when it holds a NUL.
pub fn text(field: &str, value: &str) -> Result<(), ParamError> {
    match value.bytes().position(|b| b == 0) {
        None => Ok(()),
        Some(position) => Err(ParamError::Nul {
            field: field.to_string(),
            position,
        }),
    }
}

/// [`text`] on each `(field, value)`, the first refusal first.
pub fn texts<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<(), ParamError> {
    fields.into_iter().try_for_each(|(f, v)| text(f, v))
}

/// Refuses a window back from now longer than [`MAX_WINDOW_DAYS`].
pub fn window(field: &str, d: Dur) -> Result<Dur, ParamError> {
    if d.0.as_secs() > MAX_WINDOW_DAYS * 86_400 {
        return Err(ParamError::WindowTooLong {
            field: field.to_string(),
            value: d.to_string(),
        });
    }
    Ok(d)
}

/// [`window`] for a report's window (`all` is always fine).
pub fn report_window(field: &str, w: Window) -> Result<Window, ParamError> {
    match w {
        Window::All => Ok(w),
        Window::Last(d) => window(field, d).map(Window::Last),
    }
}

/// Refuses a time outside [`earliest`]..=[`latest`]; `given` is the text it was read from.
pub fn time(field: &str, given: &str, t: DateTime<Utc>) -> Result<DateTime<Utc>, ParamError> {
    if t < earliest() || t > latest() {
        return Err(ParamError::TimeOutOfRange {
            field: field.to_string(),
            value: given.to_string(),
        });
    }
    Ok(t)
}

/// `--since` of `claimd report`: a window like `24h`, or `all`, at most [`MAX_WINDOW_DAYS`].
pub fn window_arg(s: &str) -> Result<Window, String> {
    let w = s.parse::<Window>().map_err(|e| e.to_string())?;
    report_window("--since", w).map_err(|e| e.to_string())
}

/// `--since` of `claimd reconcile`: a duration, at most [`MAX_WINDOW_DAYS`].
pub fn dur_arg(s: &str) -> Result<Dur, String> {
    let d = s.parse::<Dur>().map_err(|e| e.to_string())?;
    window("--since", d).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_is_refused_by_name_and_position() {
        assert_eq!(text("tenant", "acme"), Ok(()));
        assert_eq!(text("tenant", ""), Ok(()));
        let e = text("tenant", "ac\0me").unwrap_err();
        assert_eq!(
            e.to_string(),
            "tenant contains a NUL byte (at byte 2); no claim can have one"
        );
        let e = texts([("consumer", "payments"), ("message_id", "\0"), ("q", "\0")]).unwrap_err();
        assert!(e.to_string().starts_with("message_id contains a NUL byte"));
        // Other control characters and any Unicode are text PostgreSQL holds.
        assert_eq!(texts([("q", "a\u{1}\u{7f}é\u{10FFFF}")]), Ok(()));
    }

    #[test]
    fn windows_stop_at_a_hundred_years() {
        let d = |s: &str| s.parse::<Dur>().unwrap();
        assert!(window("since", d("36500d")).is_ok());
        assert!(window("since", d("876000h")).is_ok());
        let e = window("since", d("36501d")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "since \"36501d\" reaches further back than 36500d (100 years), the longest window claimd reads"
        );
        assert!(window("since", d("99999999d")).is_err());
        assert_eq!(report_window("since", Window::All), Ok(Window::All));
        assert!(window_arg("99999999d").unwrap_err().contains("--since"));
        assert!(window_arg("all").is_ok() && window_arg("7d").is_ok());
        assert!(dur_arg("40000d").is_err() && dur_arg("24h").is_ok());
        assert!(dur_arg("soon").unwrap_err().contains("invalid duration"));
    }

    #[test]
    fn times_stay_within_years_1_to_9999() {
        let t = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        assert!(time("until", "x", earliest()).is_ok());
        assert!(time("until", "x", latest()).is_ok());
        assert!(time("until", "x", t("2026-05-01T00:00:00Z")).is_ok());
        assert_eq!(earliest().to_rfc3339(), "0001-01-01T00:00:00+00:00");
        let before = earliest() - chrono::Duration::microseconds(1);
        let e = time("cursor", "-62135596800000001.1", before).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cursor \"-62135596800000001.1\" is outside")
        );
        let after = latest() + chrono::Duration::microseconds(1);
        assert!(time("cursor", "x", after).is_err());
        assert!(time("cursor", "x", DateTime::<Utc>::MIN_UTC).is_err());
    }
}
