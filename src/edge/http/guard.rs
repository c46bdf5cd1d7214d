//! What the HTTP edge refuses before a route runs, and what it remembers to do so:
//!
//! - **Local names for open routes** ([`host_allowed`], [`origin_allowed`]): a route whose token
//!   is empty answers only requests whose `Host` is a loopback name (`localhost`, `*.localhost`,
//!   `127.0.0.0/8`, `[::1]`) or one of `[http] allowed_hosts`, and refuses a change (any method
//!   but `GET`/`HEAD`) whose `Origin` is not one of those. A web page can reach a loopback port
//!   through a browser, by DNS rebinding (its own name resolved to 127.0.0.1: the browser sends
//!   that name as `Host`) or with a cross-site form (the browser sends the page's `Origin`);
//!   neither can send a local name in both.
//! - **Sign-in guesses per client** ([`Throttle`]): a few tries at once, then one every few
//!   seconds per client address; over that, `429` without looking at the token.
//! - **Refusal log lines** ([`LogEvery`]): one line per kind of refusal every few seconds, with
//!   the client's address and how many were not logged, so guessing cannot fill the disk.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// A `Host` (or an `Origin`'s host) without its port, lower-cased, a trailing dot and IPv6
/// brackets removed; `None` when it is not a well-formed `host[:port]`.
pub fn host_name(value: &str) -> Option<String> {
    let value = value.trim();
    let host = if let Some(rest) = value.strip_prefix('[') {
        // `[v6]` or `[v6]:port`
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(valid_port)) {
            return None;
        }
        inside.parse::<std::net::Ipv6Addr>().ok()?;
        inside
    } else {
        let (host, port) = match value.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (value, None),
        };
        if port.is_some_and(|p| !valid_port(p)) {
            return None;
        }
        host
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b));
    ok.then(|| host.to_ascii_lowercase())
}

