//! Configuration: TOML, then `CLAIMD__SECTION__KEY` environment overrides, then `${VAR}`
//! expansion in string values, then validation.
//!
//! Every error names the file and the key (`consumers[0].lease: ...`) on one line; `main` turns
//! it into exit code 2. Unknown keys are errors, never ignored.

use crate::claim::KeyTemplate;
use crate::duration::Dur;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where claims live.
    pub store: StoreConfig,
    /// The HTTP listener (intake and operations API).
    #[serde(default)]
    pub http: HttpConfig,
    /// The sweeper schedule.
    #[serde(default)]
    pub sweeper: SweeperConfig,
    /// Pruning of terminal claims.
    #[serde(default)]
    pub retention: RetentionConfig,
    /// The built-in provider simulator.
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// Process-level settings of `claimd run`.
    #[serde(default)]
    pub run: RunConfig,
    /// The consumers: one per kind of side effect.
    #[serde(default)]
    pub consumers: Vec<ConsumerConfig>,
}

/// `[store]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://claimd.db` or `postgres://user@host:5432/db`.
    pub url: String,
    /// Connection pool size.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// PostgreSQL: send concurrent claims and settles together, one statement per batch
    /// (default `true`; each message still gets its answer only after its row committed).
    #[serde(default = "default_true")]
    pub batch_writes: bool,
}

fn default_max_connections() -> u32 {
    16
}

/// `[http]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Address to listen on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// When non-empty, operations routes need `Authorization: Bearer <token>`.
    #[serde(default, skip_serializing)]
    pub admin_token: String,
    /// When non-empty, intake routes need `Authorization: Bearer <token>`.
    #[serde(default, skip_serializing)]
    pub intake_token: String,
    /// Allow a non-loopback listener without an admin token.
    #[serde(default)]
    pub allow_insecure_admin: bool,
    /// Allow a non-loopback listener without an intake token: anyone who reaches the port can
    /// ask for payments (for a network where something in front already authenticates).
    #[serde(default)]
    pub allow_open_intake: bool,
    /// Largest accepted body.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// How long intake waits for a free effect slot before answering `503` + `Retry-After`.
    #[serde(default = "default_intake_wait")]
    pub intake_wait: Dur,
    /// Time a client has to send a complete request head (from its first byte, or from the
    /// connection opening).
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout: Dur,
    /// Time a client has to send a whole body, from when claimd starts reading it (`408`).
    #[serde(default = "default_body_read_timeout")]
    pub body_read_timeout: Dur,
    /// A keep-alive connection without a request for this long is closed (keep it longer than
    /// the load balancer's idle timeout, so the balancer closes first).
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: Dur,
    /// Open connections at most; more wait in the listen backlog.
    #[serde(default = "default_max_connections_http")]
    pub max_connections: usize,
    /// Request bodies held in memory at once, in bytes, across all requests; when spent,
    /// intake answers `503` + `Retry-After` without reading the body.
    #[serde(default = "default_body_budget")]
    pub body_budget_bytes: usize,
}

fn default_header_read_timeout() -> Dur {
    Dur(Duration::from_secs(10))
}
fn default_body_read_timeout() -> Dur {
    Dur(Duration::from_secs(30))
}
fn default_idle_timeout() -> Dur {
    Dur(Duration::from_secs(75))
}
fn default_max_connections_http() -> usize {
    1024
}
fn default_body_budget() -> usize {
    32 * 1024 * 1024
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_max_body() -> usize {
    1_048_576
}
fn default_intake_wait() -> Dur {
    Dur(Duration::from_secs(2))
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: default_listen(),
            admin_token: String::new(),
            intake_token: String::new(),
            allow_insecure_admin: false,
            allow_open_intake: false,
            max_body_bytes: default_max_body(),
            intake_wait: default_intake_wait(),
            header_read_timeout: default_header_read_timeout(),
            body_read_timeout: default_body_read_timeout(),
            idle_timeout: default_idle_timeout(),
            max_connections: default_max_connections_http(),
            body_budget_bytes: default_body_budget(),
        }
    }
}

/// `[sweeper]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SweeperConfig {
    /// Cron expression with seconds.
    #[serde(default = "default_sweep_schedule")]
    pub schedule: String,
    /// Most claims taken in one pass.
    #[serde(default = "default_sweep_batch")]
    pub batch_size: u32,
}

