//! What the signature schemes share: which scheme a provider uses, why a delivery is refused,
//! the bounds on signature headers, and the base64 providers sign with. Both the early check of
//! a delivery's headers ([`super::headers`]) and the verifier ([`super::signature`]) use it.

use base64::Engine as _;

/// The longest signature header accepted, in bytes.
pub const MAX_SIGNATURE_HEADER_BYTES: usize = 8 * 1024;
/// The most entries a signature header may have (Stripe: `t=` included).
pub const MAX_SIGNATURE_ENTRIES: usize = 16;

/// Which signing scheme a provider uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// Stripe's `Stripe-Signature` header.
    Stripe,
    /// Standard Webhooks' `webhook-id`, `webhook-timestamp` and `webhook-signature` headers.
    Standard,
}

/// Why a delivery (or a secret) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A header the scheme needs is missing; its name.
    #[error("unsigned: no {0} header")]
    Unsigned(&'static str),
    /// A header is present but cannot be read; what is wrong with it.
    #[error("malformed signature: {0}")]
    Malformed(String),
    /// The signed timestamp is older than the tolerance.
    #[error("stale signature: signed {age_s} s ago, past the {tolerance_s} s tolerance")]
    Stale {
        /// How long ago it was signed, in seconds.
        age_s: i64,
        /// The tolerance, in seconds.
        tolerance_s: i64,
    },
    /// The signed timestamp is further in the future than the tolerance.
    #[error(
        "signature from the future: signed {ahead_s} s ahead, past the {tolerance_s} s tolerance"
    )]
    Future {
        /// How far ahead of now it was signed, in seconds.
        ahead_s: i64,
        /// The tolerance, in seconds.
        tolerance_s: i64,
    },
    /// No signature in the headers matched any secret.
    #[error("no signature matched any secret")]
    Mismatch,
    /// A secret given to [`Verifier::new`](super::signature::Verifier::new) (or [`sign_standard`](super::signature::sign_standard)) cannot be used; which one and
    /// why, never its text.
    #[error("bad webhook secret: {0}")]
    BadSecret(String),
}

impl SignatureError {
    /// The HTTP status to answer the delivery with: 400 for what the sender got wrong in form
    /// or time, 401 for what is not authenticated, 500 for our own configuration.
    pub fn status(&self) -> u16 {
        match self {
            SignatureError::Malformed(_)
            | SignatureError::Stale { .. }
            | SignatureError::Future { .. } => 400,
            SignatureError::Unsigned(_) | SignatureError::Mismatch => 401,
            SignatureError::BadSecret(_) => 500,
        }
    }
}

/// Standard base64 as providers and Python's `base64.b64decode` use it: padding optional (but
/// canonical when present), unused low bits of the last character ignored.
pub(super) const B64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Standard base64, padded or not; `None` when it does not decode. Padding, when present, must
/// complete the last quantum (as Python's decoder requires; the crate would take `AA=`).
pub(super) fn b64_decode(text: &str) -> Option<Vec<u8>> {
    if text.ends_with('=') && !text.len().is_multiple_of(4) {
        return None;
    }
    B64.decode(text).ok()
}
