//! Waiting for a claim's outcome (`Prefer: wait=N`) without holding the HTTP edge: a cap on
//! the requests that wait at once ([`Waiters`]), and the signal the settle path rings so that a
//! waiter wakes when its claim is settled instead of reading the store again and again
//! ([`SettleSignals`]).
//!
//! A signal and a slow re-read both: the settles of this instance (its calls, its pending
//! polls, the provider events it receives, its sweeper) ring the signal; a claim settled by
//! another instance sharing the store (a provider event that reached that one, its sweeper) or
//! by an operator is seen at the next re-read, every [`REREAD_EVERY`].

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// How often a waiter reads its claim again when no signal came: the longest a claim settled
/// by another instance or an operator takes to reach its waiters (plus up to
/// [`REREAD_JITTER`], so that waiters that came together do not read together).
pub const REREAD_EVERY: Duration = Duration::from_secs(2);

/// The most a waiter's re-read is put off beyond [`REREAD_EVERY`], chosen at random.
pub const REREAD_JITTER: Duration = Duration::from_millis(250);

/// One signal per claim that a request waits for, rung when the claim is settled here.
#[derive(Debug, Default)]
pub struct SettleSignals {
    claims: Mutex<HashMap<i64, watch::Sender<()>>>,
}

impl SettleSignals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, watch::Sender<()>>> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for claim `claim_id`'s signal from now on (a settle before this call is not
    /// seen: read the claim after subscribing).
    pub fn subscribe(self: &Arc<Self>, claim_id: i64) -> SettleSubscription {
        let rx = self
            .lock()
            .entry(claim_id)
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        SettleSubscription {
            signals: self.clone(),
            claim_id,
            rx: Some(rx),
        }
    }

    /// Rings claim `claim_id`'s signal: its state changed (the settle path calls this once
    /// the write is committed). Nothing happens when nobody waits for it.
    pub fn settled(&self, claim_id: i64) {
        if let Some(tx) = self.lock().get(&claim_id) {
            tx.send_replace(());
        }
    }

    /// Claims with at least one waiter.
    pub fn watched(&self) -> usize {
        self.lock().len()
    }
}

/// A waiter's subscription to its claim's signal; the last one of a claim removes the signal.
#[derive(Debug)]
pub struct SettleSubscription {
    signals: Arc<SettleSignals>,
    claim_id: i64,
    rx: Option<watch::Receiver<()>>,
}

impl SettleSubscription {
    /// Resolves once the claim's signal rang since the subscription (or since the last time
    /// this resolved).
    pub async fn rung(&mut self) {
        let Some(rx) = self.rx.as_mut() else {
            return std::future::pending().await;
        };
        if rx.changed().await.is_err() {
            // The sender lives as long as a receiver does; should it not, the re-read remains.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for SettleSubscription {
    fn drop(&mut self) {
        let mut claims = self.signals.lock();
        drop(self.rx.take());
        if claims
            .get(&self.claim_id)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            claims.remove(&self.claim_id);
        }
    }
}

/// The cap on requests waiting for an outcome at once (`[http] max_waiters`, at most half of
/// `max_connections`): a request past it is answered at once with the claim as it is, as
/// without `Prefer: wait`, and without `Preference-Applied`. So waiters can never hold every
/// connection the listener takes.
#[derive(Debug)]
pub struct Waiters {
    places: Arc<Semaphore>,
    limit: usize,
}

/// A place among the waiters, given back on drop.
#[derive(Debug)]
pub struct WaitPlace {
    _permit: OwnedSemaphorePermit,
    in_use: Gauge,
}

impl Drop for WaitPlace {
    fn drop(&mut self) {
        self.in_use.dec();
    }
}

impl Waiters {
    /// The cap configured in `[http]`: `max_waiters`, but never more than half of
    /// `max_connections`.
    pub fn limit_for(http: &crate::config::HttpConfig) -> usize {
        http.max_waiters.min(http.max_connections / 2)
    }

