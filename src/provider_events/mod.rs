//! Events the provider sends about effects (webhooks): verified, then matched to claims.
//!
//! - `signature`: `Stripe-Signature` and Standard Webhooks, verified in constant time.
//! - `headers`: the signature headers read without the body (refused before it is read).
//! - `evidence`: whether an event's object names a claim (pure; invariant I9).
//! - `decide`: what an event does to a claim in each state (pure).
//! - `receive`: one delivery, from its bytes to the fenced settle and its record.

pub mod decide;
pub mod evidence;
pub mod headers;
pub mod receive;
pub mod scheme;
pub mod signature;

pub use receive::{Answer, ProviderEvents, receive};