fn default_sweep_schedule() -> String {
    "*/10 * * * * *".into()
}
fn default_sweep_batch() -> u32 {
    500
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            schedule: default_sweep_schedule(),
            batch_size: default_sweep_batch(),
        }
    }
}

/// `[retention]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Cron expression with seconds.
    #[serde(default = "default_retention_schedule")]
    pub schedule: String,
    /// How long terminal claims are kept.
    #[serde(default = "default_keep")]
    pub keep_terminal_for: Dur,
    /// Rows deleted per statement.
    #[serde(default = "default_retention_batch")]
    pub batch_size: u32,
}

fn default_retention_schedule() -> String {
    "0 0 3 * * *".into()
}
fn default_keep() -> Dur {
    Dur(Duration::from_secs(14 * 86_400))
}
fn default_retention_batch() -> u32 {
    5000
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            schedule: default_retention_schedule(),
            keep_terminal_for: default_keep(),
            batch_size: default_retention_batch(),
        }
    }
}

/// `[sandbox]`
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    /// Run the provider simulator inside `claimd run`.
    #[serde(default)]
    pub enabled: bool,
    /// Where it listens.
    #[serde(default = "default_sandbox_listen")]
    pub listen: String,
    /// Simulated provider latency.
    #[serde(default)]
    pub latency_ms: u64,
    /// Probability of a `503` without applying.
    #[serde(default)]
    pub fail_rate: f64,
    /// Probability of applying and then answering `500` or dropping the connection.
    #[serde(default)]
    pub ambiguous_rate: f64,
    /// Behave like a provider without idempotency keys.
    #[serde(default)]
    pub ignore_keys: bool,
}

fn default_sandbox_listen() -> String {
    "127.0.0.1:8090".into()
}

/// `[run]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// How long in-flight effects may finish after SIGINT/SIGTERM.
    #[serde(default = "default_grace")]
    pub shutdown_grace: Dur,
    /// Name of this instance in leases and attempt history (default: host and pid).
    #[serde(default)]
    pub instance: String,
}

fn default_grace() -> Dur {
    Dur(Duration::from_secs(15))
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            shutdown_grace: default_grace(),
            instance: String::new(),
        }
    }
}

/// Where a consumer's messages come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// `POST /v1/messages/{consumer}`.
    Http,
    /// A RabbitMQ queue.
    Amqp,
}

/// What the sweeper does with a claim whose outcome is unknown (invariant I6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUnknown {
    /// Send again with the same key (safe only while the provider keeps keys).
    Redrive,
    /// Ask the provider's status endpoint first.
    Reconcile,
    /// Hand it to a person.
    Park,
}

/// `[[consumers]]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    /// Unique name; part of the claim key and of intake URLs.
    pub name: String,
    /// Where messages come from.
    pub source: Source,
    /// In-flight effects for this consumer.
    #[serde(default = "default_concurrency")]
    pub concurrency: u32,
    /// How long one worker owns a claim before the sweeper may take over.
    #[serde(default = "default_lease")]
    pub lease: Dur,
    /// Attempts (first try plus sweeper takeovers) before a person is asked.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// How long the provider honours an idempotency key.
    #[serde(default = "default_redrive_within")]
    pub redrive_within: Dur,
    /// What to do with an unknown outcome.
    #[serde(default = "default_on_unknown")]
    pub on_unknown: OnUnknown,
    /// Idempotency key template.
    #[serde(default = "default_key")]
    pub key: String,
    /// RabbitMQ URL (`source = "amqp"`).
    #[serde(default)]
    pub amqp_url: String,
    /// RabbitMQ queue (`source = "amqp"`).
    #[serde(default)]
    pub queue: String,
    /// Unacknowledged deliveries at once (`source = "amqp"`).
    #[serde(default = "default_prefetch")]
    pub prefetch: u16,
    /// Where bad broker messages go (`source = "amqp"`).
    #[serde(default)]
    pub dead_letter_exchange: String,
    /// Declare exchange and queues at start (`source = "amqp"`).
    #[serde(default = "default_true")]
    pub declare: bool,
    /// Header that overrides the AMQP `message_id` property.
    #[serde(default)]
    pub message_id_header: String,
    /// Header carrying the tenant (AMQP header, or HTTP header name for intake; default `Tenant-Id`).
    #[serde(default)]
    pub tenant_header: String,
    /// The side effect.
    pub effect: EffectConfig,
}

