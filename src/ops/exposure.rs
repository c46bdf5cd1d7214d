//! What a viewer is shown of a claim ([`crate::domain::redaction`] applied): the payload, the
//! provider's answer, the last error and the history's details, masked unless the viewer may
//! see them ([`Exposure::Revealed`]: `claimd claims show --reveal`). The operator page and the
//! HTTP API show masked claims.

use crate::config::Config;
use crate::domain::claim::Claim;
use crate::domain::redaction::{Exposure, Redactor};
use crate::store::ClaimEvent;

/// The masking of `consumer`'s claims: the default names and its `sensitive_fields`.
pub fn redactor_for(config: &Config, consumer: &str) -> Redactor {
    config
        .consumers
        .iter()
        .find(|c| c.name == consumer)
        .map(|c| Redactor::new(&c.sensitive_fields))
        .unwrap_or_default()
}

/// `claim` and its `history` as a viewer with `exposure` sees them: the payload masked field
/// by field (its bytes replaced by the masked text), the provider's answer, the last error
/// and every history detail masked as text that may quote it.
pub fn shown_claim(
    config: &Config,
    claim: &mut Claim,
    history: &mut [ClaimEvent],
    exposure: Exposure,
) {
    if exposure == Exposure::Revealed {
        return;
    }
    let r = redactor_for(config, &claim.consumer);
    let secrets = r.secrets(&claim.payload);
    if !claim.payload.is_empty() {
        claim.payload = r.payload(&claim.payload, exposure).into_bytes().into();
    }
    mask_texts(&r, claim, &secrets, exposure);
    for e in history {
        if let Some(d) = &e.detail {
            e.detail = Some(r.text(d, &secrets, exposure));
        }
    }
}

/// Claims of a listing as a viewer with `exposure` sees them: their provider answers and
/// last errors masked (a listing reads no payload).
pub fn shown_claims(config: &Config, claims: &mut [Claim], exposure: Exposure) {
    if exposure == Exposure::Revealed {
        return;
    }
    for c in claims {
        let r = redactor_for(config, &c.consumer);
        mask_texts(&r, c, &[], exposure);
    }
}

fn mask_texts(r: &Redactor, claim: &mut Claim, secrets: &[String], exposure: Exposure) {
    for t in [&mut claim.provider_response, &mut claim.last_error]
        .into_iter()
        .flatten()
    {
        *t = r.text(t, secrets, exposure);
    }
}
