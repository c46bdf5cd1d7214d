//! Paces per key (`effect.rate_limit_key`, docs/flow-control.md): providers limit per API key
//! or connected account, so with a key template each key gets the consumer's `rate_limit` as
//! its own ceiling, its own pause after a `429` (its `Retry-After`) and its own
//! additive-increase, multiplicative-decrease pace, while the consumer's breakers stay shared
//! ([`crate::engine::destination`]). At most `capacity` keys are kept (least recently used
//! evicted: a key seen again starts at the ceiling, the configured limit, which is safe). In
//! memory, per instance: no database statement.

use hashlink::LruCache;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Default `effect.rate_limit_keys`: keys kept at most.
pub const DEFAULT_KEYS: usize = 100_000;
/// Keys with the most `429`s and waits shown in `/metrics`.
pub const TOP_KEYS: usize = 10;

/// One key's pace.
#[derive(Debug, Clone)]
struct KeyPace {
    /// Requests per second allowed now (at most the ceiling).
    pace: f64,
    next_free: Instant,
    paused_until: Option<Instant>,
    last_decrease: Option<Instant>,
    last_growth: Instant,
    /// `429`s answered for this key.
    throttled: u64,
    /// Requests this key's pace held back (waited in place or handed back).
    waits: u64,
}

/// What a key's pace says of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyTurn {
    /// It may go at this moment (now, or a reserved moment soon).
    At(Instant),
    /// Not before this moment, which is after the latest the caller can wait for.
    Held(Instant),
}

/// A key's counts, for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyCounts {
    /// The key.
    pub key: String,
    /// `429`s answered.
    pub throttled: u64,
    /// Requests held back by its pace.
    pub waits: u64,
}

/// The paces of one consumer's keys.
#[derive(Debug)]
pub struct KeyPaces {
    ceiling: f64,
    keys: Mutex<LruCache<String, KeyPace>>,
}