fn default_concurrency() -> u32 {
    64
}
fn default_lease() -> Dur {
    Dur(Duration::from_secs(60))
}
fn default_max_attempts() -> u32 {
    8
}
fn default_redrive_within() -> Dur {
    Dur(Duration::from_secs(86_400))
}
fn default_on_unknown() -> OnUnknown {
    OnUnknown::Reconcile
}
fn default_key() -> String {
    // Keys are unique per provider account: the consumer and the tenant belong in them.
    "{consumer}:{tenant}:{message_id}".into()
}
fn default_prefetch() -> u16 {
    64
}
fn default_true() -> bool {
    true
}

/// `[consumers.effect]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum EffectConfig {
    /// An HTTP call to the provider.
    Http(HttpEffectConfig),
    /// An email over SMTP.
    Smtp(SmtpEffectConfig),
}

impl EffectConfig {
    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        match self {
            EffectConfig::Http(h) => h.timeout.0,
            EffectConfig::Smtp(s) => s.timeout.0,
        }
    }

    /// The longest idempotency key the provider accepts.
    pub fn max_key_length(&self) -> usize {
        match self {
            EffectConfig::Http(h) => h.max_key_length,
            EffectConfig::Smtp(s) => s.max_key_length,
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
    /// Extra headers (secrets allowed via `${VAR}`; never logged).
    #[serde(default, skip_serializing)]
    pub headers: BTreeMap<String, String>,
    /// Status endpoint with `{key}`; enables reconciliation.
    #[serde(default)]
    pub status_url: String,
    /// Longest idempotency key the provider accepts; a message whose rendered key is longer is
    /// refused at intake (HTTP 400, dead letter), never acknowledged.
    #[serde(default = "default_max_key_length")]
    pub max_key_length: usize,
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

/// `kind = "smtp"`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpEffectConfig {
    /// SMTP server host.
    pub host: String,
    /// SMTP port.
    #[serde(default = "default_smtp_port")]
    pub port: u16,
    /// `none`, `starttls` or `tls`.
    #[serde(default = "default_smtp_tls")]
    pub tls: String,
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

fn default_smtp_port() -> u16 {
    25
}
fn default_smtp_tls() -> String {
    "none".into()
}
fn default_msgid_domain() -> String {
    "claimd.local".into()
}

/// A configuration that cannot be used. Displayed as one line: where, what.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("{path}: not valid TOML: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's words, on one line.
        message: String,
    },
    /// A key is unknown, missing or of the wrong kind, or a value is refused.
    #[error("{path}: {key}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted key, like `consumers[0].lease`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// A loaded configuration plus the warnings an operator should see at start.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration.
    pub config: Config,
    /// Risky but allowed settings (colliding keys, missing `{tenant}`, unset `${VAR}`).
    pub warnings: Vec<String>,
}

impl Config {
    /// Names of the configured consumers, in configuration order.
    pub fn consumer_names(&self) -> Vec<String> {
        self.consumers.iter().map(|c| c.name.clone()).collect()
    }

