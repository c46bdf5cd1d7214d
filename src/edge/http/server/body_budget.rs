//! The byte budget for request bodies held in memory at once (`[http] body_budget_bytes`).

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// The byte budget for request bodies held in memory at once (`[http] body_budget_bytes`).
///
/// A body takes budget for the memory it really holds, not for what it declares: before it is
/// read, a first slice (its declared length when that is smaller; see [`BodyBudget::slice`]),
/// then more as its bytes arrive and its buffer grows (doubling, up to the declared length or
/// `max_body_bytes`), trimmed to the real size once read. So a client that declares 1 MiB and
/// trickles holds only what it sent. The share is kept until the claim's call starts (see
/// [`crate::engine::claimer::Claimer::submit_held`]): a body waiting to be read, claimed or called
/// counts here; one in a call is bounded by the consumer's `concurrency` instead. When the
/// budget is spent, intake waits up to `intake_wait` for a first slice and then answers `503` +
/// `Retry-After` without reading the body (likewise, mid-body, for more room): the backlog
/// waits in the clients, never in claimd's memory.
#[derive(Debug)]
pub struct BodyBudget {
    kib: Arc<Semaphore>,
    total_kib: usize,
    slice_kib: usize,
}

/// A share of the [`BodyBudget`], given back on drop.
#[derive(Debug)]
pub struct BodyShare {
    held: tokio::sync::OwnedSemaphorePermit,
    kib: Arc<Semaphore>,
    total_kib: usize,
}

impl BodyShare {
    /// Gives back what the share holds beyond `bytes` (a body of unknown length was shorter
    /// than `max_body_bytes`).
    pub fn trim_to(&mut self, bytes: usize) {
        let keep = bytes.div_ceil(1024).max(1);
        if let Some(extra) = self.held.num_permits().checked_sub(keep).filter(|n| *n > 0) {
            drop(self.held.split(extra));
        }
    }

    /// Bytes this share holds.
    pub fn bytes(&self) -> usize {
        self.held.num_permits() * 1024
    }

    /// Grows the share to `bytes`, waiting up to `wait` for the room; `false` when the budget
    /// stayed spent (the share keeps what it had).
    pub async fn grow_to(&mut self, bytes: usize, wait: Duration) -> bool {
        let want = bytes.div_ceil(1024).min(self.total_kib);
        let Some(more) = want.checked_sub(self.held.num_permits()).filter(|n| *n > 0) else {
            return true;
        };
        let Ok(more) = u32::try_from(more) else {
            return false;
        };
        let got = match self.kib.clone().try_acquire_many_owned(more) {
            Ok(p) => Some(p),
            Err(_) => tokio::time::timeout(wait, self.kib.clone().acquire_many_owned(more))
                .await
                .ok()
                .and_then(Result::ok),
        };
        match got {
            Some(p) => {
                self.held.merge(p);
                true
            }
            None => false,
        }
    }
}

impl BodyBudget {
    /// A budget of `bytes` (counted in KiB, rounded up) shared by at most `max_connections`
    /// requests at once.
    pub fn new(bytes: usize, max_connections: usize) -> Self {
        let total_kib = bytes.div_ceil(1024).max(1);
        // Every open connection can hold its first slice at once without spending the budget
        // (16 KiB with the defaults), so connections alone, however slow, cannot exhaust it.
        let slice_kib = (total_kib / max_connections.max(1)).clamp(4, 64);
        BodyBudget {
            kib: Arc::new(Semaphore::new(total_kib)),
            total_kib,
            slice_kib,
        }
    }

    /// The first slice a body of unknown or larger length takes before it is read.
    pub fn slice(&self) -> usize {
        self.slice_kib * 1024
    }

    /// A share for the first `bytes` of a body, waiting up to `wait` for one; `None` when the
    /// budget stayed spent.
    pub async fn admit(&self, bytes: usize, wait: Duration) -> Option<BodyShare> {
        let kib = u32::try_from(bytes.div_ceil(1024).clamp(1, self.total_kib)).ok()?;
        let held = match self.kib.clone().try_acquire_many_owned(kib) {
            Ok(p) => p,
            Err(_) => tokio::time::timeout(wait, self.kib.clone().acquire_many_owned(kib))
                .await
                .ok()?
                .ok()?,
        };
        Some(BodyShare {
            held,
            kib: self.kib.clone(),
            total_kib: self.total_kib,
        })
    }

    /// Bytes of the budget now taken by bodies being read, claimed or waiting for a call.
    pub fn in_use_bytes(&self) -> usize {
        (self.total_kib - self.kib.available_permits()) * 1024
    }

    /// Reads `body` into one buffer, taking budget for the memory it holds as it grows: a
    /// first slice before anything is read, then more as bytes arrive, the buffer doubling up
    /// to the `declared` length (the last step lands on it exactly, so a declared body is held
    /// once). Refused past `limit` (a declared length before reading), and when the budget has
    /// no room within `wait`. Each route answers the refusal in its own words.
    pub async fn read(
        &self,
        body: axum::body::Body,
        declared: Option<u64>,
        limit: usize,
        wait: Duration,
    ) -> Result<(Vec<u8>, BodyShare), BodyRefused> {
        use http_body_util::BodyExt;
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(BodyRefused::TooLarge);
        }
        let whole = declared.map_or(limit, |n| n as usize);
        let first = whole.min(self.slice());
        let mut share = self
            .admit(first, wait)
            .await
            .ok_or(BodyRefused::BudgetSpent)?;
        let mut buf = Vec::with_capacity(first);
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(BodyRefused::Unreadable)?;
            if let Ok(data) = frame.into_data() {
                let need = buf.len() + data.len();
                if need > limit {
                    return Err(BodyRefused::TooLarge);
                }
                if need > buf.capacity() {
                    let grown = need.max((buf.capacity() * 2).min(whole)).min(limit);
                    if !share.grow_to(grown, wait).await {
                        return Err(BodyRefused::BudgetSpent);
                    }
                    buf.reserve_exact(grown - buf.len());
                }
                buf.extend_from_slice(&data);
            }
        }
        share.trim_to(buf.len());
        Ok((buf, share))
    }
}

/// Why [`BodyBudget::read`] did not read a body.
#[derive(Debug)]
pub enum BodyRefused {
    /// Over the route's limit (declared, or once the bytes passed it).
    TooLarge,
    /// The budget had no room within the wait.
    BudgetSpent,
    /// The body could not be read (a timeout, a connection error).
    Unreadable(axum::Error),
}
