//! The configuration's shape: one struct per section, with the defaults `config/default.toml`
//! documents. Unknown keys are refused (`deny_unknown_fields`).

use crate::duration::Dur;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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
    /// Log lines.
    #[serde(default)]
    pub log: super::LogConfig,
    /// The consumers: one per kind of side effect.
    #[serde(default)]
    pub consumers: Vec<ConsumerConfig>,
    /// The file this configuration was read from (`None` when it was built from text). Not a
    /// key of the file: [`Config::load`] sets it, so the commands claimd suggests name it.
    #[serde(skip)]
    pub file: Option<std::path::PathBuf>,
    /// The environment variables `[store] url` was read from (`CLAIMD__STORE__URL`, a set
    /// `${VAR}` in the file's URL), so a suggested command can carry them. Not a key.
    #[serde(skip)]
    pub store_url_from: Vec<String>,
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
    /// Commit concurrent claims (and, apart, settles) together: one multi-row statement per
    /// batch on PostgreSQL, one transaction per batch on SQLite (default `true`; each message
    /// still gets its answer only after the commit that holds its row).
    #[serde(default = "default_true")]
    pub batch_writes: bool,
}

fn default_max_connections() -> u32 {
    16
}

/// `[http]`. Every key may be left out; the defaults are [`HttpConfig::default`]'s.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address to listen on.
    pub listen: String,
    /// When non-empty, operations routes need `Authorization: Bearer <token>`.
    #[serde(skip_serializing)]
    pub admin_token: String,
    /// When non-empty, intake routes need `Authorization: Bearer <token>`; it speaks for every
    /// tenant.
    #[serde(skip_serializing)]
    pub intake_token: String,
    /// Intake tokens that each speak for one tenant only (`super::tenant_tokens`).
    #[serde(skip_serializing)]
    pub tenant_tokens: super::TenantTokens,
    /// Allow a non-loopback listener without an admin token.
    pub allow_insecure_admin: bool,
    /// Allow a non-loopback listener without an intake token: anyone who reaches the port can
    /// ask for payments (for a network where something in front already authenticates).
    pub allow_open_intake: bool,
    /// Largest accepted body.
    pub max_body_bytes: usize,
    /// How long intake waits for a free effect slot before answering `503` + `Retry-After`.
    pub intake_wait: Dur,
    /// Time a client has to send a complete request head (from its first byte, or from the
    /// connection opening).
    pub header_read_timeout: Dur,
    /// Time a client has to send a whole body, from when claimd starts reading it (`408`).
    pub body_read_timeout: Dur,
    /// A keep-alive connection without a request for this long is closed (keep it longer than
    /// the load balancer's idle timeout, so the balancer closes first).
    pub idle_timeout: Dur,
    /// Open connections at most; more wait in the listen backlog.
    pub max_connections: usize,
    /// Request bodies held in memory at once, in bytes, across all requests; when spent,
    /// intake answers `503` + `Retry-After` without reading the body.
    pub body_budget_bytes: usize,
    /// Provider-event bodies (`POST /v1/provider-events/...`) held in memory at once, in bytes:
    /// a budget of their own, so unauthenticated webhook traffic and intake cannot starve
    /// each other.
    pub provider_event_budget_bytes: usize,
    /// Host names (beside loopback names) a request may name in `Host` and `Origin` for a
    /// route whose token is empty; a route with a token set accepts any.
    pub allowed_hosts: Vec<String>,
    /// The longest `Prefer: wait=N` honoured: a request asking for more waits this long.
    pub max_wait: Dur,
    /// Requests that may wait for an outcome at once (`Prefer: wait`), never more than half of
    /// `max_connections`; past it a request is answered at once, as without the preference.
    pub max_waiters: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "127.0.0.1:8080".into(),
            admin_token: String::new(),
            intake_token: String::new(),
            tenant_tokens: Default::default(),
            allow_insecure_admin: false,
            allow_open_intake: false,
            max_body_bytes: 1_048_576,
            intake_wait: Dur(Duration::from_secs(2)),
            header_read_timeout: Dur(Duration::from_secs(10)),
            body_read_timeout: Dur(Duration::from_secs(30)),
            idle_timeout: Dur(Duration::from_secs(75)),
            max_connections: 1024,
            body_budget_bytes: 16 * 1024 * 1024,
            provider_event_budget_bytes: 4 * 1024 * 1024,
            allowed_hosts: Vec::new(),
            max_wait: Dur(Duration::from_secs(30)),
            max_waiters: 256,
        }
    }
}