    /// Reads `path`, applies the process environment and validates.
    pub fn load(path: &Path) -> Result<Loaded, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, path, std::env::vars())
    }

    /// Parses `text` (named `path` in errors) with the given environment.
    pub fn from_toml(
        text: &str,
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Loaded, ConfigError> {
        let env: BTreeMap<String, String> = env.into_iter().collect();
        let mut value: toml::Value = toml::from_str::<toml::Table>(text)
            .map(toml::Value::Table)
            .map_err(|e| ConfigError::Syntax {
                path: path.to_path_buf(),
                message: one_line(&e.to_string()),
            })?;
        let invalid = |key: String, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            message,
        };
        for (name, raw) in &env {
            if let Some(rest) = name.strip_prefix("CLAIMD__") {
                apply_override(&mut value, rest, raw)
                    .map_err(|m| invalid(format!("environment {name}"), m))?;
            }
        }
        let mut warnings = Vec::new();
        expand_vars(&mut value, &env, &mut String::new(), &mut warnings);
        let config: Config = serde_path_to_error::deserialize(value).map_err(|e| {
            let key = e.path().to_string();
            invalid(key, one_line(&e.into_inner().to_string()))
        })?;
        // The edge checks first: they show URLs with their passwords redacted.
        config
            .validate_edge()
            .map_err(|(key, message)| invalid(key, message))?;
        config
            .validate(&mut warnings)
            .map_err(|(key, message)| invalid(key, message))?;
        Ok(Loaded { config, warnings })
    }

    /// The consumer with this name.
    pub fn consumer(&self, name: &str) -> Option<&ConsumerConfig> {
        self.consumers.iter().find(|c| c.name == name)
    }

    fn validate(&self, warnings: &mut Vec<String>) -> Result<(), (String, String)> {
        if self.store.max_connections == 0 {
            return Err(("store.max_connections".into(), "must be at least 1".into()));
        }
        for (key, schedule) in [
            ("sweeper.schedule", &self.sweeper.schedule),
            ("retention.schedule", &self.retention.schedule),
        ] {
            validate_cron(schedule).map_err(|m| (key.to_string(), m))?;
        }
        if self.sweeper.batch_size == 0 || self.retention.batch_size == 0 {
            return Err((
                "sweeper/retention.batch_size".into(),
                "must be at least 1".into(),
            ));
        }
        let mut hosts: BTreeMap<String, Vec<(&str, KeyTemplate)>> = BTreeMap::new();
        for (i, c) in self.consumers.iter().enumerate() {
            let at = |k: &str| format!("consumers[{i}].{k}");
            if c.name.is_empty()
                || !c
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err((
                    at("name"),
                    format!("{:?}: use letters, digits, '-' and '_'", c.name),
                ));
            }
            if self.consumers[..i].iter().any(|o| o.name == c.name) {
                return Err((at("name"), format!("{:?} is used by two consumers", c.name)));
            }
            if c.concurrency == 0 {
                return Err((at("concurrency"), "must be at least 1".into()));
            }
            if c.max_attempts == 0 {
                return Err((at("max_attempts"), "must be at least 1".into()));
            }
            let template: KeyTemplate = c.key.parse().map_err(|e| (at("key"), format!("{e}")))?;
            let timeout = c.effect.timeout();
            if c.lease.0 <= timeout {
                return Err((
                    at("lease"),
                    format!(
                        "{} must be longer than the effect timeout {}, or the sweeper takes over calls still in flight",
                        c.lease,
                        Dur(timeout)
                    ),
                ));
            }
            if self.retention.keep_terminal_for.0 < c.redrive_within.0 {
                return Err((
                    "retention.keep_terminal_for".into(),
                    format!(
                        "{} is shorter than consumers[{i}].redrive_within {}: a redelivered message could be claimed and performed again after its claim was pruned",
                        self.retention.keep_terminal_for, c.redrive_within
                    ),
                ));
            }
            if c.source == Source::Amqp {
                for (k, v) in [("amqp_url", &c.amqp_url), ("queue", &c.queue)] {
                    if v.is_empty() {
                        return Err((at(k), "required when source = \"amqp\"".into()));
                    }
                }
                if c.dead_letter_exchange.is_empty() {
                    return Err((
                        at("dead_letter_exchange"),
                        "required when source = \"amqp\": bad messages need a place to go".into(),
                    ));
                }
                if c.queue.len() > 250 {
                    return Err((
                        at("queue"),
                        "at most 250 bytes (AMQP names are at most 255, and claimd adds \".dead\")"
                            .into(),
                    ));
                }
                if c.dead_letter_exchange.len() > 255 {
                    return Err((at("dead_letter_exchange"), "at most 255 bytes".into()));
                }
                if let Some(other) = self.consumers[..i].iter().find(|o| {
                    o.source == Source::Amqp
                        && o.dead_letter_exchange == c.dead_letter_exchange
                        && (o.declare || c.declare)
                }) {
                    return Err((
                        at("dead_letter_exchange"),
                        format!(
                            "{:?} is also consumer {:?}'s: it is a fanout, so each <queue>.dead would receive the other's bad messages; give each consumer its own",
                            c.dead_letter_exchange, other.name
                        ),
                    ));
                }
                if c.prefetch == 0 {
                    return Err((
                        at("prefetch"),
                        "must be at least 1 (0 would let the broker push without limit)".into(),
                    ));
                }
            }
            if !c.tenant_header.is_empty() && !template.mentions_tenant() {
                // Two tenants' messages with one id would be sent under one key: the provider
                // would apply the first and replay its answer for the second (I5 misapplied).
                return Err((
                    at("key"),
                    format!(
                        "{:?} lacks {{tenant}} but tenant_header = {:?} is set: two tenants sending one message id would share a provider key and one of the effects would never happen; add {{tenant}} (e.g. \"{{consumer}}:{{tenant}}:{{message_id}}\")",
                        c.key, c.tenant_header
                    ),
                ));
            }
            if c.redrive_within.0 < c.lease.0 {
                return Err((
                    at("redrive_within"),
                    format!(
                        "{} is shorter than the lease {}: every claim the sweeper takes over would be past the provider's key window and could never be sent again safely",
                        c.redrive_within, c.lease
                    ),
                ));
            }
            let max_key = c.effect.max_key_length();
            if max_key == 0 {
                return Err((at("effect.max_key_length"), "must be at least 1".into()));
            }
            match &c.effect {
                EffectConfig::Http(h) => {
                    let url = reqwest::Url::parse(&h.url)
                        .map_err(|e| (at("effect.url"), format!("{:?}: {e}", h.url)))?;
                    reqwest::Method::from_bytes(h.method.as_bytes()).map_err(|_| {
                        (
                            at("effect.method"),
                            format!("{:?} is not an HTTP method", h.method),
                        )
                    })?;
                    if h.idempotency_header.is_empty() {
                        return Err((at("effect.idempotency_header"), "must not be empty".into()));
                    }
                    if !h.status_url.is_empty() && !h.status_url.contains("{key}") {
                        return Err((at("effect.status_url"), "must contain {key}".into()));
                    }
                    if c.on_unknown == OnUnknown::Reconcile && h.status_url.is_empty() {
                        warnings.push(format!(
                            "consumers[{i}] ({}): on_unknown = \"reconcile\" without effect.status_url: unknown outcomes will be parked for a person",
                            c.name
                        ));
                    }
                    let host = format!(
                        "{}:{}",
                        url.host_str().unwrap_or(""),
                        url.port_or_known_default().unwrap_or(0)
                    );
                    hosts.entry(host).or_default().push((&c.name, template));
                }
                EffectConfig::Smtp(s) => {
                    if !["none", "starttls", "tls"].contains(&s.tls.as_str()) {
                        return Err((at("effect.tls"), "must be none, starttls or tls".into()));
                    }
                    if s.tls == "none" && !s.username.is_empty() {
                        warnings.push(format!(
                            "consumers[{i}] ({}): effect.username is set with tls = \"none\": the SMTP password crosses the network in clear",
                            c.name
                        ));
                    }
                    if c.on_unknown == OnUnknown::Reconcile {
                        return Err((
                            at("on_unknown"),
                            "SMTP has no status endpoint: use \"park\" (safe default) or \"redrive\"".into(),
                        ));
                    }
                }
            }
        }
        for (host, users) in hosts {
            if users.len() > 1 && users.iter().any(|(_, t)| !t.mentions_consumer()) {
                let names: Vec<&str> = users.iter().map(|(n, _)| *n).collect();
                warnings.push(format!(
                    "consumers {names:?} send to the same provider {host} and not every key template contains {{consumer}}: one message's response could be replayed for another's"
                ));
            }
        }
        Ok(())
    }
}

