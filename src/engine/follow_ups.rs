//! The follow-ups a settle creates (docs/follow-ups.md): each consumer's
//! `[[consumers.follow_ups]]`, rendered for a claim and its settlement into the claims the
//! settle writes in its own transaction, and the pickups woken once it committed.

use crate::config::FollowUpConfig;
use crate::domain::claim::{Claim, ClaimState, KeyTemplate};
use crate::domain::follow_up::{FollowUpSource, PayloadTemplate, child_message_id};
use crate::engine::consumer::Consumer;
use crate::store::{FollowUpClaim, Settlement};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::Notify;

/// One configured follow-up, parsed.
#[derive(Debug)]
struct Step {
    name: String,
    on: ClaimState,
    consumer: String,
    key: KeyTemplate,
    payload: PayloadTemplate,
}

/// Every consumer's follow-ups and the pickup bells of the consumers that perform them.
#[derive(Debug, Default)]
pub struct FollowUpPlan {
    steps: BTreeMap<String, Vec<Step>>,
    bells: BTreeMap<String, Arc<Notify>>,
}

impl FollowUpPlan {
    /// The plan of `consumers` (their follow-ups were checked at load: a step that does not
    /// parse here is left out).
    pub fn new(consumers: &[Arc<Consumer>]) -> Self {
        let by_name: BTreeMap<&str, &Arc<Consumer>> =
            consumers.iter().map(|c| (c.name(), c)).collect();
        let mut plan = FollowUpPlan::default();
        for c in consumers {
            for f in &c.config.follow_ups {
                if let Some(step) = step_of(f, &by_name) {
                    if let Some(child) = by_name.get(f.consumer.as_str()) {
                        plan.bells.insert(f.consumer.clone(), child.pickup_bell());
                    }
                    plan.steps
                        .entry(c.name().to_string())
                        .or_default()
                        .push(step);
                }
            }
        }
        plan
    }

    /// Whether any consumer has follow-ups.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The follow-up claims `s` creates for `claim`: those of its consumer whose `on` is the
    /// state it settles to. A value a template points at that is missing parks the child,
    /// naming it, with the template as its payload (never sent as it is: a person decides).
    pub fn children(&self, claim: &Claim, s: &Settlement) -> Vec<FollowUpClaim> {
        let (Some(state), Some(steps)) = (s.state, self.steps.get(&claim.consumer)) else {
            return Vec::new();
        };
        // A pending claim settled pending again (a poll, a provider event saying "still
        // processing") made its children when it became pending; and most settles match no
        // step: nothing to parse.
        if claim.state == state || !steps.iter().any(|step| step.on == state) {
            return Vec::new();
        }
        let payload = serde_json::from_slice(&claim.payload).ok();
        let answer = s
            .provider_response
            .as_deref()
            .and_then(|a| serde_json::from_str(a).ok());
        let source = FollowUpSource {
            payload: payload.as_ref(),
            answer: answer.as_ref(),
            message_id: &claim.message_id,
            tenant: &claim.tenant,
        };
        steps
            .iter()
            .filter(|step| step.on == state)
            .map(|step| {
                let message_id = message_id_of(&claim.message_id, &step.name);
                let (payload, parked) = match step.payload.render(&source) {
                    Ok(p) => (p, None),
                    Err(e) => (
                        step.payload.text(),
                        Some(format!(
                            "follow-up {:?} of {:?}: {e}; not sent",
                            step.name, claim.message_id
                        )),
                    ),
                };
                FollowUpClaim {
                    idem_key: step.key.render(&step.consumer, &claim.tenant, &message_id),
                    consumer: step.consumer.clone(),
                    tenant: claim.tenant.clone(),
                    message_id,
                    fingerprint: crate::store::sealing::fingerprint(payload.as_bytes()),
                    payload: payload.into_bytes(),
                    content_type: "application/json".into(),
                    parked,
                }
            })
            .collect()
    }

    /// Wakes the pickups of the consumers `s` created claims for (after its commit).
    pub fn ring(&self, s: &Settlement) {
        for child in &s.follow_ups {
            if let Some(bell) = self.bells.get(&child.consumer) {
                bell.notify_one();
            }
        }
    }
}

fn step_of(f: &FollowUpConfig, consumers: &BTreeMap<&str, &Arc<Consumer>>) -> Option<Step> {
    let child = consumers.get(f.consumer.as_str())?;
    Some(Step {
        name: f.step.clone(),
        on: f.on.state(),
        consumer: f.consumer.clone(),
        key: child.template.clone(),
        payload: f.payload.parse().ok()?,
    })
}

/// `<parent>:<step>`; when that is longer than a message id may be, `sha256:<hex of the
/// parent's id>:<step>` (still one id per parent and step; the step's length is bounded at load).
fn message_id_of(parent: &str, step: &str) -> String {
    child_message_id(parent, step)
        .unwrap_or_else(|_| format!("sha256:{}:{step}", hex::encode(Sha256::digest(parent))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_parent_id_is_hashed_into_the_childs() {
        assert_eq!(message_id_of("m-1", "receipt"), "m-1:receipt");
        let long = message_id_of(&"x".repeat(255), "receipt");
        assert!(long.starts_with("sha256:") && long.ends_with(":receipt"));
        assert!(long.len() <= 255);
    }
}
