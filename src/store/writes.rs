//! Whether this instance's store writes succeed, for readiness: a store that answers reads but
//! refuses writes (SQLite on a full disk, a PostgreSQL switched to read-only) can take no
//! claim, so the instance should not be sent traffic. Claims, the sweeper's heartbeat and
//! readiness' own write probe report here; a run of [`FAILURE_RUN`] failures with no success
//! makes `/readyz` answer `503` naming the last error, and the first write that succeeds
//! (whichever it is) makes it ready again. The provider has no say: a provider that is down is
//! the claims' business, not the instance's.

use super::StoreError;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Failed writes in a row, with no success between them, that make the instance unready.
pub const FAILURE_RUN: u32 = 5;

/// While writes are failing, readiness probes a write itself at most this often (recovery
/// then does not wait for traffic, which the load balancer no longer sends).
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Run {
    failures: u32,
    since: Option<Instant>,
    last_error: String,
    last_probe: Option<Instant>,
}

/// Recent store write outcomes (see the module).
#[derive(Debug, Default)]
pub struct WriteHealth(Mutex<Run>);

impl WriteHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, Run> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A write committed: the run of failures, if any, is over.
    pub fn succeeded(&self) {
        let mut r = self.lock();
        if r.failures > 0 {
            r.failures = 0;
            r.since = None;
        }
    }

    /// A write failed with `e`.
    pub fn failed(&self, e: &StoreError) {
        let mut r = self.lock();
        r.failures = r.failures.saturating_add(1);
        r.since.get_or_insert_with(Instant::now);
        r.last_error = e.to_string();
    }

    /// Why the instance should not take work, when the last [`FAILURE_RUN`] writes failed.
    pub fn failing(&self) -> Option<String> {
        let r = self.lock();
        (r.failures >= FAILURE_RUN).then(|| {
            format!(
                "the last {} store writes failed (for {:.0}s): {}",
                r.failures,
                r.since.map_or(0.0, |t| t.elapsed().as_secs_f64()),
                r.last_error
            )
        })
    }

    /// Whether readiness should probe a write now (writes are failing, and it has not probed
    /// within [`PROBE_EVERY`]); counts the probe as made.
    pub fn probe_due(&self) -> bool {
        let mut r = self.lock();
        if r.failures < FAILURE_RUN || r.last_probe.is_some_and(|t| t.elapsed() < PROBE_EVERY) {
            return false;
        }
        r.last_probe = Some(Instant::now());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_failures_makes_it_failing_and_one_success_ends_it() {
        let w = WriteHealth::default();
        let e = StoreError::Corrupt("database or disk is full".into());
        for _ in 0..FAILURE_RUN - 1 {
            w.failed(&e);
        }
        assert!(w.failing().is_none());
        assert!(!w.probe_due());
        w.failed(&e);
        let why = w.failing().expect("failing");
        assert!(why.contains("disk is full"), "{why}");
        assert!(w.probe_due());
        assert!(!w.probe_due(), "at most one probe per period");
        w.succeeded();
        assert!(w.failing().is_none());
    }
}
