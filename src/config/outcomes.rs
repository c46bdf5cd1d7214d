//! `[consumers.outcomes]`: where a consumer's outcome events go (RabbitMQ or an HTTP endpoint
//! signed with Standard Webhooks), checked at load with one-line errors naming the key.

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
}

/// `[consumers.outcomes]`: this consumer's settles write outcome events, and the relay
/// publishes them here.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomesConfig {
    /// `"amqp"` or `"http"`.
    pub kind: OutcomeKind,
    /// The broker's URL (`amqp://...`) or the endpoint's (`https://...`).
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

impl OutcomesConfig {
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
}
