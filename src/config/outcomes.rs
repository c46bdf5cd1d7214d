//! `[consumers.outcomes]` (one destination) or `[[consumers.outcomes]]` (several): where a
//! consumer's outcome events go (RabbitMQ, an HTTP endpoint signed with Standard Webhooks, a
//! NATS JetStream subject), checked at load with one-line errors naming the key.

use crate::domain::duration::Dur;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The destination's kind (`kind = "..."`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeKind {
    /// A RabbitMQ exchange, with publisher confirms.
    Amqp,
    /// An HTTP endpoint, each event signed with Standard Webhooks.
    Http,
    /// A NATS subject a JetStream stream takes, each publish acknowledged by the stream.
    Nats,
}

impl OutcomeKind {
    /// The kind as configured (`amqp`, `http`, `nats`): a destination's name when it has none.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Amqp => "amqp",
            OutcomeKind::Http => "http",
            OutcomeKind::Nats => "nats",
        }
    }
}

/// A consumer's outcome destinations as written: one table or an array of tables. A custom
/// deserializer rather than an untagged enum, so that a bad key inside either form is
/// reported by name.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(transparent)]
pub struct OutcomeDestinations(pub Vec<OutcomesConfig>);

impl<'de> Deserialize<'de> for OutcomeDestinations {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct OneOrMany;
        impl<'de> serde::de::Visitor<'de> for OneOrMany {
            type Value = OutcomeDestinations;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a table [consumers.outcomes] or an array [[consumers.outcomes]]")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                let one =
                    OutcomesConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(OutcomeDestinations(vec![one]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Self::Value, A::Error> {
                let many = Vec::<OutcomesConfig>::deserialize(
                    serde::de::value::SeqAccessDeserializer::new(seq),
                )?;
                Ok(OutcomeDestinations(many))
            }
        }
        d.deserialize_any(OneOrMany)
    }
}

/// Most outcome destinations one consumer may have.
pub const MAX_DESTINATIONS: usize = 8;

/// Checks a consumer's destinations and that their names differ: `Err((key, why))` with the
/// key relative to the consumer (`outcomes.url` for one, `outcomes[1].url` for several).
pub fn check_destinations(list: &[OutcomesConfig]) -> Result<(), (String, String)> {
    if list.len() > MAX_DESTINATIONS {
        return Err((
            "outcomes".into(),
            format!("{} destinations; at most {MAX_DESTINATIONS}", list.len()),
        ));
    }
    let at = |i: usize, key: &str| {
        if list.len() == 1 {
            format!("outcomes.{key}")
        } else {
            format!("outcomes[{i}].{key}")
        }
    };
    for (i, o) in list.iter().enumerate() {
        o.check().map_err(|(k, why)| (at(i, k), why))?;
        if let Some(j) = list[..i].iter().position(|p| p.name() == o.name()) {
            let why = if o.name.is_none() {
                format!(
                    "{:?} is the name of destinations {j} and {i} (two of one kind need a name = \"...\")",
                    o.name()
                )
            } else {
                format!("{:?} names two destinations", o.name())
            };
            return Err((at(i, "name"), why));
        }
    }
    Ok(())
}

/// `[consumers.outcomes]`: this consumer's settles write outcome events, and the relay
/// publishes them here.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomesConfig {
    /// `"amqp"`, `"http"` or `"nats"`.
    pub kind: OutcomeKind,
    /// The destination's name (default: its kind): in metrics, the report and the events'
    /// rows. Letters, digits, `-` and `_`, at most 40.
    #[serde(default)]
    pub name: Option<String>,
    /// The broker's URL (`amqp://...`, `nats://...`) or the endpoint's (`https://...`).
    #[serde(skip_serializing)]
    pub url: String,
    /// `amqp`: the exchange (`""`: the default exchange, routing by queue name).
    #[serde(default)]
    pub exchange: String,
    /// `amqp`: the routing key, a template of `{consumer}` and `{state}`
    /// (default `{consumer}.{state}`).
    #[serde(default)]
    pub routing_key: Option<String>,
    /// `amqp`: declare the exchange (durable, `topic`) at start (default true).
    #[serde(default)]
    pub declare: Option<bool>,
    /// `nats`: the subject, a template of `{consumer}` and `{state}` (default
    /// `claimd.outcomes.{consumer}.{state}`); a JetStream stream must take it.
    #[serde(default)]
    pub subject: Option<String>,
    /// `http`: the Standard Webhooks signing secret (`whsec_` + base64). Never shown.
    #[serde(default, skip_serializing)]
    pub secret: Option<String>,
    /// How long one publish or request may take (default 5s).
    #[serde(default = "default_timeout")]
    pub timeout: Dur,
    /// Events taken per round (default 256).
    #[serde(default = "default_batch")]
    pub batch: u32,
    /// How often the relay looks for new events when it found none (default 200ms).
    #[serde(default = "default_poll")]
    pub poll: Dur,
}

