//! What a running worker knows of its own sweeper: when it started, whether a pass is running
//! (for `/readyz`, the report and the metrics).

use std::time::Duration;

/// What a running worker knows of its own sweeper.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LocalSweeper {
    /// Time since this worker started.
    pub uptime: Duration,
    /// How long the pass running on this worker has been running, if one is.
    pub running_for: Option<Duration>,
}

/// A worker's record of its sweeper passes: when it started, whether a pass is running.
#[derive(Debug)]
pub struct SweeperActivity {
    started: std::time::Instant,
    running: std::sync::Mutex<(usize, Option<std::time::Instant>)>,
}

impl Default for SweeperActivity {
    fn default() -> Self {
        SweeperActivity {
            started: std::time::Instant::now(),
            running: std::sync::Mutex::new((0, None)),
        }
    }
}

/// Held while a pass runs (see [`SweeperActivity::begin`]).
#[derive(Debug)]
pub struct PassGuard<'a>(&'a SweeperActivity);

impl Drop for PassGuard<'_> {
    fn drop(&mut self) {
        let mut r = self.0.running.lock().unwrap_or_else(|p| p.into_inner());
        r.0 = r.0.saturating_sub(1);
        if r.0 == 0 {
            r.1 = None;
        }
    }
}

impl SweeperActivity {
    /// Marks a pass as running until the guard drops.
    pub fn begin(&self) -> PassGuard<'_> {
        let mut r = self.running.lock().unwrap_or_else(|p| p.into_inner());
        r.0 += 1;
        r.1.get_or_insert_with(std::time::Instant::now);
        PassGuard(self)
    }

    /// The worker's view now.
    pub fn local(&self) -> LocalSweeper {
        let r = self.running.lock().unwrap_or_else(|p| p.into_inner());
        LocalSweeper {
            uptime: self.started.elapsed(),
            running_for: r.1.map(|t| t.elapsed()),
        }
    }
}
