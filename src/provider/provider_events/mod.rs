//! Events the provider sends about effects (webhooks): verified, then matched to claims.
//!
//! - `signature`: `Stripe-Signature` and Standard Webhooks, verified in constant time.
//! - `headers`: the signature headers read without the body (refused before it is read).
//! - `evidence`: whether an event's object names a claim (pure; invariant I9).
//! - `decide`: what an event does to a claim in each state (pure).
//!
//! One delivery, from its bytes to the fenced settle and its record, is the engine's
//! (`crate::engine::provider_event`).

pub mod decide;
pub mod evidence;
pub mod headers;
pub mod scheme;
pub mod settings;
pub mod signature;

pub use settings::ProviderEventsConfig;

use signature::{Scheme, SignatureError, Verifier};

/// A consumer's provider events: its configuration and the verifier built from its secrets.
#[derive(Debug)]
pub struct ProviderEvents {
    /// `[consumers.provider_events]`.
    pub config: ProviderEventsConfig,
    /// The verifier built from `config.secrets`.
    pub verifier: Verifier,
}

impl ProviderEvents {
    /// Builds the verifier; an unusable secret is an error naming its position.
    pub fn new(config: ProviderEventsConfig) -> Result<Self, SignatureError> {
        let verifier = Verifier::new(config.scheme, &config.secrets, config.tolerance.0)?;
        Ok(ProviderEvents { config, verifier })
    }

    /// The signing scheme.
    pub fn scheme(&self) -> Scheme {
        self.config.scheme
    }
}
