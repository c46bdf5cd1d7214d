//! `[consumers.effect]`: the settings of each kind of effect (HTTP, SMTP, a program's own),
//! kept beside the effects that read them; `crate::config` re-exports them.

mod http;
mod ledger;

pub use http::*;
pub use ledger::LedgerConfig;

use crate::domain::duration::Dur;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// `[consumers.effect]`, selected by `kind`. Read by hand rather than as a serde-tagged enum:
/// a tagged enum buffers the table and its errors lose the field (`consumers[0].effect:
/// invalid duration`); this one names it (`consumers[0].effect: timeout: invalid duration`).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
// Read once per consumer at load and kept beside it: boxing the HTTP variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum EffectConfig {
    /// An HTTP call to the provider.
    Http(HttpEffectConfig),
    /// An email over SMTP.
    Smtp(SmtpEffectConfig),
    /// An effect the program embedding claimd supplies (`WorkerBuilder::effect`).
    Custom(CustomEffectConfig),
    /// A SQL statement run in the transaction that settles the claim.
    Sql(SqlEffectConfig),
}

impl<'de> Deserialize<'de> for EffectConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(d)?;
        let kind = match table.remove("kind") {
            Some(toml::Value::String(k)) => k,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "kind = {other}: expected \"http\", \"smtp\", \"sql\" or \"custom\""
                )));
            }
            None => return Err(D::Error::missing_field("kind")),
        };
        fn variant<T: serde::de::DeserializeOwned, E: Error>(t: toml::Table) -> Result<T, E> {
            serde_path_to_error::deserialize(toml::Value::Table(t)).map_err(|e| {
                let at = e.path().to_string();
                let why = e.into_inner().to_string();
                E::custom(if at == "." {
                    why
                } else {
                    format!("{at}: {why}")
                })
            })
        }
        match kind.as_str() {
            "http" => variant(table).map(EffectConfig::Http),
            "smtp" => variant(table).map(EffectConfig::Smtp),
            "custom" => variant(table).map(EffectConfig::Custom),
            "sql" => variant(table).map(EffectConfig::Sql),
            other => Err(D::Error::unknown_variant(
                other,
                &["http", "smtp", "sql", "custom"],
            )),
        }
    }
}

impl EffectConfig {
    /// The effect's kind, as the configuration names it (`kind = "http"`).
    pub fn kind(&self) -> &'static str {
        match self {
            EffectConfig::Http(_) => "http",
            EffectConfig::Smtp(_) => "smtp",
            EffectConfig::Custom(_) => "custom",
            EffectConfig::Sql(_) => "sql",
        }
    }

    /// Where its calls go, as traces name it: `https://host:port` of an HTTP provider's URL
    /// (its path, which may carry message values, left out), `smtp://host:port`, `sql` or
    /// `custom`.
    pub fn destination(&self) -> String {
        match self {
            EffectConfig::Http(h) => origin_of(&h.url),
            EffectConfig::Smtp(s) => format!("smtp://{}:{}", s.host, s.port),
            EffectConfig::Custom(_) => "custom".into(),
            EffectConfig::Sql(_) => "sql".into(),
        }
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        match self {
            EffectConfig::Http(h) => h.timeout.0,
            EffectConfig::Smtp(s) => s.timeout.0,
            EffectConfig::Custom(c) => c.timeout.0,
            EffectConfig::Sql(q) => q.timeout.0,
        }
    }

    /// The longest idempotency key the provider accepts.
    pub fn max_key_length(&self) -> usize {
        match self {
            EffectConfig::Http(h) => h.max_key_length,
            EffectConfig::Smtp(s) => s.max_key_length,
            EffectConfig::Custom(c) => c.max_key_length,
            EffectConfig::Sql(_) => default_max_key_length(),
        }
    }

    /// The calls' ceiling per second (`rate_limit`), its key template (`rate_limit_key`) and
    /// how many keys' paces are kept (`rate_limit_keys`).
    pub fn rate_limits(&self) -> (Option<f64>, Option<&str>, Option<usize>) {
        match self {
            EffectConfig::Http(h) => (
                h.rate_limit.map(|r| r.per_second),
                h.rate_limit_key.as_deref(),
                h.rate_limit_keys,
            ),
            EffectConfig::Custom(c) => (
                c.rate_limit.map(|r| r.per_second),
                c.rate_limit_key.as_deref(),
                c.rate_limit_keys,
            ),
            EffectConfig::Smtp(_) | EffectConfig::Sql(_) => (None, None, None),
        }
    }
}

