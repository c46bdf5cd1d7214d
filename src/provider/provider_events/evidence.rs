//! Whether a provider event's object names a claim (invariant I9): pure, so every way an
//! object can look like a claim without being its evidence is tested here.
//!
//! A claim that knows its provider object id is named only by that id. A claim that does not
//! know it yet (its answer was lost, or its call is still in flight) is named only by its full
//! key carried in the object: the message id, the tenant and the consumer, each either in the
//! rendered idempotency key (`key_pointer`) or in a field of its own (`message_id_pointer`,
//! `tenant_pointer`, `consumer_pointer`). Anything less (the same order number, the same message
//! id of another tenant or consumer) is a look-alike: recorded, never applied.

/// The claim's side: who it is and what it already knows.
#[derive(Debug, Clone, Copy)]
pub struct ClaimSide<'a> {
    /// The provider's id of its object, once known.
    pub provider_id: Option<&'a str>,
    /// Consumer name.
    pub consumer: &'a str,
    /// Tenant (`""`: none).
    pub tenant: &'a str,
    /// Message id.
    pub message_id: &'a str,
    /// The idempotency key rendered when the claim was made.
    pub key: &'a str,
    /// Whether the consumer's key template contains `{tenant}` (it may have tenants).
    pub key_has_tenant: bool,
    /// Whether the consumer's key template contains `{consumer}`.
    pub key_has_consumer: bool,
}

/// What the event's object carries, read through the configured pointers. `None`: the pointer
/// is not configured, or the object has no text there.
#[derive(Debug, Clone, Copy, Default)]
pub struct Carried<'a> {
    /// The object's id (the effect's `outcome.id_pointer`).
    pub object_id: Option<&'a str>,
    /// The rendered claim key (`key_pointer`).
    pub key: Option<&'a str>,
    /// The message id (`message_id_pointer`).
    pub message_id: Option<&'a str>,
    /// The tenant (`tenant_pointer`); see [`Carried::tenant_read`].
    pub tenant: Option<&'a str>,
    /// Whether `tenant_pointer` is configured: then an object without the field is a
    /// tenant-less message's (a provider drops empty metadata values).
    pub tenant_read: bool,
    /// The consumer (`consumer_pointer`).
    pub consumer: Option<&'a str>,
}

/// Whether the object names the claim, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// It names the claim by the provider id the claim already holds.
    ById,
    /// The claim holds no provider id yet and the object carries its full key.
    ByKey,
    /// The object carries this claim's full key, but the claim already holds another provider
    /// id: a second object for one claim. Never applied; the claim's id is never replaced.
    OtherObject,
    /// The object does not carry this claim's full key: another object, tenant or consumer
    /// that looks alike (or not enough evidence to tell).
    Foreign(Mismatch),
}

/// What is missing or different when an object does not name a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// Its id is not the claim's provider id, and it does not carry the claim's key.
    Object,
    /// The message id (or the key) it carries is another claim's.
    Message,
    /// The tenant it carries is another one, or it carries none where the claim needs one.
    Tenant,
    /// The consumer it carries is another one, or nothing binds it to this consumer.
    Consumer,
}

impl Naming {
    /// Whether the event may decide the claim.
    pub fn applies(self) -> bool {
        matches!(self, Naming::ById | Naming::ByKey)
    }

    /// The result name in answers, `provider_events` and metrics for an event not applied.
    pub fn result(self) -> &'static str {
        match self {
            Naming::ById | Naming::ByKey => "settled",
            Naming::OtherObject => "other_object",
            Naming::Foreign(_) => "foreign_object",
        }
    }

    /// Why an event was not applied, for logs and the claim's history.
    pub fn why(self) -> &'static str {
        match self {
            Naming::ById | Naming::ByKey => "it names this claim",
            Naming::OtherObject => {
                "it carries this claim's key but the claim already holds another provider object id"
            }
            Naming::Foreign(Mismatch::Object) => "its object id is not this claim's",
            Naming::Foreign(Mismatch::Message) => "it carries another message id or key",
            Naming::Foreign(Mismatch::Tenant) => "it does not carry this claim's tenant",
            Naming::Foreign(Mismatch::Consumer) => "nothing in it binds it to this consumer",
        }
    }
}

/// Whether `carried` names `claim` (I9).
pub fn names(claim: &ClaimSide, carried: &Carried) -> Naming {
    let full_key = carries_full_key(claim, carried);
    if let Some(known) = claim.provider_id {
        return match (carried.object_id, full_key) {
            (Some(id), _) if id == known => Naming::ById,
            (_, Ok(())) => Naming::OtherObject,
            (_, Err(_)) => Naming::Foreign(Mismatch::Object),
        };
    }
    match full_key {
        Ok(()) => Naming::ByKey,
        Err(m) => Naming::Foreign(m),
    }
}

