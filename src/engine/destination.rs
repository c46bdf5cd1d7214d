//! A destination's health and pace: every provider call and status lookup of a consumer passes
//! through its [`Destination`], which holds two circuit breakers (one for calls, one for status
//! lookups) and one rate limit for it.
//!
//! - **Breakers.** Calls and lookups are usually served by different endpoints (a create
//!   endpoint, a search), and a slow or failing status endpoint must not stop new calls to a
//!   healthy create endpoint, nor the reverse: each [`Kind`] has its own breaker. Calls that fail without a decision (connection refused, timeouts, `5xx`,
//!   the configured not-applied statuses other than `429`) are counted; after
//!   [`FAILURES_TO_OPEN`] in a row the destination is *open*: nothing is sent, and claims wait
//!   (handed back to the sweeper with a lease that ends at the next probe), spending no
//!   attempt. At the probe time one call or lookup goes through (*probing*); its answer closes
//!   the breaker, or opens it again for twice as long (up to [`MAX_OPEN`]). After a close the
//!   pace starts low and doubles every second (slow start), so a backlog never stampedes.
//!   The slow start after an outage follows the calls' breaker only.
//! - **Rate.** Shared by calls and lookups (one provider account). `effect.rate_limit` is a ceiling, in requests per second per instance; each
//!   request reserves the next free moment (requests spaced evenly, no burst). A `429`, or a
//!   `Retry-After` on any answer, pauses the whole destination until then and halves the pace
//!   (at most once a second); every second without one adds 5 % back (additive increase), up to
//!   the ceiling, or without one until the limit is lifted.
//!
//! Everything here is in memory, per instance, and costs no database statement.

use crate::provider::effect::{Lookup, Outcome};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Failures in a row (no answer that decides anything) that open the breaker, when they are
/// also [`FAILED_OF_RECENT`] of the last [`RECENT`] answers: a provider that is down fails
/// every call, one that fails some calls at random (a flaky `503`) stays in use.
pub const FAILURES_TO_OPEN: u32 = 5;
/// How many of the last answers the breaker looks at.
pub const RECENT: usize = 10;
/// How many of the last [`RECENT`] answers must have failed to open the breaker.
pub const FAILED_OF_RECENT: usize = 8;
/// An outage shorter than this resumes at the pace it had; a longer one starts slow.
const BLIP: Duration = Duration::from_secs(5);
/// The first open period; each failed probe doubles it.
pub const MIN_OPEN: Duration = Duration::from_secs(1);
/// The longest open period: the longest a recovered provider waits for its first probe.
pub const MAX_OPEN: Duration = Duration::from_secs(15);
/// The pace a destination restarts at after an outage (requests per second).
const SLOW_START: f64 = 10.0;
/// Above this adaptive pace without a ceiling, the limit is lifted altogether.
const UNLIMITED_ABOVE: f64 = 1_000.0;
/// The longest pause a `Retry-After` can ask for.
const MAX_PAUSE: Duration = Duration::from_secs(600);
/// A probe whose answer never came (its task was cancelled) is given up after this.
const PROBE_LOST_AFTER: Duration = Duration::from_secs(60);
/// How long a caller waiting for a probe's answer sleeps before asking again.
const PROBE_POLL: Duration = Duration::from_millis(250);

/// What an answer says about the destination (not about the claim).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// It answered something that decides (applied, rejected, in progress, found, not found).
    Answered,
    /// It asked to slow down (`429`), maybe saying for how long.
    RateLimited {
        /// Its `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// No deciding answer: refused, timed out, `5xx`, `503`. Counts towards opening.
    Failed {
        /// Its `Retry-After`, if it gave one.
        retry_after: Option<Duration>,
    },
    /// Nothing reached it (the request could not be built): says nothing about it.
    Neutral,
}

impl Verdict {
    /// What a call's outcome says about the destination.
    pub fn of_outcome(outcome: &Outcome) -> Verdict {
        match outcome {
            Outcome::Applied { .. } | Outcome::Rejected { .. } | Outcome::InProgress { .. } => {
                Verdict::Answered
            }
            Outcome::NotApplied {
                status: Some(429),
                retry_after,
                ..
            } => Verdict::RateLimited {
                retry_after: *retry_after,
            },
            Outcome::NotApplied {
                status: None,
                error,
                ..
            } if error.starts_with(crate::provider::effect::NOT_BUILT) => Verdict::Neutral,
            Outcome::NotApplied { retry_after, .. } => Verdict::Failed {
                retry_after: *retry_after,
            },
            Outcome::Unknown { status, .. } => match status {
                // A 1xx or 3xx is an odd answer, but an answer: the destination is up.
                Some(s) if *s < 500 => Verdict::Answered,
                _ => Verdict::Failed { retry_after: None },
            },
        }
    }