fn valid_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `host` (as [`host_name`] returns it) always means this machine: `localhost`, a name
/// under `.localhost` (RFC 6761: browsers resolve them to loopback themselves, never by DNS),
/// or a loopback address.
pub fn is_loopback_name(host: &str) -> bool {
    host == "localhost"
        || host.ends_with(".localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether a `Host` value names this machine or one of `allowed` (compared without port and
/// case). A malformed value is refused.
pub fn host_allowed(value: &str, allowed: &[String]) -> bool {
    host_name(value).is_some_and(|h| {
        is_loopback_name(&h) || allowed.iter().any(|a| host_name(a).is_some_and(|a| a == h))
    })
}

/// Whether an `Origin` value (`scheme://host[:port]`) is this machine or one of `allowed`.
/// `null` (a sandboxed frame, a file) and anything that is not `http`/`https` are refused.
pub fn origin_allowed(value: &str, allowed: &[String]) -> bool {
    let value = value.trim();
    let Some(rest) = value
        .strip_prefix("http://")
        .or_else(|| value.strip_prefix("https://"))
    else {
        return false;
    };
    // An origin has no path; a trailing slash is tolerated.
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    !rest.contains(['/', '?', '#', '@']) && host_allowed(rest, allowed)
}

/// Failed sign-ins allowed at once per client address.
pub const SIGNIN_BURST: u32 = 5;

/// After the burst, one more try per client address this often.
pub const SIGNIN_REFILL: Duration = Duration::from_secs(2);

/// Client addresses remembered at most; past it, those with a full allowance are forgotten.
const THROTTLE_ENTRIES: usize = 10_000;

/// A token bucket per client address.
#[derive(Debug)]
pub struct Throttle {
    burst: f64,
    refill: Duration,
    buckets: Mutex<HashMap<IpAddr, (f64, Instant)>>,
}

impl Throttle {
    /// `burst` tries at once per address, then one per `refill`.
    pub fn new(burst: u32, refill: Duration) -> Self {
        Throttle {
            burst: f64::from(burst.max(1)),
            refill,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn level(&self, tokens: f64, since: Instant, now: Instant) -> f64 {
        let earned = now.duration_since(since).as_secs_f64() / self.refill.as_secs_f64();
        (tokens + earned).min(self.burst)
    }

    /// Takes one try for `ip`; `Err(wait)` when it has none left (try again after `wait`).
    /// Taken before the token is checked, so concurrent guesses count too.
    pub fn take(&self, ip: IpAddr) -> Result<(), Duration> {
        let now = Instant::now();
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if b.len() >= THROTTLE_ENTRIES && !b.contains_key(&ip) {
            b.retain(|_, (t, at)| self.level(*t, *at, now) < self.burst);
            if b.len() >= THROTTLE_ENTRIES {
                // Every remembered address is guessing: forget the lot rather than grow.
                b.clear();
            }
        }
        let (tokens, at) = b.entry(ip).or_insert((self.burst, now));
        let level = self.level(*tokens, *at, now);
        if level < 1.0 {
            return Err(self.refill.mul_f64(1.0 - level));
        }
        *tokens = level - 1.0;
        *at = now;
        Ok(())
    }

    /// Gives back the try `take` took (the sign-in succeeded).
    pub fn give_back(&self, ip: IpAddr) {
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((tokens, _)) = b.get_mut(&ip) {
            *tokens = (*tokens + 1.0).min(self.burst);
        }
    }
}

/// How often each kind of refusal is logged at most.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// One log line per period for a kind of event; the others are counted.
#[derive(Debug)]
pub struct LogEvery {
    every: Duration,
    last: Mutex<Option<Instant>>,
    unlogged: AtomicU64,
}

impl LogEvery {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> Self {
        LogEvery {
            every,
            last: Mutex::new(None),
            unlogged: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when this event should be logged, `n` the events not logged since the last
    /// line; `None` (counted) otherwise.
    pub fn due(&self) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| now.duration_since(t) < self.every) {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.unlogged.swap(0, Ordering::Relaxed))
    }
}

/// How long a verified bearer credential is taken without PBKDF2 again (the account itself is
/// still read on every request).
pub const VERIFIED_FOR: Duration = Duration::from_secs(300);

/// The most credentials remembered at once (past it the memory starts over).
const VERIFIED_MAX: usize = 1024;

/// Bearer credentials verified lately, by a salted digest of name and credential (never the
/// credential), with the hash they matched: a new credential or a changed hash misses.
#[derive(Debug)]
pub struct VerifiedCredentials {
    salt: [u8; 16],
    seen: Mutex<HashMap<[u8; 32], (String, Instant)>>,
}

impl Default for VerifiedCredentials {
    fn default() -> Self {
        let mut salt = [0u8; 16];
        for b in &mut salt {
            *b = fastrand::u8(..);
        }
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut salt);
        VerifiedCredentials {
            salt,
            seen: Mutex::default(),
        }
    }
}

impl VerifiedCredentials {
    fn key(&self, name: &str, credential: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.salt);
        h.update(name.as_bytes());
        h.update([0]);
        h.update(credential.as_bytes());
        h.finalize().into()
    }

    /// Whether `name` and `credential` were verified lately against `hash`.
    pub fn hit(&self, name: &str, credential: &str, hash: &str) -> bool {
        let key = self.key(name, credential);
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(&key)
            .is_some_and(|(h, at)| h == hash && at.elapsed() < VERIFIED_FOR)
    }

    /// Remembers that `name` and `credential` matched `hash`.
    pub fn put(&self, name: &str, credential: &str, hash: String) {
        let key = self.key(name, credential);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= VERIFIED_MAX {
            seen.clear();
        }
        seen.insert(key, (hash, Instant::now()));
    }
}

/// The edge's memory, shared by every route ([`crate::edge::AppState::guard`]).
#[derive(Debug)]
pub struct Guard {
    /// Sign-in tries per client address.
    pub signin: Throttle,
    /// Wrong admin tokens at sign-in.
    pub signin_log: LogEvery,
    /// Sign-ins refused by the throttle.
    pub throttled_log: LogEvery,
    /// Wrong or missing bearer tokens.
    pub bearer_log: LogEvery,
    /// Requests refused for their `Host` or `Origin`.
    pub host_log: LogEvery,
    /// Operators' bearer credentials verified lately.
    pub verified: VerifiedCredentials,
}

impl Default for Guard {
    fn default() -> Self {
        Guard {
            signin: Throttle::new(SIGNIN_BURST, SIGNIN_REFILL),
            signin_log: LogEvery::new(LOG_EVERY),
            throttled_log: LogEvery::new(LOG_EVERY),
            bearer_log: LogEvery::new(LOG_EVERY),
            host_log: LogEvery::new(LOG_EVERY),
            verified: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verified_credential_is_remembered_with_its_hash() {
        let v = VerifiedCredentials::default();
        assert!(!v.hit("ann", "cred", "h1"));
        v.put("ann", "cred", "h1".into());
        assert!(v.hit("ann", "cred", "h1"));
        assert!(
            !v.hit("ann", "cred", "h2"),
            "another hash: the credential changed"
        );
        assert!(!v.hit("ann", "other", "h1"));
        assert!(!v.hit("bob", "cred", "h1"));
    }

    #[test]
    fn loopback_names_and_listed_hosts_pass() {
        let none: Vec<String> = vec![];
        for ok in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.",
            "app.localhost:1",
            "127.0.0.1",
            "127.1.2.3:8080",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(host_allowed(ok, &none), "{ok}");
        }
        for bad in [
            "rebind.evil.example",
            "rebind.evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1",
            "[::2]:80",
            "",
            "x",
            "127.0.0.1:port",
            "[::1",
            "a b",
            "localhost:8080:1",
        ] {
            assert!(!host_allowed(bad, &none), "{bad}");
        }
        let listed = vec!["Claimd.Internal".to_string()];
        assert!(host_allowed("claimd.internal:8080", &listed));
        assert!(!host_allowed("other.internal", &listed));
    }

    #[test]
    fn origins_are_scheme_and_host() {
        let none: Vec<String> = vec![];
        for ok in [
            "http://localhost:8080",
            "https://127.0.0.1",
            "http://[::1]:80/",
        ] {
            assert!(origin_allowed(ok, &none), "{ok}");
        }
        for bad in [
            "null",
            "http://rebind.evil.example:8080",
            "file://",
            "http://localhost@evil.example",
            "http://localhost/path",
            "localhost",
            "ftp://localhost",
        ] {
            assert!(!origin_allowed(bad, &none), "{bad}");
        }
    }

    #[test]
    fn the_throttle_allows_a_burst_then_one_per_refill() {
        let refill = Duration::from_millis(200);
        let t = Throttle::new(3, refill);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        for _ in 0..3 {
            assert!(t.take(ip).is_ok());
        }
        let wait = t.take(ip).unwrap_err();
        assert!(wait <= refill, "{wait:?}");
        assert!(t.take(other).is_ok(), "another address has its own");
        std::thread::sleep(refill);
        assert!(t.take(ip).is_ok());
        assert!(t.take(ip).is_err());
        t.give_back(ip);
        assert!(t.take(ip).is_ok(), "a success gives its try back");
    }

    #[test]
    fn log_lines_are_spaced_and_count_the_rest() {
        let l = LogEvery::new(Duration::from_millis(200));
        assert_eq!(l.due(), Some(0));
        assert_eq!(l.due(), None);
        assert_eq!(l.due(), None);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(l.due(), Some(2));
    }
}
