//! How HTTP intake answers with a claim's outcome: response replay for a retried request
//! (`Idempotent-Replayed: true`, after the IETF Idempotency-Key draft) and waiting for the
//! outcome (`Prefer: wait=N`, RFC 7240).
//!
//! A claim is *settled* here when no worker will change it on its own: `completed`, `failed`
//! or `needs_attention`. A `pending` claim (the provider has not finished) is not.

use crate::claim::{Claim, ClaimState};
use crate::store::Store;
use std::time::Duration;
use tokio::time::Instant;

/// The response header that marks a replayed outcome.
pub const REPLAYED: &str = "Idempotent-Replayed";
/// The response header that says which preference was applied (RFC 7240).
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

/// The claim of `consumer`/`tenant`/`message_id` once it is settled, or as it is when `wait`
/// has passed (`None`: it vanished, or the store could not be read). Polls the store, 20 ms
/// doubling to 250 ms: one indexed read each, no write. Dropping the future (the client hung
/// up) changes nothing: the claim was committed before the wait began.
pub async fn await_outcome(
    store: &Store,
    consumer: &str,
    tenant: &str,
    message_id: &str,
    wait: Duration,
) -> Option<Claim> {
    let until = Instant::now() + wait;
    let mut pause = Duration::from_millis(20);
    loop {
        let claim = store.get(consumer, tenant, message_id).await.ok()??;
        let now = Instant::now();
        if settled(claim.state) || now >= until {
            return Some(claim);
        }
        tokio::time::sleep(pause.min(until - now)).await;
        pause = (pause * 2).min(Duration::from_millis(250));
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