    /// What a status lookup's answer says about the destination.
    pub fn of_lookup(lookup: &Lookup) -> Verdict {
        match lookup {
            Lookup::Found { .. } | Lookup::NotFound { .. } => Verdict::Answered,
            Lookup::Unknown { .. } => Verdict::Failed { retry_after: None },
        }
    }
}

/// The breaker's state, as shown in `/metrics`, `report` and the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Nothing is sent until the next probe.
    Open,
    /// One probe is out; the others wait for its answer.
    Probing,
}

impl BreakerState {
    /// `closed`, `open` or `probing`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::Probing => "probing",
        }
    }
}

/// Why a request may not go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldBy {
    /// The breaker is open.
    Open,
    /// A probe is out.
    Probing,
    /// The rate limit or a `Retry-After` pause: the next free moment is too late.
    Pace,
}

impl HeldBy {
    /// `open`, `probing` or `pace` (metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            HeldBy::Open => "open",
            HeldBy::Probing => "probing",
            HeldBy::Pace => "pace",
        }
    }

    /// A sentence for the claim's history.
    pub fn describe(self) -> &'static str {
        match self {
            HeldBy::Open => {
                "the provider is failing (circuit breaker open): not sent, waiting for the next probe"
            }
            HeldBy::Probing => {
                "the provider is being probed after failures: not sent, waiting for the probe's answer"
            }
            HeldBy::Pace => "held back by the provider's rate limit (or its Retry-After): not sent",
        }
    }
}

/// A request may not go before `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// When to ask again.
    pub until: Instant,
    /// Why.
    pub by: HeldBy,
}

/// What a request is, for the breaker it passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A call, which may apply the effect.
    Call,
    /// A status lookup, which only reads it.
    Lookup,
}

/// Leave to send one request, at `at`. Hand it back with [`Destination::record`].
#[derive(Debug)]
#[must_use = "record the answer with Destination::record"]
pub struct Pass {
    /// When the request may go (now, or a reserved moment soon).
    pub at: Instant,
    probe: bool,
    kind: Kind,
}

/// A snapshot for `/metrics`, `report` and the page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DestinationStatus {
    /// The breaker.
    pub state: BreakerState,
    /// Requests per second allowed now (`None`: no limit).
    pub rate: Option<f64>,
    /// Seconds until the next probe (when open) or until a pause ends.
    pub resumes_in: Option<Duration>,
    /// Failures in a row.
    pub failures: u32,
}

#[derive(Debug)]
enum Breaker {
    Closed,
    Open { until: Instant },
    Probing { since: Instant },
}

/// One breaker and what it counts.
#[derive(Debug)]
struct Health {
    breaker: Breaker,
    failures: u32,
    /// The last answers, `true` for a failure (at most [`RECENT`]).
    recent_verdicts: VecDeque<bool>,
    /// When the breaker last opened from closed, and the pace it had then.
    opened: Option<(Instant, Option<f64>, Option<f64>)>,
    open_for: Duration,
}