    /// A cap of `limit` waiters (0: every request is answered at once), shown in `metrics`.
    pub fn new(limit: usize, metrics: &WaiterMetrics) -> Self {
        metrics.limit.set(i64::try_from(limit).unwrap_or(i64::MAX));
        Waiters {
            places: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// The cap.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A place to wait, or `None` (counted as refused) when `limit` requests already wait.
    pub fn try_place(&self, metrics: &WaiterMetrics) -> Option<WaitPlace> {
        match self.places.clone().try_acquire_owned() {
            Ok(permit) => {
                metrics.in_use.inc();
                Some(WaitPlace {
                    _permit: permit,
                    in_use: metrics.in_use.clone(),
                })
            }
            Err(_) => {
                metrics.refused.inc();
                None
            }
        }
    }
}

/// The waiters' series, registered with claimd's metrics.
#[derive(Debug, Default)]
pub struct WaiterMetrics {
    in_use: Gauge,
    limit: Gauge,
    refused: Counter,
}

impl WaiterMetrics {
    /// Registers the series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "http_waiters",
            "Requests waiting for a claim's outcome (Prefer: wait) now",
            self.in_use.clone(),
        );
        registry.register(
            "http_waiters_limit",
            "Requests that may wait for an outcome at once ([http] max_waiters, at most half of max_connections)",
            self.limit.clone(),
        );
        registry.register(
            "http_waits_refused",
            "Prefer: wait requests answered at once because the waiters were at their limit",
            self.refused.clone(),
        );
    }

    /// Requests waiting now.
    pub fn in_use(&self) -> i64 {
        self.in_use.get()
    }

    /// Requests answered at once because the waiters were at their limit, since start.
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_settle_rings_the_claims_waiters_and_no_other() {
        let signals = Arc::new(SettleSignals::default());
        let mut a1 = signals.subscribe(1);
        let mut a2 = signals.subscribe(1);
        let mut b = signals.subscribe(2);
        assert_eq!(signals.watched(), 2);
        signals.settled(1);
        let quick = Duration::from_millis(50);
        assert!(tokio::time::timeout(quick, a1.rung()).await.is_ok());
        assert!(tokio::time::timeout(quick, a2.rung()).await.is_ok());
        assert!(tokio::time::timeout(quick, b.rung()).await.is_err());
        // Seen once: it does not ring again by itself.
        assert!(tokio::time::timeout(quick, a1.rung()).await.is_err());
        drop((a1, a2));
        assert_eq!(
            signals.watched(),
            1,
            "the last waiter of a claim removes its signal"
        );
        drop(b);
        assert_eq!(signals.watched(), 0);
        signals.settled(3);
        assert_eq!(
            signals.watched(),
            0,
            "ringing with nobody waiting keeps nothing"
        );
    }

    #[tokio::test]
    async fn a_settle_between_subscribing_and_waiting_is_not_lost() {
        let signals = Arc::new(SettleSignals::default());
        let mut s = signals.subscribe(7);
        signals.settled(7);
        let rung = tokio::time::timeout(Duration::from_millis(50), s.rung()).await;
        assert!(rung.is_ok());
    }

    #[test]
    fn past_the_cap_a_request_gets_no_place_and_is_counted() {
        let metrics = WaiterMetrics::default();
        let waiters = Waiters::new(2, &metrics);
        let p1 = waiters.try_place(&metrics).unwrap();
        let _p2 = waiters.try_place(&metrics).unwrap();
        assert!(waiters.try_place(&metrics).is_none());
        assert_eq!((metrics.in_use(), metrics.refused()), (2, 1));
        drop(p1);
        assert_eq!(metrics.in_use(), 1);
        assert!(waiters.try_place(&metrics).is_some());
        assert!(Waiters::new(0, &metrics).try_place(&metrics).is_none());
    }

    #[test]
    fn the_cap_is_never_more_than_half_the_connections() {
        let mut http = crate::config::HttpConfig::default();
        assert_eq!(Waiters::limit_for(&http), 256);
        http.max_connections = 100;
        assert_eq!(Waiters::limit_for(&http), 50);
        http.max_waiters = 10;
        assert_eq!(Waiters::limit_for(&http), 10);
    }
}
