//! The configuration's shape: one struct per section, with the defaults `config/default.toml`
//! documents. Unknown keys are refused (`deny_unknown_fields`).

use super::retention::RetentionConfig;
use super::sources::{AmqpSourceConfig, NatsSourceConfig, Source, SourceConfig, source_name};
use crate::domain::duration::Dur;
use crate::provider::effect::settings::EffectConfig;
use crate::provider::provider_events::settings::ProviderEventsConfig;
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
    /// OpenTelemetry traces (off unless `endpoint` is set).
    #[serde(default)]
    pub traces: TracesConfig,
    /// Encryption at rest (off unless `enabled`).
    #[serde(default)]
    pub encryption: super::EncryptionConfig,
    /// The consumers: one per kind of side effect.
    #[serde(default)]
    pub consumers: Vec<ConsumerConfig>,
    /// Periodic effects: a message to a consumer at each slot of a cron expression.
    #[serde(default)]
    pub schedules: Vec<super::ScheduleConfig>,
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
    /// PostgreSQL only: `claimd run` refuses to start, and intake to take messages, unless
    /// every commit waits for a synchronous standby (docs/postgresql.md, "Replication: when an
    /// acknowledged claim can be lost"). Default `false`.
    #[serde(default)]
    pub require_synchronous_standby: bool,
    /// PostgreSQL only: a read replica (a hot standby) that operators' claim searches, reports
    /// and ledger reads run on, so they never load the primary (docs/postgresql.md, "A read
    /// replica for operators"). Empty (the default): they read the primary.
    #[serde(default)]
    pub read_url: String,
    /// Connections to the read replica at most (default 4).
    #[serde(default = "default_read_max_connections")]
    pub read_max_connections: u32,
    /// When the read replica cannot be read: `"primary"` (the default: the read runs on the
    /// primary, one at a time, and says so) or `"refuse"` (answered busy).
    #[serde(default)]
    pub read_fallback: crate::store::read_replica::ReadFallback,
    /// PostgreSQL only: what sits between claimd and the database. `"transaction"`: a pooler
    /// in transaction mode (PgBouncer `pool_mode = transaction`, RDS Proxy), through which
    /// claimd uses no session state (docs/postgresql.md, "Poolers"). Default `"none"` (also
    /// right for a pooler in session mode).
    #[serde(default)]
    pub pooler: crate::store::pooler::Pooler,
}

fn default_max_connections() -> u32 {
    16
}

fn default_read_max_connections() -> u32 {
    4
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
    /// The key of the operator page's session cookies when `admin_token` is empty (personal
    /// operator accounts without a break-glass token); with an admin token set, the token is
    /// the key and this is not used.
    #[serde(skip_serializing)]
    pub session_secret: String,
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
            session_secret: String::new(),
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
    /// How long an effect a message asked to be `processing` (`"sandbox": "processing"`) stays
    /// so before it succeeds.
    pub processing_for: Dur,
    /// Where the end of a `processing` effect is announced as a signed event (claimd's
    /// `/v1/provider-events/{consumer}`); empty: nowhere (a status lookup finds it).
    pub webhook_url: String,
    /// The secret the events are signed with (`Stripe-Signature`).
    #[serde(skip_serializing)]
    pub webhook_secret: String,
}

impl SandboxConfig {
    /// The provider shape these settings give (the default one, with its events).
    pub fn modes(&self) -> crate::provider::sandbox::SandboxModes {
        crate::provider::sandbox::SandboxModes {
            processing_for: Some(self.processing_for.0),
            webhook: (!self.webhook_url.is_empty()).then(|| {
                crate::provider::sandbox::SandboxWebhook {
                    url: self.webhook_url.clone(),
                    secret: self.webhook_secret.clone(),
                }
            }),
            ..Default::default()
        }
    }
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
            processing_for: Dur(crate::provider::sandbox::DEFAULT_PROCESSING_FOR),
            webhook_url: String::new(),
            webhook_secret: String::new(),
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

/// `[traces]`: one trace per message, sent over OTLP/HTTP (docs/traces.md). Off unless
/// `endpoint` is set.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracesConfig {
    /// The OTLP/HTTP traces URL, path included (`http://127.0.0.1:4318/v1/traces`); empty:
    /// no traces.
    pub endpoint: String,
    /// The spans' `service.name` (default `claimd`).
    pub service_name: String,
    /// The longest a finished span waits before it is sent (default 2s; a full batch of 512
    /// goes at once).
    pub export_every: Dur,
}

impl Default for TracesConfig {
    fn default() -> Self {
        TracesConfig {
            endpoint: String::new(),
            service_name: "claimd".into(),
            export_every: Dur(Duration::from_secs(2)),
        }
    }
}

