//! A claim's follow-up chain as operators see it (docs/follow-ups.md): the claim whose settle
//! created it and the claims its settles created, each named by its identity and state, never
//! its payload. Pure.

use crate::domain::claim::Claim;
use crate::store::ClaimFamily;
use serde::Serialize;

/// One claim of a chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimLink {
    /// Its consumer.
    pub consumer: String,
    /// Its tenant (`""`: none).
    pub tenant: String,
    /// Its message id.
    pub message_id: String,
    /// Its state.
    pub state: String,
}

impl ClaimLink {
    /// The link to `claim`.
    pub fn of(claim: &Claim) -> Self {
        ClaimLink {
            consumer: claim.consumer.clone(),
            tenant: claim.tenant.clone(),
            message_id: claim.message_id.clone(),
            state: claim.state.to_string(),
        }
    }
}

impl std::fmt::Display for ClaimLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.consumer, self.message_id, self.state)?;
        if !self.tenant.is_empty() {
            write!(f, " tenant {}", self.tenant)?;
        }
        Ok(())
    }
}

/// The parent's link, when it is stored, and the children's, oldest first.
pub fn family_links(family: &ClaimFamily) -> (Option<ClaimLink>, Vec<ClaimLink>) {
    (
        family.parent.as_ref().map(ClaimLink::of),
        family.children.iter().map(ClaimLink::of).collect(),
    )
}
