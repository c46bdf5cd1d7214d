//! The sandbox's limit per account (`SandboxModes::per_key_limit`): a token bucket per value of
//! the body's account field, holding one second's worth, and the count of `POST`s it refused.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The buckets of every account seen, and how many `POST`s they refused.
#[derive(Debug, Default)]
pub(super) struct KeyBuckets {
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
    refused: AtomicU64,
}

impl KeyBuckets {
    /// Takes a token of `account`'s bucket (refilled at its rate a second); `false` (and
    /// counted) when it is empty. Always `true` for a request that names no account.
    pub(super) fn take(&self, account: Option<(String, u32)>) -> bool {
        let Some((key, rate)) = account.filter(|(_, r)| *r > 0) else {
            return true;
        };
        let rate = f64::from(rate);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let b = buckets.entry(key).or_insert((rate, now));
        b.0 = (b.0 + (now - b.1).as_secs_f64() * rate).min(rate);
        b.1 = now;
        if b.0 >= 1.0 {
            b.0 -= 1.0;
            true
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// `POST`s refused so far.
    pub(super) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}