fn default_timeout() -> Dur {
    Dur(Duration::from_secs(5))
}
fn default_batch() -> u32 {
    256
}
fn default_poll() -> Dur {
    Dur(Duration::from_millis(200))
}

/// The routing key template when none is given.
pub const DEFAULT_ROUTING_KEY: &str = "{consumer}.{state}";
/// The NATS subject template when none is given.
pub const DEFAULT_SUBJECT: &str = "claimd.outcomes.{consumer}.{state}";

impl OutcomesConfig {
    /// The destination's name: `name`, else its kind.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(self.kind.as_str())
    }

    /// The NATS subject template in force.
    pub fn subject(&self) -> &str {
        self.subject.as_deref().unwrap_or(DEFAULT_SUBJECT)
    }

    /// The routing key template in force.
    pub fn routing_key(&self) -> &str {
        self.routing_key.as_deref().unwrap_or(DEFAULT_ROUTING_KEY)
    }

    /// Checks the keys: `Err((key, why))` with the key relative to the section.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let only = |key: &'static str, kind: &str| {
            Err((
                key,
                format!("only an outcome destination with kind = \"{kind}\" reads it"),
            ))
        };
        if let Some(n) = &self.name {
            let ok = !n.is_empty()
                && n.len() <= 40
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !ok {
                return Err((
                    "name",
                    format!("{n:?}: 1 to 40 letters, digits, '-' and '_'"),
                ));
            }
        }
        if self.kind != OutcomeKind::Nats && self.subject.is_some() {
            return only("subject", "nats");
        }
        match self.kind {
            OutcomeKind::Amqp => {
                if !(self.url.starts_with("amqp://") || self.url.starts_with("amqps://")) {
                    return Err((
                        "url",
                        format!("{:?}: expected amqp:// or amqps://", short(&self.url)),
                    ));
                }
                if self.secret.is_some() {
                    return only("secret", "http");
                }
                check_template(self.routing_key()).map_err(|why| ("routing_key", why))?;
            }
            OutcomeKind::Http => {
                let url = reqwest::Url::parse(&self.url)
                    .map_err(|e| ("url", format!("{:?}: {e}", short(&self.url))))?;
                if !matches!(url.scheme(), "http" | "https") {
                    return Err(("url", "expected http:// or https://".into()));
                }
                if !self.exchange.is_empty() {
                    return only("exchange", "amqp");
                }
                if self.routing_key.is_some() {
                    return only("routing_key", "amqp");
                }
                if self.declare.is_some() {
                    return only("declare", "amqp");
                }
                let secret = self.secret.as_deref().unwrap_or_default();
                crate::provider::provider_events::signature::sign_standard(secret, "check", 0, b"")
                    .map_err(|e| {
                        (
                            "secret",
                            format!("{e} (Standard Webhooks: whsec_ + base64)"),
                        )
                    })?;
            }
            OutcomeKind::Nats => {
                if !(self.url.starts_with("nats://") || self.url.starts_with("tls://")) {
                    return Err((
                        "url",
                        format!("{:?}: expected nats:// or tls://", short(&self.url)),
                    ));
                }
                for (key, set) in [
                    ("exchange", !self.exchange.is_empty()),
                    ("routing_key", self.routing_key.is_some()),
                    ("declare", self.declare.is_some()),
                ] {
                    if set {
                        return only(key, "amqp");
                    }
                }
                if self.secret.is_some() {
                    return only("secret", "http");
                }
                check_template(self.subject()).map_err(|why| ("subject", why))?;
                let bad = |c: char| c.is_whitespace() || c == '*' || c == '>';
                if self.subject().chars().any(bad) || self.subject().split('.').any(str::is_empty) {
                    return Err((
                        "subject",
                        format!(
                            "{:?}: a NATS subject has no spaces, wildcards or empty tokens",
                            self.subject()
                        ),
                    ));
                }
            }
        }
        if self.batch == 0 || self.batch > 1000 {
            return Err(("batch", "must be 1 to 1000".into()));
        }
        if self.timeout.0.is_zero() {
            return Err(("timeout", "must be more than 0".into()));
        }
        if self.poll.0.is_zero() {
            return Err(("poll", "must be more than 0".into()));
        }
        Ok(())
    }
}

