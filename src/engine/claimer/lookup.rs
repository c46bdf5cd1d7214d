//! Asking the provider's status endpoint for a claim: each lookup counted and written to the
//! claim's history with its answer, and the lookup right after a call whose outcome is unknown,
//! which trusts a "not found" only `not_found_after` past that call.

use crate::domain::claim::Claim;
use crate::engine::claimer::Claimer;
use crate::engine::consumer::Consumer;
use crate::engine::destination::{Kind, Verdict};
use crate::provider::effect::Lookup;
use std::time::Duration;
use tokio::time::Instant;

/// The longest a status lookup waits for its destination's breaker or pace.
pub const LOOKUP_WAIT: Duration = Duration::from_secs(2);

impl Claimer {
    /// Asks the status endpoint right after a call whose outcome is unknown. A "not found"
    /// sooner than the effect's `not_found_after` after the call is not trusted: the lookup
    /// is repeated once that time has passed, if the lease allows, else the answer is
    /// "unknown" and the sweeper asks again later.
    pub(crate) async fn reconcile_inline(
        &self,
        consumer: &Consumer,
        claim: &Claim,
        called: Instant,
        deadline: Instant,
    ) -> Option<Lookup> {
        let wait = consumer.effect.not_found_after();
        let answer = self.lookup(consumer, claim).await;
        if !matches!(answer, Some(Lookup::NotFound { .. })) || called.elapsed() >= wait {
            return answer;
        }
        let trusted_at = called + wait;
        if trusted_at + Duration::from_millis(100) < deadline {
            tokio::time::sleep_until(trusted_at).await;
            return self.lookup(consumer, claim).await;
        }
        Some(Lookup::Unknown {
            error: format!(
                "not found only {:.1}s after the call; not_found_after = {}",
                called.elapsed().as_secs_f64(),
                crate::domain::duration::Dur(wait)
            ),
        })
    }

    /// Asks the status endpoint, counting the answer and writing it to the claim's history
    /// (`lookup` lines: found with the provider's id, not found, unknown with why).
    ///
    /// A lookup is a request to the provider too: it passes the destination's lookups'
    /// breaker (its own: a failing status endpoint never holds calls back) and the shared
    /// pace ([`crate::engine::destination`]), waiting for them at most [`LOOKUP_WAIT`]; held back
    /// longer, it is answered "unknown" without a request.
    pub async fn lookup(&self, consumer: &Consumer, claim: &Claim) -> Option<Lookup> {
        if !consumer.effect.can_reconcile() {
            return None;
        }
        let answer = match consumer
            .destination
            .admit_as(Kind::Lookup, Instant::now() + LOOKUP_WAIT)
            .await
        {
            Ok(pass) => {
                let answer = consumer.effect.lookup(claim).await;
                let verdict = answer.as_ref().map_or(Verdict::Neutral, Verdict::of_lookup);
                consumer.destination.record(pass, verdict);
                answer
            }
            Err(held) => {
                self.metrics().held(consumer.name(), held.by.as_str());
                Some(Lookup::Unknown {
                    error: held.by.describe().to_string(),
                })
            }
        };
        let (name, status, detail) = match &answer {
            Some(Lookup::Found {
                status,
                provider_id,
                ..
            }) => (
                "found",
                Some(*status),
                provider_id.as_ref().map(|id| format!("provider id {id}")),
            ),
            Some(Lookup::NotFound { status, detail }) => {
                ("not_found", Some(*status), Some(detail.clone()))
            }
            Some(Lookup::Unknown { error }) => ("unknown", None, Some(error.clone())),
            None => return None,
        };
        self.metrics().reconcile(consumer.name(), name);
        self.settler()
            .note(claim, "lookup", name, status, detail.as_deref())
            .await;
        answer
    }
}