/// `[sweeper]`. Every key may be left out.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SweeperConfig {
    /// Cron expression with seconds.
    pub schedule: String,
    /// Most claims taken in one pass.
    pub batch_size: u32,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            schedule: "*/10 * * * * *".into(),
            batch_size: 500,
        }
    }
}

/// `[retention]`. Every key may be left out.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Cron expression with seconds.
    pub schedule: String,
    /// How long terminal claims are kept.
    pub keep_terminal_for: Dur,
    /// Rows deleted per statement.
    pub batch_size: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            schedule: "0 0 3 * * *".into(),
            keep_terminal_for: Dur(Duration::from_secs(14 * 86_400)),
            batch_size: 5000,
        }
    }
}

/// `[sandbox]`. Every key may be left out (the simulator is off unless `enabled`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// Run the provider simulator inside `claimd run`.
    pub enabled: bool,
    /// Where it listens.
    pub listen: String,
    /// Simulated provider latency.
    pub latency_ms: u64,
    /// Probability of a `503` without applying.
    pub fail_rate: f64,
    /// Probability of applying and then answering `500` or dropping the connection.
    pub ambiguous_rate: f64,
    /// Behave like a provider without idempotency keys.
    pub ignore_keys: bool,
    /// Take at most this many `POST`s a second, answering `429` beyond (0: no limit).
    pub rate_limit: u32,
    /// A file keeping the applied effects across restarts. Not set: under `claimd run` with a
    /// SQLite store, `<store file>.sandbox.jsonl` beside it; else (and `""`) memory only.
    pub state_file: Option<String>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            enabled: false,
            listen: "127.0.0.1:8090".into(),
            latency_ms: 0,
            fail_rate: 0.0,
            ambiguous_rate: 0.0,
            ignore_keys: false,
            rate_limit: 0,
            state_file: None,
        }
    }
}

/// `[run]`. Every key may be left out.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// How long in-flight effects may finish after SIGINT/SIGTERM.
    pub shutdown_grace: Dur,
    /// Name of this instance in leases and attempt history (default: host and pid).
    pub instance: String,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            shutdown_grace: Dur(Duration::from_secs(15)),
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

/// `[[consumers]]`. Read from the file's flat shape ([`ConsumerEntry`]): `source` selects a
/// [`SourceConfig`] variant, which takes the keys of that source.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(try_from = "ConsumerEntry")]
pub struct ConsumerConfig {
    /// Unique name; part of the claim key and of intake URLs.
    pub name: String,
    /// Where messages come from, with that source's settings.
    #[serde(flatten)]
    pub source: SourceConfig,
    /// In-flight effects for this consumer.
    pub concurrency: u32,
    /// How long one worker owns a claim before the sweeper may take over.
    pub lease: Dur,
    /// Attempts (first try plus sweeper takeovers) before a person is asked.
    pub max_attempts: u32,
    /// Sends of one claim whose effect may have happened (the first send plus re-sends after
    /// an unknown outcome or a "not found" status check) before it is parked for a person:
    /// the bound on duplicates when the provider ignores idempotency keys.
    pub max_sends: u32,
    /// How long the provider honours an idempotency key.
    pub redrive_within: Dur,
    /// How long a claim that was provably never sent (its provider down or refusing it
    /// without applying) may wait; then it ends `failed` with "never sent", which is safe to
    /// submit again. Never `needs_attention`.
    pub send_deadline: Dur,
    /// What to do with an unknown outcome.
    pub on_unknown: OnUnknown,
    /// Idempotency key template.
    pub key: String,
    /// Header carrying the tenant (AMQP header, or HTTP header name for intake; default `Tenant-Id`).
    pub tenant_header: String,
    /// The side effect.
    pub effect: EffectConfig,
    /// The provider's signed events about this consumer's effects (webhooks), received at
    /// `POST /v1/provider-events/{consumer}` (`[consumers.provider_events]`).
    pub provider_events: Option<ProviderEventsConfig>,
    /// Where this consumer's outcome events go (`[consumers.outcomes]`); `None`: no events.
    pub outcomes: Option<super::OutcomesConfig>,
}

