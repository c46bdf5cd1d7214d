//! `[consumers.provider_events]`: how a consumer's provider events are verified and read.

use crate::domain::duration::Dur;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[consumers.provider_events]`: where the provider's events are verified and how they are
/// read. The event's object is read with the effect's `[effect.outcome]` (which it needs).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderEventsConfig {
    /// `"stripe"` (`Stripe-Signature`) or `"standard"` (Standard Webhooks).
    pub scheme: super::signature::Scheme,
    /// Signing secrets; any one may match (two while one is rotated). Never shown.
    #[serde(skip_serializing)]
    pub secrets: Vec<String>,
    /// How far the event's signed timestamp may be from now, either way (default 5m): an
    /// older delivery is refused as stale, however well signed. At most 1h, and less than
    /// half of `[retention] keep_terminal_for` (checked at load).
    #[serde(default = "default_event_tolerance")]
    pub tolerance: Dur,
    /// The largest event body taken (default 256 KiB; `[http] max_body_bytes` applies too);
    /// larger is refused `413` before or while it is read.
    #[serde(default = "default_event_max_body_bytes")]
    pub max_body_bytes: usize,
    /// A JSON pointer to the object the event is about (default `/data/object`, Stripe's).
    #[serde(default = "default_object_pointer")]
    pub object_pointer: String,
    /// A JSON pointer to the event's id (default `/id`). Standard Webhooks' `webhook-id`
    /// header is used when it is there.
    #[serde(default = "default_event_id_pointer")]
    pub event_id_pointer: String,
    /// A JSON pointer to the event's type (default `/type`).
    #[serde(default = "default_type_pointer")]
    pub type_pointer: String,
    /// The event types taken; others are answered `200` and ignored. Empty: all.
    #[serde(default)]
    pub types: Vec<String>,
    /// A JSON pointer, within the object, to the message id it carries (in the provider's
    /// metadata, like `/metadata/claimd_message_id`): with the tenant and the consumer, names
    /// a claim whose provider id is not known yet (its answer was lost, or its call is in
    /// flight). Empty: not read.
    #[serde(default)]
    pub message_id_pointer: String,
    /// The same for the tenant. Empty: not read (then only a key with `{tenant}` read at
    /// `key_pointer` names a tenant, never a default `""`); set, an object without the field is
    /// a tenant-less message's.
    #[serde(default)]
    pub tenant_pointer: String,
    /// The same for the consumer's name. Empty: not read (then only a key with `{consumer}`
    /// read at `key_pointer` binds an object to this consumer).
    #[serde(default)]
    pub consumer_pointer: String,
    /// A JSON pointer, within the object, to the claim's rendered idempotency key (like
    /// `/metadata/claimd_key`): names the message id, and the tenant and consumer when the
    /// key template has them. Empty: not read. Without any of these pointers only the
    /// provider's object id names a claim.
    #[serde(default)]
    pub key_pointer: String,
}

impl ProviderEventsConfig {
    /// Whether an object can name a claim by its key (some pointer to it is set), not only by
    /// the provider's object id.
    pub fn reads_keys(&self) -> bool {
        !(self.message_id_pointer.is_empty() && self.key_pointer.is_empty())
    }
}

fn default_event_tolerance() -> Dur {
    Dur(Duration::from_secs(300))
}
fn default_event_max_body_bytes() -> usize {
    256 * 1024
}
fn default_object_pointer() -> String {
    "/data/object".into()
}
fn default_event_id_pointer() -> String {
    "/id".into()
}
fn default_type_pointer() -> String {
    "/type".into()
}