/// `kind = "http"`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpEffectConfig {
    /// HTTP method.
    #[serde(default = "default_method")]
    pub method: String,
    /// Provider URL.
    pub url: String,
    /// Header that carries the idempotency key.
    #[serde(default = "default_idem_header")]
    pub idempotency_header: String,
    /// Per-request timeout.
    #[serde(default = "default_timeout")]
    pub timeout: Dur,
    /// The HTTP version spoken to the provider: `"1.1"` (the default) or `"2"`.
    #[serde(default)]
    pub http_version: HttpVersion,
    /// Extra headers (secrets allowed via `${VAR}`; never logged).
    #[serde(default, skip_serializing)]
    pub headers: BTreeMap<String, String>,
    /// Status endpoint with `{key}`; enables reconciliation. May name `{message_id}`,
    /// `{tenant}`, `{consumer}` and payload fields too (URL-encoded).
    #[serde(default)]
    pub status_url: String,
    /// How the status endpoint's answer is read.
    #[serde(default)]
    pub status: StatusCheck,
    /// How long after the last call a "not found" is trusted (for providers whose status
    /// search lags their writes).
    #[serde(default = "default_not_found_after")]
    pub not_found_after: Dur,
    /// How the request body is built: `passthrough`, `json` or `form`.
    #[serde(default)]
    pub body: BodyMode,
    /// The body for `json` and `form`: a table whose string values may name `{key}`,
    /// `{message_id}`, `{tenant}`, `{consumer}` and payload fields (`{amount}`,
    /// `{customer.id}`); a value that is one field keeps the field's JSON type.
    #[serde(default)]
    pub body_template: Option<serde_json::Value>,
    /// Longest idempotency key the provider accepts; a message whose rendered key is longer is
    /// refused at intake (HTTP 400, dead letter), never acknowledged.
    #[serde(default = "default_max_key_length")]
    pub max_key_length: usize,
    /// The most requests (calls and status lookups) this instance sends the provider:
    /// `"50/s"` or `"3000/m"`. Unset: no ceiling, but a `429` still slows the destination down.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// A template over the payload's fields, the tenant and the message id (`"{account}"`):
    /// `rate_limit` is then the ceiling of each key's calls, each key paced (and slowed by its
    /// `429`s) on its own (docs/flow-control.md).
    #[serde(default)]
    pub rate_limit_key: Option<String>,
    /// Keys whose pace is kept, at most (the least recently used is dropped); default 100,000.
    #[serde(default)]
    pub rate_limit_keys: Option<usize>,
    /// Statuses that prove the provider applied nothing (retried with the same key, not
    /// counted as attempts). Default `[408, 425, 429, 503]`; without `503` when the consumer
    /// has `max_sends = 1` (see docs/decisions.md). `2xx` and `409` keep their meaning.
    #[serde(default)]
    pub not_applied_status: Option<Vec<u16>>,
    /// Of those, the statuses that also prove the provider never received the call, so that
    /// a claim answered only with them (or refused before the request left) ends `failed`
    /// "never sent" at its `send_deadline`. Default `[429]`; add `503` only when every `503`
    /// comes from the provider itself, never from a proxy in front of it
    /// (docs/providers.md, "Proof that a call was never received").
    #[serde(default)]
    pub non_receipt_status: Option<Vec<u16>>,
    /// How the object's status in a `2xx` answer (and a "found" lookup) decides the outcome
    /// (`[consumers.effect.outcome]`). Unset: any `2xx` completes.
    #[serde(default)]
    pub outcome: Option<Box<ValueOutcomes>>,
    /// The provider's own list of objects, for `claimd reconcile --ledger`
    /// (`[consumers.effect.ledger]`). Unset: the consumer has no ledger to reconcile against.
    #[serde(default)]
    pub ledger: Option<Box<LedgerConfig>>,
}

fn default_not_found_after() -> Dur {
    Dur(Duration::ZERO)
}

fn default_max_key_length() -> usize {
    // Stripe and most providers take keys of up to 255 characters.
    255
}

fn default_method() -> String {
    "POST".into()
}
fn default_idem_header() -> String {
    "Idempotency-Key".into()
}
fn default_timeout() -> Dur {
    Dur(Duration::from_secs(10))
}