impl KeyPaces {
    /// Paces of at most `ceiling` requests a second per key, for at most `capacity` keys.
    pub fn new(ceiling: f64, capacity: usize) -> Self {
        KeyPaces {
            ceiling: ceiling.max(0.01),
            keys: Mutex::new(LruCache::new(capacity.max(1))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, KeyPace>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves `key`'s next moment for one request that must go by `latest`.
    pub fn reserve(&self, key: &str, latest: Instant) -> KeyTurn {
        let now = Instant::now();
        let mut keys = self.lock();
        if keys.get(key).is_none() {
            keys.insert(key.to_string(), self.fresh(now));
        }
        let p = keys.get_mut(key).expect("just inserted");
        grow(p, self.ceiling, now);
        let start = p.paused_until.filter(|t| *t > now).unwrap_or(now);
        let at = start.max(p.next_free);
        if at > now {
            p.waits += 1;
        }
        if at > latest {
            return KeyTurn::Held(at);
        }
        p.next_free = at + Duration::from_secs_f64(1.0 / p.pace.max(0.01));
        KeyTurn::At(at)
    }

    /// Waits in place for `key`'s turn while it comes by `latest`; else says when it comes.
    pub async fn admit(&self, key: &str, latest: Instant) -> Result<(), Instant> {
        match self.reserve(key, latest) {
            KeyTurn::At(at) => {
                if at > Instant::now() {
                    tokio::time::sleep_until(at).await;
                }
                Ok(())
            }
            KeyTurn::Held(until) => Err(until),
        }
    }

    /// A `429` for `key`: pause it for `retry_after` (1 s when none), halve its pace (at most
    /// once a second).
    pub fn throttled(&self, key: &str, retry_after: Option<Duration>) {
        let now = Instant::now();
        let mut keys = self.lock();
        let Some(p) = keys.get_mut(key) else {
            return;
        };
        p.throttled += 1;
        let until = now + retry_after.unwrap_or(Duration::from_secs(1)).min(MAX_PAUSE);
        if p.paused_until.is_none_or(|t| t < until) {
            p.paused_until = Some(until);
        }
        if p.last_decrease
            .is_none_or(|t| now >= t + Duration::from_secs(1))
        {
            p.pace = (p.pace / 2.0).max(0.5_f64.min(self.ceiling));
            p.last_decrease = Some(now);
            p.last_growth = now;
        }
    }

    /// Keys kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no key is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `n` keys with the most `429`s, then the most waits (those with neither left out).
    pub fn top(&self, n: usize) -> Vec<KeyCounts> {
        let keys = self.lock();
        let mut all: Vec<KeyCounts> = keys
            .iter()
            .filter(|(_, p)| p.throttled > 0 || p.waits > 0)
            .map(|(k, p)| KeyCounts {
                key: k.clone(),
                throttled: p.throttled,
                waits: p.waits,
            })
            .collect();
        all.sort_by(|a, b| (b.throttled, b.waits, &a.key).cmp(&(a.throttled, a.waits, &b.key)));
        all.truncate(n);
        all
    }

    fn fresh(&self, now: Instant) -> KeyPace {
        KeyPace {
            pace: self.ceiling,
            next_free: now,
            paused_until: None,
            last_decrease: None,
            last_growth: now,
            throttled: 0,
            waits: 0,
        }
    }
}

/// The longest pause one `Retry-After` imposes on a key.
const MAX_PAUSE: Duration = Duration::from_secs(300);

/// Each second without a `429` the pace grows by 5 % (at least 1 a second), up to the ceiling.
fn grow(p: &mut KeyPace, ceiling: f64, now: Instant) {
    while p.pace < ceiling && now >= p.last_growth + Duration::from_secs(1) {
        p.last_growth += Duration::from_secs(1);
        p.pace = (p.pace + (p.pace * 0.05).max(1.0)).min(ceiling);
    }
    if p.pace >= ceiling {
        p.last_growth = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_key_keeps_its_own_pace() {
        let paces = KeyPaces::new(5.0, 100);
        let far = Instant::now() + Duration::from_secs(60);
        let mut a = Vec::new();
        for _ in 0..5 {
            match paces.reserve("acct_a", far) {
                KeyTurn::At(at) => a.push(at),
                KeyTurn::Held(_) => panic!("within a minute"),
            }
        }
        // Five a second for acct_a: 200 ms apart.
        for w in a.windows(2) {
            assert_eq!(w[1] - w[0], Duration::from_millis(200));
        }
        // acct_b is not held back by acct_a.
        assert_eq!(paces.reserve("acct_b", far), KeyTurn::At(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_pauses_and_slows_only_its_key() {
        let paces = KeyPaces::new(10.0, 100);
        let far = Instant::now() + Duration::from_secs(60);
        let _ = paces.reserve("a", far);
        let _ = paces.reserve("b", far);
        paces.throttled("a", Some(Duration::from_secs(3)));
        let now = Instant::now();
        match paces.reserve("a", now + Duration::from_secs(1)) {
            KeyTurn::Held(until) => assert!(until >= now + Duration::from_secs(3)),
            KeyTurn::At(at) => panic!("a went at {at:?} during its Retry-After"),
        }
        // b goes on at its own pace: its next slot is 100 ms after its first.
        assert!(
            matches!(paces.reserve("b", far), KeyTurn::At(at) if at <= now + Duration::from_millis(100))
        );
        assert_eq!(paces.top(10)[0].key, "a");
        assert_eq!(paces.top(10)[0].throttled, 1);
    }

    #[test]
    fn keeps_at_most_capacity_keys_dropping_the_least_recent() {
        let paces = KeyPaces::new(5.0, 100_000);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let far = Instant::now() + Duration::from_secs(60);
            for i in 0..100_001 {
                let _ = paces.reserve(&format!("k{i}"), far);
            }
            assert_eq!(paces.len(), 100_000);
            let keys = paces.lock();
            assert!(!keys.contains_key("k0"), "the least recent is gone");
            assert!(keys.contains_key("k1") && keys.contains_key("k100000"));
        });
    }
}