impl TracesConfig {
    /// Whether traces are on.
    pub fn is_on(&self) -> bool {
        !self.endpoint.is_empty()
    }
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
    /// The CloudEvents extension attribute carrying the tenant on `POST /v1/events/{consumer}`
    /// (`cloudevents_tenant`); `None`: the tenant header, as on `/v1/messages`.
    pub cloudevents_tenant: Option<String>,
    /// The side effect.
    pub effect: EffectConfig,
    /// The provider's signed events about this consumer's effects (webhooks), received at
    /// `POST /v1/provider-events/{consumer}` (`[consumers.provider_events]`).
    pub provider_events: Option<ProviderEventsConfig>,
    /// Where this consumer's outcome events go (`[consumers.outcomes]`, or several as
    /// `[[consumers.outcomes]]`); empty: no events.
    pub outcomes: Vec<super::OutcomesConfig>,
    /// Order keys and fair taking (docs/flow-control.md): `order_key`, `order_hold`,
    /// `fairness`, `[consumers.tenant_weights]`.
    #[serde(flatten)]
    pub flow: FlowConfig,
    /// `payload_retention`: how long after its last change a finished (`completed`, `failed`)
    /// claim keeps its payload, provider answer and error; then retention erases them (the
    /// row and its fingerprint stay). `None`: until the row is pruned.
    pub payload_retention: Option<Dur>,
    /// `sensitive_fields`: JSON pointers (`/card/number`) of payload fields masked wherever
    /// claimd shows a payload, on top of the default names of
    /// [`redaction`](crate::domain::redaction).
    pub sensitive_fields: Vec<String>,
    /// `generation`: raised by the operator when a changed configuration of this consumer
    /// must not be performed by instances still running the old one (a rolling upgrade,
    /// docs/operations.md): once an instance with a higher generation registers, the others
    /// take no claim of the consumer and stop. Default 0.
    pub generation: u32,
    /// `[[consumers.follow_ups]]`: the claims this consumer's settles create for other
    /// consumers (docs/follow-ups.md); empty: none.
    pub follow_ups: Vec<super::FollowUpConfig>,
}

/// A consumer's flow control, read from its flat keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FlowConfig {
    /// `order_key`: the template naming the entity a message is about (`{order_id}`); claims
    /// with equal keys (and tenant) run one at a time, in the order they were claimed.
    pub order_key: Option<String>,
    /// `order_hold`: what a claim of a line that is `pending` or `needs_attention` does to
    /// the claims behind it.
    pub order_hold: OrderHold,
    /// `fairness`: the order waiting claims are taken in.
    pub fairness: Fairness,
    /// `[consumers.tenant_weights]`: with `fairness = "tenant"`, claims a tenant gets per
    /// round (default 1).
    pub tenant_weights: BTreeMap<String, u32>,
}

/// `order_hold`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderHold {
    /// A pending or parked claim holds the claims behind it until it is settled or resolved.
    #[default]
    Hold,
    /// The claims behind it go ahead; each says whom it went past in its history.
    Skip,
}

/// `fairness`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fairness {
    /// Oldest first, whatever the tenant.
    #[default]
    Oldest,
    /// Round-robin over the tenants with waiting claims, weighted by `tenant_weights`.
    Tenant,
}

impl ConsumerConfig {
    /// The RabbitMQ settings, when `source = "amqp"`.
    pub fn amqp(&self) -> Option<&AmqpSourceConfig> {
        match &self.source {
            SourceConfig::Amqp(a) => Some(a),
            _ => None,
        }
    }

    /// The NATS JetStream settings, when `source = "nats"`.
    pub fn nats(&self) -> Option<&NatsSourceConfig> {
        match &self.source {
            SourceConfig::Nats(n) => Some(n),
            _ => None,
        }
    }
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
    nats_url: Option<String>,
    stream: Option<String>,
    subject: Option<String>,
    durable: Option<String>,
    dead_letter_subject: Option<String>,
    max_deliver: Option<u32>,
    ack_wait: Option<Dur>,
    #[serde(default)]
    tenant_header: String,
    cloudevents_tenant: Option<String>,
    effect: EffectConfig,
    provider_events: Option<ProviderEventsConfig>,
    #[serde(default)]
    outcomes: super::outcomes::OutcomeDestinations,
    order_key: Option<String>,
    #[serde(default)]
    order_hold: OrderHold,
    #[serde(default)]
    fairness: Fairness,
    #[serde(default)]
    tenant_weights: BTreeMap<String, u32>,
    payload_retention: Option<Dur>,
    #[serde(default)]
    sensitive_fields: Vec<String>,
    #[serde(default)]
    generation: u32,
    #[serde(default)]
    follow_ups: Vec<super::FollowUpConfig>,
}