impl Health {
    fn new() -> Self {
        Health {
            breaker: Breaker::Closed,
            failures: 0,
            recent_verdicts: VecDeque::with_capacity(RECENT),
            opened: None,
            open_for: MIN_OPEN,
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// The calls' breaker.
    calls: Health,
    /// The status lookups' breaker.
    lookups: Health,
    /// The adaptive pace (requests per second); `None`: none (only the ceiling applies).
    pace: Option<f64>,
    /// Below it the pace doubles each second (slow start), above it grows by 5 %.
    threshold: Option<f64>,
    /// The next free moment for a request (rate limit: requests spaced `1 / rate` apart).
    next_free: Instant,
    paused_until: Option<Instant>,
    last_decrease: Option<Instant>,
    last_growth: Instant,
    /// Moments of the requests of the last second, kept only while no pace is set: what a
    /// first `429` halves.
    recent: VecDeque<Instant>,
}

/// One destination: a consumer's provider (see the module's documentation).
#[derive(Debug)]
pub struct Destination {
    ceiling: Option<f64>,
    inner: Mutex<Inner>,
}

impl Destination {
    /// A destination with `ceiling` requests per second at most (`None`: adaptive only).
    pub fn new(ceiling: Option<f64>) -> Self {
        let now = Instant::now();
        Destination {
            ceiling: ceiling.filter(|r| *r > 0.0),
            inner: Mutex::new(Inner {
                calls: Health::new(),
                lookups: Health::new(),
                pace: None,
                threshold: None,
                next_free: now,
                paused_until: None,
                last_decrease: None,
                last_growth: now,
                recent: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding it leaves plain numbers behind: still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rate(&self, inner: &Inner) -> Option<f64> {
        match (inner.pace, self.ceiling) {
            (Some(p), Some(c)) => Some(p.min(c)),
            (p, c) => p.or(c),
        }
    }

    /// Asks to send one call no later than `latest`: a [`Pass`] (sleep until its `at`, then
    /// send), or why not and until when. Never waits itself.
    pub fn reserve(&self, latest: Instant) -> Result<Pass, Held> {
        self.reserve_as(Kind::Call, latest)
    }

    /// [`Destination::reserve`] for a request of `kind`, which passes that kind's breaker.
    pub fn reserve_as(&self, kind: Kind, latest: Instant) -> Result<Pass, Held> {
        let now = Instant::now();
        let mut inner = self.lock();
        grow(&mut inner, self.ceiling, now);
        let start = inner.paused_until.filter(|p| *p > now).unwrap_or(now);
        let at = match self.rate(&inner) {
            Some(_) => start.max(inner.next_free),
            None => start,
        };
        let mut probe = false;
        let health = match kind {
            Kind::Call => &mut inner.calls,
            Kind::Lookup => &mut inner.lookups,
        };
        match health.breaker {
            Breaker::Closed => {}
            Breaker::Open { until } if now < until => {
                return Err(Held {
                    until,
                    by: HeldBy::Open,
                });
            }
            Breaker::Probing { since } if now < since + PROBE_LOST_AFTER => {
                return Err(Held {
                    until: now + PROBE_POLL,
                    by: HeldBy::Probing,
                });
            }
            // Time for a probe (or the last one was lost): this request is it, if it can go
            // in time.
            Breaker::Open { .. } | Breaker::Probing { .. } if at <= latest => {
                health.breaker = Breaker::Probing { since: now };
                probe = true;
            }
            Breaker::Open { .. } | Breaker::Probing { .. } => {}
        }
        if at > latest {
            return Err(Held {
                until: at,
                by: HeldBy::Pace,
            });
        }
        if let Some(rate) = self.rate(&inner) {
            inner.next_free = at + Duration::from_secs_f64(1.0 / rate.max(0.01));
        } else {
            inner.recent.push_back(at);
            while inner
                .recent
                .front()
                .is_some_and(|t| *t + Duration::from_secs(1) < now)
                || inner.recent.len() > 100_000
            {
                inner.recent.pop_front();
            }
        }
        Ok(Pass { at, probe, kind })
    }

    /// [`Destination::reserve`], waiting in place while the wait ends by `latest` (a pace
    /// slot, a pause, a probe's answer); `Err` when it would end later.
    pub async fn admit(&self, latest: Instant) -> Result<Pass, Held> {
        self.admit_as(Kind::Call, latest).await
    }

    /// [`Destination::admit`] for a request of `kind`.
    pub async fn admit_as(&self, kind: Kind, latest: Instant) -> Result<Pass, Held> {
        loop {
            match self.reserve_as(kind, latest) {
                Ok(pass) => {
                    // Only a reserved moment in the future is slept to: a timer set for "now"
                    // still waits for the timer driver's next tick (up to a millisecond, and a
                    // wake-up), on every call of a destination that holds nothing back.
                    if pass.at > Instant::now() {
                        tokio::time::sleep_until(pass.at).await;
                    }
                    return Ok(pass);
                }
                Err(held) if held.by == HeldBy::Probing && held.until <= latest => {
                    tokio::time::sleep_until(held.until).await;
                }
                Err(held) => return Err(held),
            }
        }
    }

    /// Records what the request a [`Pass`] let through came to.
    pub fn record(&self, pass: Pass, verdict: Verdict) {
        let now = Instant::now();
        let mut inner = self.lock();
        let pause = |inner: &mut Inner, d: Option<Duration>| {
            if let Some(d) = d {
                let until = now + d.min(MAX_PAUSE);
                if inner.paused_until.is_none_or(|p| p < until) {
                    inner.paused_until = Some(until);
                }
            }
        };
        let inner = &mut *inner;
        let health = match pass.kind {
            Kind::Call => &mut inner.calls,
            Kind::Lookup => &mut inner.lookups,
        };
        if !matches!(verdict, Verdict::Neutral) {
            if health.recent_verdicts.len() == RECENT {
                health.recent_verdicts.pop_front();
            }
            health
                .recent_verdicts
                .push_back(matches!(verdict, Verdict::Failed { .. }));
        }
        match verdict {
            Verdict::Neutral => {
                if pass.probe {
                    // Nothing was learnt: let the next request probe.
                    health.breaker = Breaker::Open { until: now };
                }
            }
            Verdict::Answered => {
                health.failures = 0;
                if pass.probe || !matches!(health.breaker, Breaker::Closed) {
                    health.breaker = Breaker::Closed;
                    health.open_for = MIN_OPEN;
                    let opened = health.opened.take();
                    if pass.kind == Kind::Lookup {
                        // Lookups recovering say nothing of the pace calls may take.
                        return;
                    }
                    match opened {
                        // A blip: go on at the pace it had.
                        Some((at, pace, threshold)) if now < at + BLIP => {
                            inner.pace = pace;
                            inner.threshold = threshold;
                        }
                        // After an outage, slow start: the backlog drains from a low pace up.
                        _ => {
                            let start = self.ceiling.map_or(SLOW_START, |c| c.min(SLOW_START));
                            inner.pace = Some(start);
                            inner.threshold = None;
                        }
                    }
                    inner.last_growth = now;
                    inner.next_free = inner.next_free.max(now);
                }
            }
            Verdict::RateLimited { retry_after } => {
                health.failures = 0;
                if pass.probe {
                    health.breaker = Breaker::Closed;
                    health.open_for = MIN_OPEN;
                }
                pause(
                    &mut *inner,
                    Some(retry_after.unwrap_or(Duration::from_secs(1))),
                );
                if inner
                    .last_decrease
                    .is_none_or(|t| now >= t + Duration::from_secs(1))
                {
                    let current = self.rate(inner).unwrap_or_else(|| {
                        // No pace yet: what was sent over the last second.
                        let cutoff = now.checked_sub(Duration::from_secs(1)).unwrap_or(now);
                        inner.recent.iter().filter(|t| **t >= cutoff).count() as f64
                    });
                    let halved = (current / 2.0).max(0.5);
                    inner.pace = Some(halved);
                    inner.threshold = Some(halved);
                    inner.last_decrease = Some(now);
                    inner.last_growth = now;
                    inner.recent.clear();
                }
            }
            Verdict::Failed { retry_after } => {
                health.failures = health.failures.saturating_add(1);
                if pass.probe {
                    health.open_for = (health.open_for * 2).min(MAX_OPEN);
                    let until = now + health.open_for.max(retry_after.unwrap_or_default());
                    health.breaker = Breaker::Open { until };
                } else if matches!(health.breaker, Breaker::Closed)
                    && health.failures >= FAILURES_TO_OPEN
                    && health.recent_verdicts.iter().filter(|f| **f).count() >= FAILED_OF_RECENT
                {
                    let until = now + health.open_for.max(retry_after.unwrap_or_default());
                    health.breaker = Breaker::Open { until };
                    health.opened = Some((now, inner.pace, inner.threshold));
                }
                pause(&mut *inner, retry_after);
            }
        }
    }

    /// When the calls' breaker is open and not yet due a probe: until when. The sweeper takes
    /// no claim for a destination before then.
    pub fn open_until(&self) -> Option<Instant> {
        match self.lock().calls.breaker {
            Breaker::Open { until } if Instant::now() < until => Some(until),
            _ => None,
        }
    }

    /// A snapshot for metrics, report and the page: the calls' breaker, and the pace.
    pub fn status(&self) -> DestinationStatus {
        let now = Instant::now();
        let mut inner = self.lock();
        grow(&mut inner, self.ceiling, now);
        let (state, open_until) = match inner.calls.breaker {
            Breaker::Closed => (BreakerState::Closed, None),
            Breaker::Open { until } => (BreakerState::Open, Some(until)),
            Breaker::Probing { .. } => (BreakerState::Probing, None),
        };
        let resumes = open_until
            .into_iter()
            .chain(inner.paused_until)
            .filter(|t| *t > now)
            .max();
        DestinationStatus {
            state,
            rate: self.rate(&inner),
            resumes_in: resumes.map(|t| t - now),
            failures: inner.calls.failures,
        }
    }

    /// The status lookups' breaker.
    pub fn lookup_state(&self) -> BreakerState {
        match self.lock().lookups.breaker {
            Breaker::Closed => BreakerState::Closed,
            Breaker::Open { .. } => BreakerState::Open,
            Breaker::Probing { .. } => BreakerState::Probing,
        }
    }
}

/// The pace grows with each second without a `429` or an outage: doubling below the threshold
/// (slow start), 5 % above it; lifted altogether past the ceiling (or a very high pace).
fn grow(inner: &mut Inner, ceiling: Option<f64>, now: Instant) {
    if !matches!(inner.calls.breaker, Breaker::Closed) {
        return;
    }
    let Some(mut pace) = inner.pace else {
        return;
    };
    while now >= inner.last_growth + Duration::from_secs(1) {
        inner.last_growth += Duration::from_secs(1);
        pace = match inner.threshold {
            Some(t) if pace >= t => pace + (pace * 0.05).max(1.0),
            Some(t) => (pace * 2.0).min(t),
            None => pace * 2.0,
        };
        if ceiling.is_some_and(|c| pace >= c) || pace > UNLIMITED_ABOVE {
            inner.pace = None;
            inner.threshold = None;
            return;
        }
    }
    inner.pace = Some(pace);
}

#[cfg(test)]
#[path = "destination/tests.rs"]
mod tests;
