//! A claim's priority (docs/flow-control.md, "Priorities"): an integer from [`MIN`] to
//! [`MAX`], [`DEFAULT`] when the message names none. A consumer's pickup takes its waiting
//! claims higher priority first, then oldest first, except for an aged share of every take
//! ([`aged_share`]): of every [`AGED_EVERY`] claims a pickup takes, one is the oldest waiting
//! claim whatever its priority, so a low claim is never starved.

/// The lowest priority.
pub const MIN: i16 = -100;
/// The highest priority.
pub const MAX: i16 = 100;
/// The priority of a message that names none.
pub const DEFAULT: i16 = 0;
/// The header that gives a message's priority on HTTP, CloudEvents and NATS. Not `Priority`:
/// that one is HTTP's own (RFC 9218), which browsers and proxies send.
pub const HEADER: &str = "Message-Priority";
/// One claim in this many taken by a pickup is the oldest waiting, whatever its priority.
pub const AGED_EVERY: u64 = 8;

/// A priority that is not an integer from [`MIN`] to [`MAX`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("priority {0:?} is not an integer from -100 to 100")]
pub struct PriorityError(pub String);

/// Checks a priority given as a number (the enqueue argument; AMQP's `priority` property).
pub fn check(value: i64) -> Result<i16, PriorityError> {
    i16::try_from(value)
        .ok()
        .filter(|p| (MIN..=MAX).contains(p))
        .ok_or_else(|| PriorityError(value.to_string()))
}

/// Parses a priority given as text (the `Message-Priority` header of HTTP and NATS): an optional sign
/// and decimal digits, no spaces around them beyond what a header's value trims.
pub fn parse(text: &[u8]) -> Result<i16, PriorityError> {
    let shown = || PriorityError(String::from_utf8_lossy(text).chars().take(32).collect());
    let text = std::str::from_utf8(text).map_err(|_| shown())?.trim();
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(shown());
    }
    let value: i64 = text.parse().map_err(|_| shown())?;
    check(value).map_err(|_| shown())
}

/// How many of a take of `batch` claims are the oldest waiting, whatever their priority, when
/// the pickup already took `taken_before`: one for each multiple of [`AGED_EVERY`] the take
/// passes, so the share is exact over any run of takes, one claim at a time or many.
pub fn aged_share(taken_before: u64, batch: u32) -> u32 {
    let after = taken_before.saturating_add(u64::from(batch));
    let share = after / AGED_EVERY - taken_before / AGED_EVERY;
    u32::try_from(share).unwrap_or(batch).min(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_from_minus_100_to_100_are_taken() {
        assert_eq!(check(0), Ok(0));
        assert_eq!(check(-100), Ok(-100));
        assert_eq!(check(100), Ok(100));
        assert_eq!(parse(b"7"), Ok(7));
        assert_eq!(parse(b" -3 "), Ok(-3));
        assert_eq!(parse(b"+100"), Ok(100));
    }

    #[test]
    fn anything_else_is_refused_with_the_range() {
        for bad in [101, -101, 40_000, i64::MAX] {
            assert!(check(bad).is_err(), "{bad}");
        }
        for bad in [
            &b""[..],
            b"high",
            b"1.5",
            b"101",
            b"0x10",
            b"- 1",
            b"0100",
            b"\xff",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.to_string().contains("from -100 to 100"), "{err}");
        }
    }

    #[test]
    fn the_aged_share_is_one_in_eight_over_any_run_of_takes() {
        // One at a time: every eighth take.
        let shares: Vec<u32> = (0..16).map(|n| aged_share(n, 1)).collect();
        assert_eq!(shares.iter().sum::<u32>(), 2);
        assert_eq!(shares[7], 1);
        assert_eq!(shares[15], 1);
        // Batches of any size add up the same.
        let (mut total, mut aged) = (0u64, 0u32);
        for batch in [64, 3, 1, 1, 17, 40, 2] {
            aged += aged_share(total, batch);
            total += u64::from(batch);
        }
        assert_eq!(u64::from(aged), total / AGED_EVERY);
        assert_eq!(aged_share(0, 64), 8);
        assert_eq!(aged_share(5, 0), 0);
    }
}