/// The object carries the claim's message id, tenant and consumer, and nothing it carries
/// contradicts them.
fn carries_full_key(claim: &ClaimSide, carried: &Carried) -> Result<(), Mismatch> {
    let key_matches = match carried.key {
        Some(k) if k == claim.key => true,
        Some(_) => return Err(Mismatch::Message),
        None => false,
    };
    match carried.message_id {
        Some(m) if m != claim.message_id => return Err(Mismatch::Message),
        Some(_) => {}
        None if !key_matches => return Err(Mismatch::Message),
        None => {}
    }
    let carried_tenant = match carried.tenant {
        Some(t) => Some(t),
        None if carried.tenant_read => Some(""),
        None => None,
    };
    match carried_tenant {
        Some(t) if t != claim.tenant => return Err(Mismatch::Tenant),
        Some(_) => {}
        // The key names the tenant when the template has one; a template without `{tenant}`
        // only ever has tenant-less claims. Otherwise the tenant is unknown: never `""`.
        None if claim.key_has_tenant && !key_matches => return Err(Mismatch::Tenant),
        None => {}
    }
    match carried.consumer {
        Some(c) if c != claim.consumer => Err(Mismatch::Consumer),
        Some(_) => Ok(()),
        None if key_matches && claim.key_has_consumer => Ok(()),
        None => Err(Mismatch::Consumer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLAIM: ClaimSide<'static> = ClaimSide {
        provider_id: None,
        consumer: "pay",
        tenant: "",
        message_id: "1001",
        key: "pay::1001",
        key_has_tenant: true,
        key_has_consumer: true,
    };

    fn by_key(key: &'static str) -> Carried<'static> {
        Carried {
            object_id: Some("pi_other"),
            key: Some(key),
            message_id: Some("1001"),
            ..Carried::default()
        }
    }

    #[test]
    fn a_known_provider_id_is_the_only_name() {
        let claim = ClaimSide {
            provider_id: Some("pi_own"),
            ..CLAIM
        };
        let own = Carried {
            object_id: Some("pi_own"),
            ..Carried::default()
        };
        assert_eq!(names(&claim, &own), Naming::ById);
        // The same order number on another object.
        let other = Carried {
            object_id: Some("pi_other"),
            message_id: Some("1001"),
            ..Carried::default()
        };
        assert_eq!(names(&claim, &other), Naming::Foreign(Mismatch::Object));
        // Even this claim's full key on another object does not replace the id.
        assert_eq!(names(&claim, &by_key("pay::1001")), Naming::OtherObject);
        assert!(!Naming::OtherObject.applies());
    }

    #[test]
    fn without_a_provider_id_only_the_full_key_names_the_claim() {
        assert_eq!(names(&CLAIM, &by_key("pay::1001")), Naming::ByKey);
        // Another consumer's or tenant's key, with the same message id.
        assert_eq!(
            names(&CLAIM, &by_key("shop::1001")),
            Naming::Foreign(Mismatch::Message)
        );
        assert_eq!(
            names(&CLAIM, &by_key("pay:acme:1001")),
            Naming::Foreign(Mismatch::Message)
        );
        // The message id alone: neither tenant nor consumer is known.
        let order_number = Carried {
            object_id: Some("pi_other"),
            message_id: Some("1001"),
            ..Carried::default()
        };
        assert_eq!(
            names(&CLAIM, &order_number),
            Naming::Foreign(Mismatch::Tenant)
        );
    }

    #[test]
    fn the_tenant_is_never_assumed_empty() {
        // A tenant pointer that reads another tenant.
        let other_tenant = Carried {
            message_id: Some("1001"),
            tenant: Some("acme"),
            tenant_read: true,
            consumer: Some("pay"),
            ..Carried::default()
        };
        assert_eq!(
            names(&CLAIM, &other_tenant),
            Naming::Foreign(Mismatch::Tenant)
        );
        // A configured pointer whose field is absent: a tenant-less message's object.
        let no_field = Carried {
            tenant: None,
            ..other_tenant
        };
        assert_eq!(names(&CLAIM, &no_field), Naming::ByKey);
        // No tenant pointer at all, for a consumer with tenants: unknown, not "".
        let unread = Carried {
            tenant_read: false,
            ..no_field
        };
        assert_eq!(names(&CLAIM, &unread), Naming::Foreign(Mismatch::Tenant));
        // A consumer whose key has no {tenant} has only tenant-less claims.
        let plain = ClaimSide {
            key_has_tenant: false,
            key: "pay:1001",
            ..CLAIM
        };
        assert_eq!(names(&plain, &unread), Naming::ByKey);
    }

    #[test]
    fn something_must_bind_the_object_to_this_consumer() {
        let fields = Carried {
            message_id: Some("1001"),
            tenant_read: true,
            ..Carried::default()
        };
        assert_eq!(names(&CLAIM, &fields), Naming::Foreign(Mismatch::Consumer));
        let other = Carried {
            consumer: Some("shop"),
            ..fields
        };
        assert_eq!(names(&CLAIM, &other), Naming::Foreign(Mismatch::Consumer));
        // A key without {consumer} does not bind it either.
        let unbound = ClaimSide {
            key_has_consumer: false,
            key: ":1001",
            ..CLAIM
        };
        assert_eq!(
            names(&unbound, &by_key(":1001")),
            Naming::Foreign(Mismatch::Consumer)
        );
    }

    #[test]
    fn a_contradicting_field_beats_a_matching_key() {
        let mixed = Carried {
            message_id: Some("1002"),
            ..by_key("pay::1001")
        };
        assert_eq!(names(&CLAIM, &mixed), Naming::Foreign(Mismatch::Message));
        let mixed = Carried {
            consumer: Some("shop"),
            ..by_key("pay::1001")
        };
        assert_eq!(names(&CLAIM, &mixed), Naming::Foreign(Mismatch::Consumer));
    }
}