/// `kind = "custom"`: the effect is code of the program that embeds claimd, given to
/// `WorkerBuilder::effect` under the consumer's name; `claimd run` refuses such a consumer.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CustomEffectConfig {
    /// The longest one call may take: leases and sweeps leave this much room for it.
    #[serde(default = "default_timeout")]
    pub timeout: Dur,
    /// Longest idempotency key the effect accepts; longer keys are refused at intake.
    #[serde(default = "default_max_key_length")]
    pub max_key_length: usize,
    /// The most calls a second this instance makes (`"50/s"`, `"3000/m"`); unset: no ceiling.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// As the HTTP effect's: `rate_limit` per key of this template.
    #[serde(default)]
    pub rate_limit_key: Option<String>,
    /// As the HTTP effect's: keys kept at most.
    #[serde(default)]
    pub rate_limit_keys: Option<usize>,
}

impl Default for CustomEffectConfig {
    fn default() -> Self {
        CustomEffectConfig {
            timeout: default_timeout(),
            max_key_length: default_max_key_length(),
            rate_limit: None,
            rate_limit_key: None,
            rate_limit_keys: None,
        }
    }
}

/// `kind = "sql"`: a statement run against claimd's own database in the transaction that
/// settles the claim, so the write and the settle commit together or not at all. Named
/// parameters (`:order_id`) are the payload's top-level JSON fields, or `:message_id`,
/// `:tenant`, `:idem_key`, `:consumer`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SqlEffectConfig {
    /// The statement, e.g. `INSERT INTO invoices (order_id, amount_cents) VALUES (:order_id,
    /// :amount_cents)`.
    pub statement: String,
    /// The longest the transaction may take: leases and sweeps leave this much room for it.
    #[serde(default = "default_timeout")]
    pub timeout: Dur,
}

/// `kind = "smtp"`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpEffectConfig {
    /// SMTP server host.
    pub host: String,
    /// SMTP port.
    #[serde(default = "default_smtp_port")]
    pub port: u16,
    /// How the connection is protected.
    #[serde(default)]
    pub tls: SmtpTls,
    /// Login user (empty: no authentication).
    #[serde(default)]
    pub username: String,
    /// Login password.
    #[serde(default, skip_serializing)]
    pub password: String,
    /// Domain in `Message-ID: <{key}@{domain}>`.
    #[serde(default = "default_msgid_domain")]
    pub message_id_domain: String,
    /// Sender when the payload has none.
    #[serde(default)]
    pub from: String,
    /// Subject when the payload has none.
    #[serde(default)]
    pub subject: String,
    /// Per-message timeout.
    #[serde(default = "default_timeout")]
    pub timeout: Dur,
    /// Longest idempotency key (the left part of `Message-ID: <key@domain>`); a message whose
    /// rendered key is longer is refused at intake.
    #[serde(default = "default_max_key_length")]
    pub max_key_length: usize,
}

/// `tls` of an SMTP effect: `none`, `starttls` or `tls`. Read through `TryFrom<String>` so
/// that a wrong value's error names the key: the effect is an internally tagged table, inside
/// which the error path stops at `effect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum SmtpTls {
    /// Plain SMTP (a local relay).
    #[default]
    None,
    /// STARTTLS, required: a server that does not offer it is refused, never used in clear.
    Starttls,
    /// Implicit TLS from the first byte (port 465).
    Tls,
}

impl TryFrom<String> for SmtpTls {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "none" => Ok(SmtpTls::None),
            "starttls" => Ok(SmtpTls::Starttls),
            "tls" => Ok(SmtpTls::Tls),
            other => Err(format!(
                "tls = {other:?}: expected one of \"none\", \"starttls\", \"tls\""
            )),
        }
    }
}

fn default_smtp_port() -> u16 {
    25
}
fn default_msgid_domain() -> String {
    "claimd.local".into()
}

/// `scheme://host[:port]` of a URL: its path and query (which may carry message values)
/// and any `user:password@` left out.
fn origin_of(url: &str) -> String {
    let after_scheme = url.find("://").map(|i| i + 3).unwrap_or(0);
    let end = url[after_scheme..]
        .find(['/', '?', '#'])
        .map(|i| after_scheme + i)
        .unwrap_or(url.len());
    let authority = &url[after_scheme..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{}{host}", &url[..after_scheme])
}

#[cfg(test)]
mod destination_tests {
    use super::origin_of;

    #[test]
    fn the_destination_is_the_origin_without_path_or_credentials() {
        assert_eq!(
            origin_of("https://api.example.com:8443/v1/charges/{id}?x=1"),
            "https://api.example.com:8443"
        );
        assert_eq!(
            origin_of("http://user:secret@127.0.0.1:9000/pay"),
            "http://127.0.0.1:9000"
        );
        assert_eq!(origin_of("http://host"), "http://host");
    }
}
