//! The provider side: effects (HTTP, SMTP, programs' own), status lookups and reading outcomes
//! by value, provider events (webhooks: signatures and the evidence they carry), the TLS
//! provider every client uses, and the built-in sandbox provider. Uses the domain and the
//! store; knows nothing of the engine that drives it.

pub mod effect;
pub mod provider_events;
pub mod sandbox;
pub mod tls;