impl TryFrom<ConsumerEntry> for ConsumerConfig {
    type Error = String;

    fn try_from(e: ConsumerEntry) -> Result<Self, String> {
        if e.payload_retention.as_ref().is_some_and(|d| d.0.is_zero()) {
            return Err(format!(
                "consumer {:?}: payload_retention must be more than zero (leave it out to keep payloads until retention prunes the claim)",
                e.name
            ));
        }
        crate::domain::redaction::check_pointers(&e.sensitive_fields)
            .map_err(|why| format!("consumer {:?}: sensitive_fields: {why}", e.name))?;
        // Which sources read each source-specific key; a key set for another source is refused.
        let keys: [(&str, bool, &[Source]); 14] = [
            (
                "cloudevents_tenant",
                e.cloudevents_tenant.is_some(),
                &[Source::Http],
            ),
            ("amqp_url", e.amqp_url.is_some(), &[Source::Amqp]),
            ("queue", e.queue.is_some(), &[Source::Amqp]),
            (
                "dead_letter_exchange",
                e.dead_letter_exchange.is_some(),
                &[Source::Amqp],
            ),
            (
                "prefetch",
                e.prefetch.is_some(),
                &[Source::Amqp, Source::Nats],
            ),
            (
                "declare",
                e.declare.is_some(),
                &[Source::Amqp, Source::Nats],
            ),
            (
                "message_id_header",
                e.message_id_header.is_some(),
                &[Source::Amqp, Source::Nats],
            ),
            ("nats_url", e.nats_url.is_some(), &[Source::Nats]),
            ("stream", e.stream.is_some(), &[Source::Nats]),
            ("subject", e.subject.is_some(), &[Source::Nats]),
            ("durable", e.durable.is_some(), &[Source::Nats]),
            (
                "dead_letter_subject",
                e.dead_letter_subject.is_some(),
                &[Source::Nats],
            ),
            ("max_deliver", e.max_deliver.is_some(), &[Source::Nats]),
            ("ack_wait", e.ack_wait.is_some(), &[Source::Nats]),
        ];
        if let Some((key, _, readers)) = keys
            .iter()
            .find(|(_, set, readers)| *set && !readers.contains(&e.source))
        {
            let readers: Vec<String> = readers
                .iter()
                .map(|r| format!("source = \"{}\"", source_name(*r)))
                .collect();
            return Err(format!(
                "{key}: only a consumer with {} reads it (this one has source = \"{}\")",
                readers.join(" or "),
                source_name(e.source)
            ));
        }
        let source = match e.source {
            Source::Amqp => SourceConfig::Amqp(AmqpSourceConfig {
                url: e.amqp_url.unwrap_or_default(),
                queue: e.queue.unwrap_or_default(),
                prefetch: e.prefetch.unwrap_or(64),
                dead_letter_exchange: e.dead_letter_exchange.unwrap_or_default(),
                declare: e.declare.unwrap_or(true),
                message_id_header: e.message_id_header.unwrap_or_default(),
            }),
            Source::Nats => SourceConfig::Nats(NatsSourceConfig {
                url: e.nats_url.unwrap_or_default(),
                stream: e.stream.unwrap_or_default(),
                subject: e.subject.unwrap_or_default(),
                durable: e.durable.unwrap_or_else(|| format!("claimd-{}", e.name)),
                dead_letter_subject: e.dead_letter_subject.unwrap_or_default(),
                max_deliver: e.max_deliver.unwrap_or(5),
                ack_wait: e.ack_wait.unwrap_or(Dur(Duration::from_secs(30))),
                prefetch: e.prefetch.unwrap_or(64),
                declare: e.declare.unwrap_or(true),
                message_id_header: e
                    .message_id_header
                    .unwrap_or_else(|| "Nats-Msg-Id".to_string()),
            }),
            Source::Http => SourceConfig::Http,
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
            cloudevents_tenant: e.cloudevents_tenant,
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
            outcomes: e.outcomes.0,
            flow: FlowConfig {
                order_key: e.order_key,
                order_hold: e.order_hold,
                fairness: e.fairness,
                tenant_weights: e.tenant_weights,
            },
            payload_retention: e.payload_retention,
            sensitive_fields: e.sensitive_fields,
            generation: e.generation,
            follow_ups: e.follow_ups,
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
        crate::provider::effect::NOT_APPLIED_WITHOUT_KEYS.to_vec()
    } else {
        crate::provider::effect::NOT_APPLIED_WITH_KEYS.to_vec()
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