impl Config {
    /// What the edge needs to be valid: provider header names and values that can be sent
    /// (a value like `"Bearer x\n"` would fail every call).
    fn validate_edge(&self) -> Result<(), (String, String)> {
        let http = &self.http;
        for (key, d) in [
            ("http.header_read_timeout", http.header_read_timeout),
            ("http.body_read_timeout", http.body_read_timeout),
            ("http.idle_timeout", http.idle_timeout),
        ] {
            if d.0.is_zero() {
                return Err((key.into(), "must be longer than 0s".into()));
            }
        }
        if http.max_connections == 0 {
            return Err(("http.max_connections".into(), "must be at least 1".into()));
        }
        if http.max_body_bytes == 0 {
            return Err(("http.max_body_bytes".into(), "must be at least 1".into()));
        }
        if http.body_budget_bytes < http.max_body_bytes {
            return Err((
                "http.body_budget_bytes".into(),
                format!(
                    "{} is smaller than max_body_bytes {}: a body of the largest allowed size could never be admitted",
                    http.body_budget_bytes, http.max_body_bytes
                ),
            ));
        }
        crate::store::check_url(&self.store.url).map_err(|m| ("store.url".to_string(), m))?;
        let redact = crate::store::redact_url;
        for (i, c) in self.consumers.iter().enumerate() {
            if c.source == Source::Amqp && !c.amqp_url.is_empty() {
                // lapin's own parse error repeats the whole URL, password included.
                c.amqp_url.parse::<lapin::uri::AMQPUri>().map_err(|e| {
                    (
                        format!("consumers[{i}].amqp_url"),
                        format!("{}: not an AMQP URL ({})", redact(&c.amqp_url), redact(&e)),
                    )
                })?;
            }
            let EffectConfig::Http(h) = &c.effect else {
                continue;
            };
            reqwest::Url::parse(&h.url).map_err(|e| {
                (
                    format!("consumers[{i}].effect.url"),
                    format!("{}: {e}", redact(&h.url)),
                )
            })?;
            crate::effect::http::check_header(&h.idempotency_header, "x")
                .map_err(|m| (format!("consumers[{i}].effect.idempotency_header"), m))?;
            for (name, value) in &h.headers {
                crate::effect::http::check_header(name, value)
                    .map_err(|m| (format!("consumers[{i}].effect.headers.{name}"), m))?;
            }
        }
        Ok(())
    }
}