/// `[consumers.provider_events]`: where the provider's events are verified and how they are
/// read. The event's object is read with the effect's `[effect.outcome]` (which it needs).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderEventsConfig {
    /// `"stripe"` (`Stripe-Signature`) or `"standard"` (Standard Webhooks).
    pub scheme: crate::provider_events::signature::Scheme,
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

impl ConsumerConfig {
    /// The RabbitMQ settings, when `source = "amqp"`.
    pub fn amqp(&self) -> Option<&AmqpSourceConfig> {
        match &self.source {
            SourceConfig::Amqp(a) => Some(a),
            SourceConfig::Http => None,
        }
    }
}

/// Where a consumer's messages come from (`source = "..."`), with that source's keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "lowercase")]
pub enum SourceConfig {
    /// `POST /v1/messages/{consumer}`.
    Http,
    /// A RabbitMQ queue.
    Amqp(AmqpSourceConfig),
}

impl SourceConfig {
    /// The `source` value that selects this variant.
    pub fn kind(&self) -> Source {
        match self {
            SourceConfig::Http => Source::Http,
            SourceConfig::Amqp(_) => Source::Amqp,
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

/// A `[[consumers]]` table as written in the file: every key of every source side by side.
/// [`ConsumerConfig`] is built from it, refusing the keys of a source not selected.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerEntry {
    name: String,
    source: Source,
    #[serde(default = "default_concurrency")]
    concurrency: u32,
    #[serde(default = "default_lease")]
    lease: Dur,
    #[serde(default = "default_max_attempts")]
    max_attempts: u32,
    #[serde(default = "default_max_sends")]
    max_sends: u32,
    #[serde(default = "default_redrive_within")]
    redrive_within: Dur,
    #[serde(default = "default_send_deadline")]
    send_deadline: Dur,
    #[serde(default = "default_on_unknown")]
    on_unknown: OnUnknown,
    #[serde(default = "default_key")]
    key: String,
    amqp_url: Option<String>,
    queue: Option<String>,
    prefetch: Option<u16>,
    dead_letter_exchange: Option<String>,
    declare: Option<bool>,
    message_id_header: Option<String>,
    #[serde(default)]
    tenant_header: String,
    effect: EffectConfig,
    provider_events: Option<ProviderEventsConfig>,
    outcomes: Option<super::OutcomesConfig>,
}

impl TryFrom<ConsumerEntry> for ConsumerConfig {
    type Error = String;

    fn try_from(e: ConsumerEntry) -> Result<Self, String> {
        let source = match e.source {
            Source::Amqp => SourceConfig::Amqp(AmqpSourceConfig {
                url: e.amqp_url.unwrap_or_default(),
                queue: e.queue.unwrap_or_default(),
                prefetch: e.prefetch.unwrap_or(64),
                dead_letter_exchange: e.dead_letter_exchange.unwrap_or_default(),
                declare: e.declare.unwrap_or(true),
                message_id_header: e.message_id_header.unwrap_or_default(),
            }),
            Source::Http => {
                let amqp_keys = [
                    ("amqp_url", e.amqp_url.is_some()),
                    ("queue", e.queue.is_some()),
                    ("prefetch", e.prefetch.is_some()),
                    ("dead_letter_exchange", e.dead_letter_exchange.is_some()),
                    ("declare", e.declare.is_some()),
                    ("message_id_header", e.message_id_header.is_some()),
                ];
                if let Some((key, _)) = amqp_keys.iter().find(|(_, set)| *set) {
                    return Err(format!(
                        "{key}: only a consumer with source = \"amqp\" reads it (this one has source = \"http\")"
                    ));
                }
                SourceConfig::Http
            }
        };
        Ok(ConsumerConfig {
            name: e.name,
            source,
            concurrency: e.concurrency,
            lease: e.lease,
            max_attempts: e.max_attempts,
            max_sends: e.max_sends,
            redrive_within: e.redrive_within,
            send_deadline: e.send_deadline,
            on_unknown: e.on_unknown,
            key: e.key,
            tenant_header: e.tenant_header,
            effect: match e.effect {
                EffectConfig::Http(mut h) => {
                    if h.not_applied_status.is_none() {
                        h.not_applied_status = Some(default_not_applied(e.max_sends));
                    }
                    EffectConfig::Http(h)
                }
                other => other,
            },
            provider_events: e.provider_events,
            outcomes: e.outcomes,
        })
    }
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
fn default_max_sends() -> u32 {
    3
}
fn default_redrive_within() -> Dur {
    Dur(Duration::from_secs(86_400))
}
fn default_send_deadline() -> Dur {
    Dur(Duration::from_secs(86_400))
}
/// `effect.not_applied_status` when not set: a consumer with `max_sends = 1` says its provider
/// must never get a second request (it ignores keys), and a `503` from a proxy in front of it
/// may follow a request that was applied, so there it is unknown.
fn default_not_applied(max_sends: u32) -> Vec<u16> {
    if max_sends <= 1 {
        crate::effect::NOT_APPLIED_WITHOUT_KEYS.to_vec()
    } else {
        crate::effect::NOT_APPLIED_WITH_KEYS.to_vec()
    }
}
fn default_on_unknown() -> OnUnknown {
    OnUnknown::Reconcile
}
fn default_key() -> String {
    // Keys are unique per provider account: the consumer and the tenant belong in them.
    "{consumer}:{tenant}:{message_id}".into()
}
fn default_true() -> bool {
    true
}

/// `[consumers.effect]`, selected by `kind`. Read by hand rather than as a serde-tagged enum:
/// a tagged enum buffers the table and its errors lose the field (`consumers[0].effect:
/// invalid duration`); this one names it (`consumers[0].effect: timeout: invalid duration`).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum EffectConfig {
    /// An HTTP call to the provider.
    Http(HttpEffectConfig),
    /// An email over SMTP.
    Smtp(SmtpEffectConfig),
    /// An effect the program embedding claimd supplies (`WorkerBuilder::effect`).
    Custom(CustomEffectConfig),
}

impl<'de> Deserialize<'de> for EffectConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(d)?;
        let kind = match table.remove("kind") {
            Some(toml::Value::String(k)) => k,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "kind = {other}: expected \"http\", \"smtp\" or \"custom\""
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
            other => Err(D::Error::unknown_variant(
                other,
                &["http", "smtp", "custom"],
            )),
        }
    }
}

