//! A takeover decided by the provider's status endpoint: the lookup, then a settle on its
//! answer, a wait (not an attempt) when it cannot be trusted yet, a re-send when the provider
//! has no record, or a park. It is one attempt of the claim, traced as a `claimd.attempt` span
//! like a send's, with the lookup's settle under it.

use super::{
    end_name, not_found_trusted, park_end, settle_taken_end, trust_not_found_after, wait_undecided,
};
use crate::domain::claim::Claim;
use crate::engine::claimer::drive;
use crate::engine::claimer::{AttemptEnd, Claimer, Consumer, Hold, Slot};
use crate::engine::policy::{self, Takeover};
use crate::engine::settle::{self, Resend};
use crate::engine::traces::AttemptSpan;
use crate::provider::effect::Lookup;

/// Reconciles a taken claim and says what came of it (for the sweep's report). Traced, the
/// attempt's span ends with the state it settled, `left_started` or `lost`; a re-send after a
/// "not found" ends it `not_found` first, the send being an attempt span of its own.
pub(super) async fn reconcile_taken(
    claimer: &Claimer,
    consumer: &Consumer,
    claim: &Claim,
    hold: Hold,
) -> String {
    if !claimer.traces().is_on() {
        return reconcile(claimer, consumer, claim, hold, &mut None).await.0;
    }
    let destination = consumer.config.effect.destination();
    let mut open = Some(
        claimer
            .traces()
            .attempt(claim, vec![("claimd.destination", destination.into())]),
    );
    let (result, end) = reconcile(claimer, consumer, claim, hold, &mut open).await;
    if let Some(open) = open {
        match &end {
            AttemptEnd::Settled(state) => open.end(state.as_str(), None),
            AttemptEnd::LeftStarted(why) => open.end("left_started", Some(why)),
            AttemptEnd::Lost => open.end("lost", None),
        }
    }
    result
}

/// [`reconcile_taken`] inside its span (`open`, taken and ended here before a re-send).
async fn reconcile(
    claimer: &Claimer,
    consumer: &Consumer,
    claim: &Claim,
    hold: Hold,
    open: &mut Option<AttemptSpan>,
) -> (String, AttemptEnd) {
    let said = |end: AttemptEnd| (end_name(&end), end);
    let found = claimer.lookup(consumer, claim).await;
    // Past send_deadline nothing is sent any more, and a "not found" ends the claim.
    let past_deadline = hold.age_now() > consumer.config.send_deadline.0;
    let trusted_after = trust_not_found_after(consumer, past_deadline);
    match found {
        Some(Lookup::Found {
            status, response, ..
        }) => {
            let effect = &consumer.effect;
            let (s, name) = settle::by_answer(
                effect.outcomes(),
                effect.lookup_object(),
                status,
                response,
                true,
                "found",
            );
            said(settle_taken_end(claimer, claim, s, "reconcile", name).await)
        }
        Some(Lookup::NotFound { .. })
            if let Err(left) = not_found_trusted(claimer, claim, trusted_after).await =>
        {
            // The provider's search may not have caught up with the last call yet, or a
            // call the client gave up on may still be queued there: wait (not an attempt)
            // until the claim has been quiet long enough, then ask again.
            let why = format!(
                "not found, but too soon after the last call to trust (trusted {} after it: not_found_after = {}{}); will ask again",
                crate::domain::duration::Dur(trusted_after),
                crate::domain::duration::Dur(consumer.effect.not_found_after()),
                if past_deadline {
                    ", and three times the effect's timeout before a claim ends never sent"
                } else {
                    ""
                }
            );
            wait_undecided(claimer, claim, &why, drive::spread(left)).await;
            (why.clone(), AttemptEnd::LeftStarted(why))
        }
        // Past send_deadline nothing is sent any more: the provider's own "no record" is
        // the proof that ends it.
        Some(Lookup::NotFound { .. }) if past_deadline => {
            match policy::not_found_past_deadline(
                hold.age_now(),
                consumer.config.redrive_within.0,
                &claim.idem_key,
            ) {
                Takeover::Fail(reason) => said(
                    settle_taken_end(
                        claimer,
                        claim,
                        settle::never_sent(reason),
                        "sweep",
                        "never_sent",
                    )
                    .await,
                ),
                Takeover::Park(reason) => said(park_end(claimer, claim, &reason).await),
                _ => unreachable!("not_found_past_deadline fails or parks"),
            }
        }
        Some(Lookup::NotFound { .. }) => {
            match policy::after_not_found(hold.age_now(), consumer.config.redrive_within.0) {
                Takeover::Perform { .. } => {
                    if let Some(open) = open.take() {
                        open.end("not_found", None);
                    }
                    let end = claimer
                        .drive(consumer, claim, hold, Some(Resend::NotFound), Slot::none())
                        .await;
                    (
                        format!("not found at provider; redriven: {}", end_name(&end)),
                        end,
                    )
                }
                Takeover::Park(reason) => said(park_end(claimer, claim, &reason).await),
                _ => unreachable!("after_not_found performs or parks"),
            }
        }
        Some(Lookup::Unknown { error }) if hold.age_now() > consumer.config.redrive_within.0 => {
            let reason = format!(
                "outcome unknown and the status endpoint gave no answer within redrive_within ({}): {error}",
                crate::domain::duration::Dur(consumer.config.redrive_within.0)
            );
            said(park_end(claimer, claim, &reason).await)
        }
        Some(Lookup::Unknown { error }) => {
            // No answer is no decision: wait (not an attempt) and ask again after a
            // backoff, or when the destination is due a probe. (The lookup wrote its own
            // history line.)
            let why = format!("status unknown ({error}); will ask again");
            wait_undecided(claimer, claim, &why, drive::wait_for(consumer, claim, None)).await;
            (why.clone(), AttemptEnd::LeftStarted(why))
        }
        None => said(park_end(claimer, claim, "no status endpoint to reconcile with").await),
    }
}
