//! Where a consumer's messages come from (`source = "..."`) and the keys each source reads.

use crate::domain::duration::Dur;
use serde::{Deserialize, Serialize};

/// Where a consumer's messages come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// `POST /v1/messages/{consumer}`.
    Http,
    /// A RabbitMQ queue.
    Amqp,
    /// A NATS JetStream stream, read by a durable pull consumer.
    Nats,
}

/// Where a consumer's messages come from (`source = "..."`), with that source's keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "lowercase")]
pub enum SourceConfig {
    /// `POST /v1/messages/{consumer}`.
    Http,
    /// A RabbitMQ queue.
    Amqp(AmqpSourceConfig),
    /// A NATS JetStream stream.
    Nats(NatsSourceConfig),
}

impl SourceConfig {
    /// The `source` value that selects this variant.
    pub fn kind(&self) -> Source {
        match self {
            SourceConfig::Http => Source::Http,
            SourceConfig::Amqp(_) => Source::Amqp,
            SourceConfig::Nats(_) => Source::Nats,
        }
    }
}

/// The keys of a consumer with `source = "amqp"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AmqpSourceConfig {
    /// RabbitMQ URL (`amqp_url`).
    #[serde(rename = "amqp_url")]
    pub url: String,
    /// The work queue.
    pub queue: String,
    /// Unacknowledged deliveries at once.
    pub prefetch: u16,
    /// Where bad broker messages go.
    pub dead_letter_exchange: String,
    /// Declare exchange and queues at start.
    pub declare: bool,
    /// Header that overrides the AMQP `message_id` property (empty: the property).
    pub message_id_header: String,
}

/// The keys of a consumer with `source = "nats"` (docs/nats.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NatsSourceConfig {
    /// NATS server URL (`nats_url`, `nats://host:4222`).
    #[serde(rename = "nats_url")]
    pub url: String,
    /// The JetStream stream the messages are in.
    pub stream: String,
    /// The subject (wildcards allowed) the stream takes and the consumer reads.
    pub subject: String,
    /// The durable consumer's name (default `claimd-<consumer>`).
    pub durable: String,
    /// Where bad messages go (a subject a stream takes: a publish is confirmed by a stream).
    pub dead_letter_subject: String,
    /// Deliveries of one message without an acknowledgement (claimd stopped or killed while
    /// holding it) after which it is dead-lettered (`delivery_limit`) instead of tried again.
    pub max_deliver: u32,
    /// How long the server waits for an acknowledgement before it redelivers; claimd reports
    /// progress while it holds a message, so this bounds only how soon a killed worker's
    /// messages come back.
    pub ack_wait: Dur,
    /// Unacknowledged messages at once (the consumer's `max_ack_pending`).
    pub prefetch: u16,
    /// Create the stream (if missing) and the durable consumer at start.
    pub declare: bool,
    /// The header carrying the message id (default `Nats-Msg-Id`).
    pub message_id_header: String,
}

/// The word a `source` value is written as.
pub(super) fn source_name(s: Source) -> &'static str {
    match s {
        Source::Http => "http",
        Source::Amqp => "amqp",
        Source::Nats => "nats",
    }
}

impl NatsSourceConfig {
    /// Checks the keys of a `source = "nats"` consumer: `Err((key, why))`.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        for (k, v) in [
            ("nats_url", &self.url),
            ("stream", &self.stream),
            ("subject", &self.subject),
        ] {
            if v.is_empty() {
                return Err((k, "required when source = \"nats\"".into()));
            }
        }
        if !(self.url.starts_with("nats://") || self.url.starts_with("tls://")) {
            return Err((
                "nats_url",
                format!(
                    "{:?}: expected nats://host:port or tls://host:port",
                    crate::store::redact_url(&self.url)
                ),
            ));
        }
        for (k, v) in [("stream", &self.stream), ("durable", &self.durable)] {
            check_name(v).map_err(|why| (k, format!("{v:?}: {why}")))?;
        }
        check_subject(&self.subject, true).map_err(|why| ("subject", why))?;
        if self.dead_letter_subject.is_empty() {
            return Err((
                "dead_letter_subject",
                "required when source = \"nats\": bad messages need a place to go".into(),
            ));
        }
        check_subject(&self.dead_letter_subject, false)
            .map_err(|why| ("dead_letter_subject", why))?;
        if subject_matches(&self.subject, &self.dead_letter_subject) {
            return Err((
                "dead_letter_subject",
                format!(
                    "{:?} is matched by subject {:?}: dead letters would come back to this consumer",
                    self.dead_letter_subject, self.subject
                ),
            ));
        }
        if self.prefetch == 0 {
            return Err(("prefetch", "must be at least 1".into()));
        }
        if self.max_deliver == 0 {
            return Err((
                "max_deliver",
                "must be at least 1 (the first delivery)".into(),
            ));
        }
        if self.ack_wait.0 < std::time::Duration::from_secs(1) {
            return Err(("ack_wait", format!("{} is under 1s", self.ack_wait)));
        }
        if self.message_id_header.is_empty() {
            return Err((
                "message_id_header",
                "must name a header (default Nats-Msg-Id): NATS has no id of its own".into(),
            ));
        }
        Ok(())
    }
}

/// A stream or durable consumer name as JetStream accepts it.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 200 {
        return Err("at most 200 bytes".into());
    }
    match name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || ".*>/\\".contains(*c))
    {
        Some(c) => Err(format!("{c:?} is not allowed in a JetStream name")),
        None => Ok(()),
    }
}

/// A NATS subject: dot-separated non-empty tokens without spaces; with `wildcards`, a token
/// may be `*` (one token) and the last may be `>` (the rest).
fn check_subject(subject: &str, wildcards: bool) -> Result<(), String> {
    let tokens: Vec<&str> = subject.split('.').collect();
    for (i, t) in tokens.iter().enumerate() {
        if t.is_empty() {
            return Err(format!("{subject:?}: a subject has no empty tokens"));
        }
        if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "{subject:?}: a subject has no spaces or control characters"
            ));
        }
        let wild = *t == "*" || *t == ">";
        if wild && !wildcards {
            return Err(format!(
                "{subject:?}: must be one subject, without wildcards"
            ));
        }
        if *t == ">" && i + 1 != tokens.len() {
            return Err(format!("{subject:?}: \">\" may only be the last token"));
        }
    }
    Ok(())
}

/// Whether the subject `pattern` (with `*` and `>` wildcards) matches the literal `subject`.
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_match_as_nats_matches_them() {
        assert!(subject_matches("orders.>", "orders.a.b"));
        assert!(!subject_matches("orders.>", "orders"));
        assert!(subject_matches("orders.*", "orders.a"));
        assert!(!subject_matches("orders.*", "orders.a.b"));
        assert!(subject_matches("orders", "orders"));
        assert!(!subject_matches("orders", "orders.dead"));
        assert!(subject_matches("*.dead", "orders.dead"));
        assert!(subject_matches(">", "x"));
    }

    #[test]
    fn subjects_and_names_are_checked() {
        assert!(check_subject("a.b.>", true).is_ok());
        assert!(check_subject("a.>.b", true).is_err());
        assert!(check_subject("a..b", true).is_err());
        assert!(check_subject("a.*", false).is_err());
        assert!(check_subject("a b", false).is_err());
        assert!(check_name("ORDERS").is_ok());
        assert!(check_name("a.b").is_err());
        assert!(check_name("").is_err());
    }
}