/// Checks a six-field cron expression (seconds first).
pub fn validate_cron(schedule: &str) -> Result<(), String> {
    if schedule.split_whitespace().count() != 6 {
        return Err(format!(
            "{schedule:?}: expected 6 fields (sec min hour day month weekday)"
        ));
    }
    parse_cron(schedule).map(|_| ())
}

/// Parses a six-field cron expression (seconds required).
pub fn parse_cron(schedule: &str) -> Result<croner::Cron, String> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .build()
        .parse(schedule)
        .map_err(|e| format!("{schedule:?}: {e}"))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `SECTION__KEY` (or `CONSUMERS__0__EFFECT__TIMEOUT`) = raw value.
fn apply_override(root: &mut toml::Value, path: &str, raw: &str) -> Result<(), String> {
    let segments: Vec<String> = path.split("__").map(|s| s.to_ascii_lowercase()).collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err("empty path segment".into());
    }
    let mut node = root;
    for (n, seg) in segments.iter().enumerate() {
        let last = n + 1 == segments.len();
        node = match node {
            toml::Value::Table(t) => {
                if last {
                    t.insert(seg.clone(), parse_scalar(raw));
                    return Ok(());
                }
                t.entry(seg.clone())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            }
            toml::Value::Array(a) => {
                let idx: usize = seg
                    .parse()
                    .map_err(|_| format!("{seg:?} is not an index into a list"))?;
                let len = a.len();
                let slot = a
                    .get_mut(idx)
                    .ok_or_else(|| format!("index {idx} is past the {len} entries"))?;
                if last {
                    *slot = parse_scalar(raw);
                    return Ok(());
                }
                slot
            }
            _ => return Err(format!("{seg:?} is inside a value that is not a table")),
        };
    }
    Ok(())
}

