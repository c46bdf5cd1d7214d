//! How HTTP intake answers with a claim's outcome: response replay for a retried request
//! (`Idempotent-Replayed: true`, after the IETF Idempotency-Key draft) and waiting for the
//! outcome (`Prefer: wait=N`, RFC 7240).
//!
//! A claim is *settled* here when no worker will change it on its own: `completed`, `failed`
//! or `needs_attention`. A `pending` claim (the provider has not finished) is not.

use crate::domain::claim::{Claim, ClaimState};
use crate::engine::waiters::{REREAD_EVERY, REREAD_JITTER, SettleSignals};
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The response header that marks a replayed outcome.
pub const REPLAYED: &str = "Idempotent-Replayed";
/// The response header that says which preference was applied (RFC 7240): `wait=N` names
/// the wait honoured, N as asked or cut to `[http] max_wait` (not the seconds waited: a claim
/// that settles sooner is answered sooner). Absent when the request did not wait because
/// `[http] max_waiters` requests were already waiting.
pub const PREFERENCE_APPLIED: &str = "Preference-Applied";

/// Whether `state` is an outcome the client can act on (see the module's documentation).
pub fn settled(state: ClaimState) -> bool {
    matches!(
        state,
        ClaimState::Completed | ClaimState::Failed | ClaimState::NeedsAttention
    )
}

/// The `wait` preference of the `Prefer` headers (`Prefer: respond-async, wait=10`), in
/// seconds, capped at `max`. `None`: not asked (or not a number). Names are compared without
/// case, and a quoted value is accepted, as RFC 7240 allows.
pub fn prefer_wait<'a>(values: impl Iterator<Item = &'a [u8]>, max: Duration) -> Option<Duration> {
    let mut asked = None;
    for value in values {
        let Ok(text) = std::str::from_utf8(value) else {
            continue;
        };
        for pref in text.split(',') {
            // Parameters after ';' belong to the preference; `wait` takes none.
            let token = pref.split(';').next().unwrap_or("").trim();
            let Some((name, v)) = token.split_once('=') else {
                continue;
            };
            if !name.trim().eq_ignore_ascii_case("wait") {
                continue;
            }
            if let Ok(secs) = v.trim().trim_matches('"').parse::<u64>() {
                asked.get_or_insert(secs);
            }
        }
    }
    asked.map(|s| Duration::from_secs(s).min(max))
}

/// `claim` once it is settled, or as it is when `wait` has passed (`None`: it vanished, or
/// the store could not be read). Woken by the claim's settle signal (a settle on this
/// instance), else reads the claim again every [`REREAD_EVERY`] (a settle elsewhere): one
/// indexed read each, no write. Dropping the future (the client hung up) changes nothing: the
/// claim was committed before the wait began.
pub async fn await_outcome(
    store: &Store,
    signals: &Arc<SettleSignals>,
    claim: &Claim,
    wait: Duration,
) -> Option<Claim> {
    let until = Instant::now() + wait;
    // Subscribed before the first read, so that a settle between the two is not missed.
    let mut signal = signals.subscribe(claim.id);
    loop {
        let now_claim = store
            .get(&claim.consumer, &claim.tenant, &claim.message_id)
            .await
            .ok()??;
        let now = Instant::now();
        if settled(now_claim.state) || now >= until {
            return Some(now_claim);
        }
        let jitter = Duration::from_millis(fastrand::u64(..=REREAD_JITTER.as_millis() as u64));
        let reread = (now + REREAD_EVERY + jitter).min(until);
        tokio::select! {
            () = signal.rung() => {}
            () = tokio::time::sleep_until(reread) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(values: &[&str]) -> Option<Duration> {
        prefer_wait(values.iter().map(|v| v.as_bytes()), Duration::from_secs(30))
    }

    #[test]
    fn the_wait_preference_is_read_as_rfc_7240_writes_it() {
        assert_eq!(wait(&["wait=5"]), Some(Duration::from_secs(5)));
        assert_eq!(
            wait(&["respond-async, Wait=10"]),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            wait(&["handling=lenient", "wait=\"3\""]),
            Some(Duration::from_secs(3))
        );
        assert_eq!(wait(&["wait=600"]), Some(Duration::from_secs(30)), "capped");
        assert_eq!(wait(&["wait=soon"]), None);
        assert_eq!(wait(&["return=minimal"]), None);
        assert_eq!(wait(&[]), None);
        assert_eq!(
            wait(&["wait=2, wait=9"]),
            Some(Duration::from_secs(2)),
            "the first"
        );
    }

    #[test]
    fn only_outcomes_no_worker_will_change_are_settled() {
        assert!(settled(ClaimState::Completed));
        assert!(settled(ClaimState::Failed));
        assert!(settled(ClaimState::NeedsAttention));
        assert!(!settled(ClaimState::Started));
        assert!(!settled(ClaimState::Pending));
    }
}