/// A URL as an error shows it: without what may be a password.
fn short(url: &str) -> String {
    crate::store::redact_url(url)
}

/// A routing key template names only `{consumer}` and `{state}`.
fn check_template(template: &str) -> Result<(), String> {
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            return Err(format!("{template:?}: a '{{' is not closed"));
        };
        let name = &rest[open + 1..open + close];
        if !matches!(name, "consumer" | "state") {
            return Err(format!(
                "{template:?}: unknown field {{{name}}} (use {{consumer}} and {{state}})"
            ));
        }
        rest = &rest[open + close + 1..];
    }
    if template.len() > 200 {
        return Err("longer than 200 characters".into());
    }
    Ok(())
}

/// The routing key of an event: `template` with `{consumer}` and `{state}` filled in.
pub fn render_routing_key(template: &str, consumer: &str, state: &str) -> String {
    template
        .replace("{consumer}", consumer)
        .replace("{state}", state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amqp(routing_key: &str) -> OutcomesConfig {
        OutcomesConfig {
            kind: OutcomeKind::Amqp,
            name: None,
            subject: None,
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            exchange: "payments".into(),
            routing_key: Some(routing_key.into()),
            declare: None,
            secret: None,
            timeout: default_timeout(),
            batch: 256,
            poll: default_poll(),
        }
    }

    #[test]
    fn a_routing_key_names_only_consumer_and_state() {
        assert!(amqp("payments.{state}").check().is_ok());
        let (key, why) = amqp("payments.{tenant}").check().unwrap_err();
        assert_eq!(key, "routing_key");
        assert!(why.contains("{tenant}"), "{why}");
        assert_eq!(
            render_routing_key("{consumer}.{state}", "pay", "completed"),
            "pay.completed"
        );
    }

    #[test]
    fn keys_of_the_other_kind_and_bad_secrets_are_refused() {
        let mut c = amqp("x");
        c.secret = Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into());
        assert_eq!(c.check().unwrap_err().0, "secret");
        let mut h = amqp("x");
        h.kind = OutcomeKind::Http;
        h.url = "http://127.0.0.1:9/hook".into();
        h.routing_key = None;
        h.exchange = String::new();
        h.secret = Some("not base64!".into());
        assert_eq!(h.check().unwrap_err().0, "secret");
        h.secret = Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into());
        assert!(h.check().is_ok());
    }

    #[test]
    fn destinations_are_named_by_kind_unless_named_and_names_differ() {
        let hook = |name: Option<&str>| OutcomesConfig {
            kind: OutcomeKind::Http,
            name: name.map(str::to_string),
            url: "http://127.0.0.1:9/hook".into(),
            exchange: String::new(),
            routing_key: None,
            declare: None,
            subject: None,
            secret: Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()),
            timeout: default_timeout(),
            batch: 256,
            poll: default_poll(),
        };
        let two = [amqp("x"), hook(None)];
        assert!(check_destinations(&two).is_ok());
        assert_eq!(two[1].name(), "http");
        let (key, why) = check_destinations(&[hook(None), hook(None)]).unwrap_err();
        assert_eq!(key, "outcomes[1].name");
        assert!(why.contains("need a name"), "{why}");
        assert!(check_destinations(&[hook(Some("a")), hook(Some("b"))]).is_ok());
        let (key, _) = check_destinations(&[hook(Some("no spaces"))]).unwrap_err();
        assert_eq!(key, "outcomes.name");
    }

    #[test]
    fn a_nats_subject_is_a_template_without_wildcards() {
        let mut n = amqp("x");
        n.kind = OutcomeKind::Nats;
        n.url = "nats://127.0.0.1:4222".into();
        n.routing_key = None;
        n.exchange = String::new();
        assert!(n.check().is_ok(), "{:?}", n.check());
        assert_eq!(n.subject(), DEFAULT_SUBJECT);
        n.subject = Some("out.>".into());
        assert_eq!(n.check().unwrap_err().0, "subject");
        n.subject = Some("out..{state}".into());
        assert_eq!(n.check().unwrap_err().0, "subject");
        n.subject = Some("out.{tenant}".into());
        assert_eq!(n.check().unwrap_err().0, "subject");
    }
}
