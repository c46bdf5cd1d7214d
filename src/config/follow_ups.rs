//! `[[consumers.follow_ups]]`: the claims a consumer's settle creates for other consumers
//! (docs/follow-ups.md), and their checks at load.

use super::ConsumerConfig;
use crate::domain::claim::ClaimState;
use crate::domain::follow_up::PayloadTemplate;
use serde::{Deserialize, Serialize};

/// Longest step name: the child's message id is the parent's, `:` and the step, within the
/// 255 of a message id even when the parent's is replaced by its hash (71 characters).
pub const MAX_STEP_LEN: usize = 100;

/// `on`: the state whose settle creates the follow-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FollowUpOn {
    /// The parent completed.
    Completed,
    /// The parent failed (the provider refused it).
    Failed,
    /// The parent went `pending` (the provider is still working on it).
    Pending,
}

impl FollowUpOn {
    /// The claim state it names.
    pub fn state(self) -> ClaimState {
        match self {
            FollowUpOn::Completed => ClaimState::Completed,
            FollowUpOn::Failed => ClaimState::Failed,
            FollowUpOn::Pending => ClaimState::Pending,
        }
    }
}

/// One `[[consumers.follow_ups]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FollowUpConfig {
    /// `step`: the follow-up's name, appended to the parent's message id (`<id>:<step>`).
    pub step: String,
    /// `on`: the parent's state that creates it.
    pub on: FollowUpOn,
    /// `consumer`: the consumer that performs it (its key template keys the child).
    pub consumer: String,
    /// `payload`: the child's payload, a JSON text with `{{payload:/pointer}}`,
    /// `{{answer:/pointer}}`, `{{message_id}}` and `{{tenant}}` placeholders.
    pub payload: String,
}

/// Checks consumer `c`'s follow-ups against all `consumers`: the error is (key below
/// `follow_ups[i]`, why).
pub(super) fn check_follow_ups(
    c: &ConsumerConfig,
    consumers: &[ConsumerConfig],
) -> Result<(), (String, String)> {
    for (j, f) in c.follow_ups.iter().enumerate() {
        let at = |k: &str| format!("follow_ups[{j}].{k}");
        if f.step.is_empty()
            || f.step.len() > MAX_STEP_LEN
            || !f.step.bytes().all(|b| (0x21..=0x7e).contains(&b))
        {
            return Err((
                at("step"),
                format!(
                    "{:?}: a name of 1 to {MAX_STEP_LEN} visible ASCII characters",
                    f.step
                ),
            ));
        }
        if c.follow_ups[..j]
            .iter()
            .any(|o| o.step == f.step && o.on == f.on)
        {
            return Err((
                at("step"),
                format!("{:?} is named twice for one state", f.step),
            ));
        }
        let Some(child) = consumers.iter().find(|o| o.name == f.consumer) else {
            return Err((
                at("consumer"),
                format!(
                    "step {:?} names consumer {:?}, which is not configured",
                    f.step, f.consumer
                ),
            ));
        };
        // The child is written as an enqueued claim: no order key line to wait in.
        if child.flow.order_key.is_some() {
            return Err((
                at("consumer"),
                format!(
                    "step {:?}: consumer {:?} orders its claims by order_key, which a follow-up cannot carry",
                    f.step, f.consumer
                ),
            ));
        }
        // The child has its parent's tenant: two tenants' children of one message id would
        // share an idempotency key unless the child's key names the tenant.
        if c.key.contains("{tenant}") && !child.key.contains("{tenant}") {
            return Err((
                at("consumer"),
                format!(
                    "step {:?}: consumer {:?}'s key {:?} lacks {{tenant}}, and this consumer's messages carry tenants",
                    f.step, f.consumer, child.key
                ),
            ));
        }
        f.payload
            .parse::<PayloadTemplate>()
            .map_err(|e| (at("payload"), format!("step {:?}: {e}", f.step)))?;
    }
    refuse_cycle(c, consumers)
}

/// A chain of follow-ups that comes back to `c` would create claims without end.
fn refuse_cycle(c: &ConsumerConfig, consumers: &[ConsumerConfig]) -> Result<(), (String, String)> {
    let mut seen: Vec<&str> = Vec::new();
    let mut next: Vec<&str> = c.follow_ups.iter().map(|f| f.consumer.as_str()).collect();
    while let Some(name) = next.pop() {
        if name == c.name {
            return Err((
                "follow_ups".into(),
                format!(
                    "follow-ups lead from consumer {:?} back to it: a chain without end",
                    c.name
                ),
            ));
        }
        if seen.contains(&name) {
            continue;
        }
        seen.push(name);
        if let Some(o) = consumers.iter().find(|o| o.name == name) {
            next.extend(o.follow_ups.iter().map(|f| f.consumer.as_str()));
        }
    }
    Ok(())
}