/// An override is read as a TOML value when it is one (`64`, `true`), else as a string.
fn parse_scalar(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// Expands `${VAR}` and `${VAR:-default}` inside every string value.
fn expand_vars(
    value: &mut toml::Value,
    env: &BTreeMap<String, String>,
    at: &mut String,
    warnings: &mut Vec<String>,
) {
    match value {
        toml::Value::String(s) if s.contains("${") => {
            *s = expand_string(s, env, at, warnings);
        }
        toml::Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                let len = at.len();
                if !at.is_empty() {
                    at.push('.');
                }
                at.push_str(k);
                expand_vars(v, env, at, warnings);
                at.truncate(len);
            }
        }
        toml::Value::Array(a) => {
            for (i, v) in a.iter_mut().enumerate() {
                let len = at.len();
                at.push_str(&format!("[{i}]"));
                expand_vars(v, env, at, warnings);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

fn expand_string(
    s: &str,
    env: &BTreeMap<String, String>,
    at: &str,
    warnings: &mut Vec<String>,
) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let inner = &rest[start + 2..start + end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        match (env.get(name), default) {
            (Some(v), _) => out.push_str(v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                // An empty admin token is a valid "no auth" choice, so only warn.
                warnings.push(format!(
                    "{at}: ${{{name}}} is not set; using an empty value"
                ));
            }
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[store]
url = "sqlite://x.db"
[[consumers]]
name = "payments"
source = "http"
lease = "60s"
[consumers.effect]
kind = "http"
url = "http://127.0.0.1:8090/v1/payments"
timeout = "10s"
headers = { Authorization = "Bearer ${PROVIDER_TOKEN}" }
"#;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Loaded, ConfigError> {
        Config::from_toml(
            text,
            Path::new("c.toml"),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    #[test]
    fn loads_with_defaults_and_expands_secrets() {
        let l = load(BASE, &[("PROVIDER_TOKEN", "s3cret")]).unwrap();
        let c = &l.config.consumers[0];
        assert_eq!(c.max_attempts, 8);
        assert_eq!(c.on_unknown, OnUnknown::Reconcile);
        let EffectConfig::Http(h) = &c.effect else {
            panic!("http effect")
        };
        assert_eq!(h.headers["Authorization"], "Bearer s3cret");
    }

    #[test]
    fn unset_variables_warn() {
        let l = load(BASE, &[]).unwrap();
        assert!(
            l.warnings.iter().any(|w| w.contains("PROVIDER_TOKEN")),
            "{:?}",
            l.warnings
        );
    }

    #[test]
    fn environment_overrides_reach_nested_keys() {
        let l = load(
            BASE,
            &[
                ("CLAIMD__STORE__MAX_CONNECTIONS", "4"),
                ("CLAIMD__CONSUMERS__0__EFFECT__TIMEOUT", "5s"),
                ("CLAIMD__HTTP__LISTEN", "127.0.0.1:9999"),
            ],
        )
        .unwrap();
        assert_eq!(l.config.store.max_connections, 4);
        assert_eq!(
            l.config.consumers[0].effect.timeout(),
            Duration::from_secs(5)
        );
        assert_eq!(l.config.http.listen, "127.0.0.1:9999");
    }

    fn error_of(text: &str) -> String {
        load(text, &[]).unwrap_err().to_string()
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let e = error_of(&BASE.replace("lease = \"60s\"", "lease = \"60s\"\nleese = 1"));
        assert!(e.contains("consumers[0]") && e.contains("leese"), "{e}");
        let e = error_of(&format!("{BASE}\n[sweeper]\nshedule = \"x\""));
        assert!(e.contains("shedule"), "{e}");
    }

    #[test]
    fn bad_values_name_key_and_problem_on_one_line() {
        for (text, needle) in [
            (BASE.replace("\"60s\"", "\"sixty\""), "consumers[0].lease"),
            (
                BASE.replace("\"60s\"", "\"5s\""),
                "longer than the effect timeout",
            ),
            (
                BASE.replace("source = \"http\"", "source = \"kafka\""),
                "consumers[0].source",
            ),
            (
                BASE.replace("source = \"http\"", "source = \"amqp\""),
                "amqp_url",
            ),
            (
                format!("{BASE}\n[retention]\nkeep_terminal_for = \"1h\""),
                "redrive_within",
            ),
            (
                format!("{BASE}\n[sweeper]\nschedule = \"every minute\""),
                "sweeper.schedule",
            ),
            ("[store\nurl=1".to_string(), "not valid TOML"),
        ] {
            let e = error_of(&text);
            assert!(e.contains(needle), "{needle:?} not in {e:?}");
            assert!(!e.contains('\n'), "one line: {e:?}");
            assert!(e.starts_with("c.toml: "), "{e}");
        }
    }

    #[test]
    fn warns_when_two_consumers_share_a_provider_without_consumer_in_key() {
        let two = format!(
            "{BASE}\n[[consumers]]\nname = \"refunds\"\nsource = \"http\"\nkey = \"{{message_id}}\"\n[consumers.effect]\nkind = \"http\"\nurl = \"http://127.0.0.1:8090/v1/refunds\"\n"
        );
        let l = load(&two, &[("PROVIDER_TOKEN", "x")]).unwrap();
        assert!(
            l.warnings.iter().any(|w| w.contains("same provider")),
            "{:?}",
            l.warnings
        );
    }

    #[test]
    fn the_default_key_template_keys_on_consumer_and_tenant() {
        let l = load(BASE, &[("PROVIDER_TOKEN", "x")]).unwrap();
        let c = &l.config.consumers[0];
        assert_eq!(c.key, "{consumer}:{tenant}:{message_id}");
        let t: KeyTemplate = c.key.parse().unwrap();
        assert_ne!(
            t.render(&c.name, "acme", "order-1"),
            t.render(&c.name, "globex", "order-1")
        );
        assert_eq!(c.effect.max_key_length(), 255);
    }

    #[test]
    fn a_tenant_header_without_tenant_in_the_key_is_refused() {
        let text = BASE.replace(
            "lease = \"60s\"",
            "lease = \"60s\"\ntenant_header = \"X-Tenant\"\nkey = \"{message_id}\"",
        );
        let e = error_of(&text);
        assert!(e.contains("consumers[0].key"), "{e}");
        assert!(e.contains("lacks {tenant}"), "{e}");
        let ok = BASE.replace(
            "lease = \"60s\"",
            "lease = \"60s\"\ntenant_header = \"X-Tenant\"\nkey = \"{tenant}:{message_id}\"",
        );
        assert!(load(&ok, &[("PROVIDER_TOKEN", "x")]).is_ok());
    }

    #[test]
    fn a_key_window_shorter_than_the_lease_is_refused() {
        let text = BASE.replace(
            "lease = \"60s\"",
            "lease = \"60s\"\nredrive_within = \"30s\"",
        );
        let e = error_of(&text);
        assert!(e.contains("consumers[0].redrive_within"), "{e}");
        assert!(e.contains("shorter than the lease"), "{e}");
        let e =
            error_of(&BASE.replace("timeout = \"10s\"", "timeout = \"10s\"\nmax_key_length = 0"));
        assert!(e.contains("consumers[0].effect.max_key_length"), "{e}");
    }

    #[test]
    fn amqp_consumers_need_prefetch_and_a_dead_letter_exchange_of_their_own() {
        let amqp = |name: &str, dlx: &str, prefetch: u16| {
            format!(
                "\n[[consumers]]\nname = \"{name}\"\nsource = \"amqp\"\namqp_url = \"amqp://x\"\nqueue = \"q.{name}\"\ndead_letter_exchange = \"{dlx}\"\nprefetch = {prefetch}\n[consumers.effect]\nkind = \"http\"\nurl = \"http://127.0.0.1:8090/v1/{name}\"\n"
            )
        };
        let base = "[store]\nurl = \"sqlite://x.db\"\n";
        let e = error_of(&format!("{base}{}", amqp("a", "dlx.a", 0)));
        assert!(e.contains("consumers[0].prefetch"), "{e}");
        let e = error_of(&format!(
            "{base}{}{}",
            amqp("a", "dlx", 8),
            amqp("b", "dlx", 8)
        ));
        assert!(
            e.contains("consumers[1].dead_letter_exchange") && e.contains("\"a\""),
            "{e}"
        );
        assert!(
            load(
                &format!("{base}{}{}", amqp("a", "dlx.a", 8), amqp("b", "dlx.b", 8)),
                &[]
            )
            .is_ok()
        );
    }

    #[test]
    fn the_compose_overrides_reach_the_rabbitmq_config() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/postgres-rabbitmq.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let l = load(
            &text,
            &[
                (
                    "CLAIMD__CONSUMERS__0__AMQP_URL",
                    "amqp://claimd:claimd@rabbitmq:5672/%2f",
                ),
                ("CLAIMD__CONSUMERS__1__EFFECT__HOST", "mailpit"),
                ("CLAIMD__CONSUMERS__1__EFFECT__PORT", "1025"),
            ],
        )
        .unwrap();
        assert_eq!(
            l.config.consumers[0].amqp_url,
            "amqp://claimd:claimd@rabbitmq:5672/%2f"
        );
        let EffectConfig::Smtp(s) = &l.config.consumers[1].effect else {
            panic!("consumers[1] is the email consumer")
        };
        assert_eq!((s.host.as_str(), s.port), ("mailpit", 1025));
    }

    #[test]
    fn the_shipped_configs_load() {
        for file in [
            "config/default.toml",
            "config/postgres.toml",
            "config/postgres-rabbitmq.toml",
        ] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            load(&text, &[]).unwrap_or_else(|e| panic!("{file}: {e}"));
        }
    }
}
