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
        let bucket = buckets.entry(key).or_insert((rate, Instant::now()));
        let taken = take_token(bucket, rate);
        if !taken {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// `POST`s refused so far.
    pub(super) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Takes a token of `bucket` (tokens, when last filled), refilled at `rate` a second and
/// holding one second's worth; `false` when it is empty.
pub(super) fn take_token(bucket: &mut (f64, Instant), rate: f64) -> bool {
    let now = Instant::now();
    bucket.0 = (bucket.0 + (now - bucket.1).as_secs_f64() * rate).min(rate);
    bucket.1 = now;
    if bucket.0 >= 1.0 {
        bucket.0 -= 1.0;
        true
    } else {
        false
    }
}
