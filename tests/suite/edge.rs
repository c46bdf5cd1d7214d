//! What a hostile client and a tired operator meet at claimd's edges, over real sockets and
//! the real binary: every refusal is a clear 4xx (or exit 2) that names the mistake, and
//! nothing acknowledged changes or grows. By role: `provider_event_bodies` (the provider-event
//! body budget, refusal before reading), `waiters` (`Prefer: wait` cap, probes outside the
//! connection cap), `url_templates` (dot segments, fields in scheme/host), `bad_input` (input
//! PostgreSQL cannot store answers 400 on both stores; bounded search), `operators` (mistyped
//! consumers, read-only commands without provider secrets, pasted commands), `tenant_tokens`
//! (what the intake token may read).

#[path = "edge/bad_input.rs"]
mod bad_input;
#[path = "edge/operators.rs"]
mod operators;
#[path = "edge/provider_event_bodies.rs"]
mod provider_event_bodies;
#[path = "edge/rejections.rs"]
mod rejections;
#[path = "edge/tenant_tokens.rs"]
mod tenant_tokens;
#[path = "edge/url_templates.rs"]
mod url_templates;
#[path = "edge/waiters.rs"]
mod waiters;

// The children reach the shared helpers as `super::common`.
use crate::common;