impl EffectConfig {
    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        match self {
            EffectConfig::Http(h) => h.timeout.0,
            EffectConfig::Smtp(s) => s.timeout.0,
            EffectConfig::Custom(c) => c.timeout.0,
        }
    }

    /// The longest idempotency key the provider accepts.
    pub fn max_key_length(&self) -> usize {
        match self {
            EffectConfig::Http(h) => h.max_key_length,
            EffectConfig::Smtp(s) => s.max_key_length,
            EffectConfig::Custom(c) => c.max_key_length,
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
    pub http_version: super::HttpVersion,
    /// Extra headers (secrets allowed via `${VAR}`; never logged).
    #[serde(default, skip_serializing)]
    pub headers: BTreeMap<String, String>,
    /// Status endpoint with `{key}`; enables reconciliation. May name `{message_id}`,
    /// `{tenant}`, `{consumer}` and payload fields too (URL-encoded).
    #[serde(default)]
    pub status_url: String,
    /// How the status endpoint's answer is read.
    #[serde(default)]
    pub status: super::StatusCheck,
    /// How long after the last call a "not found" is trusted (for providers whose status
    /// search lags their writes).
    #[serde(default = "default_not_found_after")]
    pub not_found_after: Dur,
    /// How the request body is built: `passthrough`, `json` or `form`.
    #[serde(default)]
    pub body: super::BodyMode,
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
    pub rate_limit: Option<super::RateLimit>,
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
    pub outcome: Option<Box<super::ValueOutcomes>>,
    /// The provider's own list of objects, for `claimd reconcile --ledger`
    /// (`[consumers.effect.ledger]`). Unset: the consumer has no ledger to reconcile against.
    #[serde(default)]
    pub ledger: Option<Box<super::LedgerConfig>>,
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
    pub rate_limit: Option<super::RateLimit>,
}

impl Default for CustomEffectConfig {
    fn default() -> Self {
        CustomEffectConfig {
            timeout: default_timeout(),
            max_key_length: default_max_key_length(),
            rate_limit: None,
        }
    }
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
