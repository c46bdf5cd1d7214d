//! Validation of a parsed configuration, section by section: each refusal names the key and
//! says why on one line; risky but allowed settings become warnings.

use super::MIN_TOKEN_CHARS;
use super::*;
use crate::domain::claim::KeyTemplate;
use crate::domain::duration::Dur;
use std::collections::BTreeMap;

impl Config {
    pub(super) fn validate(&self, warnings: &mut Vec<String>) -> Result<(), (String, String)> {
        if self.store.max_connections == 0 {
            return Err(("store.max_connections".into(), "must be at least 1".into()));
        }
        if self.store.require_synchronous_standby && self.store.url.starts_with("sqlite:") {
            return Err((
                "store.require_synchronous_standby".into(),
                "SQLite is a single file with no standby: set it only with a PostgreSQL store"
                    .into(),
            ));
        }
        self.validate_read_replica()?;
        if self.store.pooler.per_transaction() && self.store.url.starts_with("sqlite:") {
            return Err((
                "store.pooler".into(),
                "a pooler sits in front of PostgreSQL: set it only with a PostgreSQL store".into(),
            ));
        }
        if self.run.instance == crate::domain::claim::SCHEDULE_OWNER {
            return Err((
                "run.instance".into(),
                "\"schedule\" is the lease owner of scheduled sends; name the instance otherwise"
                    .into(),
            ));
        }
        self.traces.validate()?;
        for (key, p) in [
            ("sandbox.fail_rate", self.sandbox.fail_rate),
            ("sandbox.ambiguous_rate", self.sandbox.ambiguous_rate),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err((
                    key.into(),
                    format!("{p} is not a probability between 0 and 1"),
                ));
            }
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
        let sqlite = self.store.url.starts_with("sqlite:");
        self.retention.validate(&self.consumers, sqlite)?;
        let mut hosts: BTreeMap<String, Vec<(&str, KeyTemplate)>> = BTreeMap::new();
        // Database transactions SQL consumers may hold open at once, each on a store connection.
        let mut in_transactions: Vec<(&str, u32)> = Vec::new();
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
            super::outcomes::check_destinations(&c.outcomes).map_err(|(k, why)| (at(&k), why))?;
            super::follow_ups::check_follow_ups(c, &self.consumers)
                .map_err(|(k, why)| (at(&k), why))?;
            if c.max_attempts == 0 {
                return Err((at("max_attempts"), "must be at least 1".into()));
            }
            if c.max_sends == 0 {
                return Err((
                    at("max_sends"),
                    "must be at least 1 (the first send)".into(),
                ));
            }
            let template: KeyTemplate = c.key.parse().map_err(|e| (at("key"), format!("{e}")))?;
            check_flow(&c.flow).map_err(|(k, why)| (at(k), why))?;
            check_rate_key(&c.effect).map_err(|(k, why)| (at(k), why))?;
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
            if let Some(a) = c.amqp() {
                for (k, v) in [("amqp_url", &a.url), ("queue", &a.queue)] {
                    if v.is_empty() {
                        return Err((at(k), "required when source = \"amqp\"".into()));
                    }
                }
                if a.dead_letter_exchange.is_empty() {
                    return Err((
                        at("dead_letter_exchange"),
                        "required when source = \"amqp\": bad messages need a place to go".into(),
                    ));
                }
                if a.queue.len() > 250 {
                    return Err((
                        at("queue"),
                        "at most 250 bytes (AMQP names are at most 255, and claimd adds \".dead\")"
                            .into(),
                    ));
                }
                if a.dead_letter_exchange.len() > 255 {
                    return Err((at("dead_letter_exchange"), "at most 255 bytes".into()));
                }
                if let Some(other) = self.consumers[..i].iter().find(|o| {
                    o.amqp().is_some_and(|oa| {
                        oa.dead_letter_exchange == a.dead_letter_exchange
                            && (oa.declare || a.declare)
                    })
                }) {
                    return Err((
                        at("dead_letter_exchange"),
                        format!(
                            "{:?} is also consumer {:?}'s: it is a fanout, so each <queue>.dead would receive the other's bad messages; give each consumer its own",
                            a.dead_letter_exchange, other.name
                        ),
                    ));
                }
                if a.prefetch == 0 {
                    return Err((
                        at("prefetch"),
                        "must be at least 1 (0 would let the broker push without limit)".into(),
                    ));
                }
            }
            if let Some(a) = &c.cloudevents_tenant
                && (a.is_empty()
                    || a.len() > 20
                    || !a
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
            {
                return Err((
                    at("cloudevents_tenant"),
                    format!(
                        "{a:?}: a CloudEvents attribute name is 1-20 lower-case letters and digits"
                    ),
                ));
            }
            if let Some(n) = c.nats() {
                n.check().map_err(|(k, why)| (at(k), why))?;
            }
            if let Some(pe) = &c.provider_events {
                let reads_by_value =
                    matches!(&c.effect, EffectConfig::Http(h) if h.outcome.is_some());
                if !reads_by_value {
                    return Err((
                        at("provider_events"),
                        "needs [consumers.effect.outcome]: an event's object is read by the value at its pointer".into(),
                    ));
                }
                if pe.secrets.is_empty() || pe.secrets.iter().any(|s| s.trim().is_empty()) {
                    return Err((
                        at("provider_events.secrets"),
                        "needs at least one signing secret, none empty: unsigned events are never taken".into(),
                    ));
                }
                for (k, p) in [
                    ("provider_events.object_pointer", &pe.object_pointer),
                    ("provider_events.event_id_pointer", &pe.event_id_pointer),
                    ("provider_events.type_pointer", &pe.type_pointer),
                    ("provider_events.message_id_pointer", &pe.message_id_pointer),
                    ("provider_events.tenant_pointer", &pe.tenant_pointer),
                    ("provider_events.consumer_pointer", &pe.consumer_pointer),
                    ("provider_events.key_pointer", &pe.key_pointer),
                ] {
                    check_pointer(p).map_err(|e| (at(k), e))?;
                }
                check_event_naming(pe, &template).map_err(|(k, why)| (at(k), why))?;
                if let Some(other) = self.consumers[..i].iter().find(|o| {
                    o.provider_events
                        .as_ref()
                        .is_some_and(|op| op.secrets.iter().any(|s| pe.secrets.contains(s)))
                }) {
                    // A secret proves which endpoint an event came to; shared, an event signed
                    // for one consumer would be taken as the other's evidence too.
                    return Err((
                        at("provider_events.secrets"),
                        format!(
                            "a secret is also consumer {:?}'s: each consumer's provider events need their own signing secret (one webhook endpoint each)",
                            other.name
                        ),
                    ));
                }
                super::provider_events::check_event_limits(i, pe, self)?;
                crate::provider::provider_events::signature::Verifier::new(
                    pe.scheme,
                    &pe.secrets,
                    pe.tolerance.0,
                )
                .map_err(|e| (at("provider_events.secrets"), e.to_string()))?;
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
                    // Parsed once here, as the effect parses it: URL and status URL templates,
                    // the body template, where the key goes, the status pointers.
                    crate::provider::effect::http::RequestShape::parse(h)
                        .map_err(|(key, why)| (at(&format!("effect.{key}")), why))?;
                    let url = sample_url(&h.url).map_err(|e| {
                        (
                            at("effect.url"),
                            format!("{}: {e}", crate::store::redact_url(&h.url)),
                        )
                    })?;
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
                // Whether it can reconcile is known once the program gives the effect.
                EffectConfig::Custom(_) => {}
                // Atomic with its settle: nothing is ever unknown, whatever on_unknown says.
                EffectConfig::Sql(q) => {
                    if let Err(e) = crate::provider::effect::sql::parse_statement(&q.statement) {
                        return Err((at("effect.statement"), e.to_string()));
                    }
                    in_transactions.push((&c.name, c.concurrency));
                }
                EffectConfig::Smtp(s) => {
                    if s.tls == SmtpTls::None && !s.username.is_empty() {
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
        self.validate_schedules()?;
        if let Some(w) = pool_warning(&in_transactions, self.store.max_connections) {
            warnings.push(w);
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

    /// What the edge needs to be valid: provider header names and values that can be sent
    /// (a value like `"Bearer x\n"` would fail every call).
    pub(super) fn validate_edge(&self) -> Result<(), (String, String)> {
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
        check_tokens(&http.admin_token, &http.intake_token)?;
        check_session_secret(&http.session_secret)?;
        super::tenant_tokens::check(http)?;
        crate::store::check_url(&self.store.url).map_err(|m| ("store.url".to_string(), m))?;
        if !self.store.read_url.is_empty() {
            crate::store::check_url(&self.store.read_url)
                .map_err(|m| ("store.read_url".to_string(), m))?;
        }
        super::features::check(self)?;
        let redact = crate::store::redact_url;
        for (i, c) in self.consumers.iter().enumerate() {
            #[cfg(feature = "amqp")]
            if let Some(a) = c.amqp().filter(|a| !a.url.is_empty()) {
                // lapin's own parse error repeats the whole URL, password included.
                a.url.parse::<lapin::uri::AMQPUri>().map_err(|e| {
                    (
                        format!("consumers[{i}].amqp_url"),
                        format!("{}: not an AMQP URL ({})", redact(&a.url), redact(&e)),
                    )
                })?;
            }
            let EffectConfig::Http(h) = &c.effect else {
                continue;
            };
            sample_url(&h.url).map_err(|e| {
                (
                    format!("consumers[{i}].effect.url"),
                    format!("{}: {e}", redact(&h.url)),
                )
            })?;
            if !h.idempotency_header.is_empty() {
                crate::provider::effect::http::check_header(&h.idempotency_header, "x")
                    .map_err(|m| (format!("consumers[{i}].effect.idempotency_header"), m))?;
            }
            for (name, value) in &h.headers {
                crate::provider::effect::http::check_header(name, value)
                    .map_err(|m| (format!("consumers[{i}].effect.headers.{name}"), m))?;
            }
        }
        Ok(())
    }
}

/// The provider URL a configured `effect.url` makes, its template fields (`{key}`,
/// `{customer_id}`) filled with sample values: the URL is checked, and its host read, before
/// any message exists.
/// Store connections claimd's own work may hold beside database effects' transactions:
/// intake's and settles' group commits, the sweeper, takes of waiting claims.
const OWN_CONNECTIONS: u32 = 4;

/// A warning when SQL consumers' `concurrency` (one store connection per transaction in
/// flight) and claimd's own work need more than `[store] max_connections`: transactions
/// would queue for a connection, and those that wait past the pool's 5 s wait for nothing.
fn pool_warning(sql: &[(&str, u32)], max_connections: u32) -> Option<String> {
    let wanted: u32 = sql.iter().map(|(_, n)| *n).sum();
    if sql.is_empty() || wanted.saturating_add(OWN_CONNECTIONS) <= max_connections {
        return None;
    }
    let names: Vec<&str> = sql.iter().map(|(n, _)| *n).collect();
    Some(format!(
        "SQL consumers {names:?} run up to {wanted} transactions at once (their concurrency), each on a store connection, and claimd's own work needs about {OWN_CONNECTIONS} more, but [store] max_connections = {max_connections}: transactions would wait for a connection; set max_connections to at least {} or lower their concurrency",
        wanted.saturating_add(OWN_CONNECTIONS)
    ))
}

fn sample_url(url: &str) -> Result<reqwest::Url, String> {
    use crate::provider::effect::http_template::encode_path_segment;
    use crate::provider::effect::http_template::{Template, Vars};
    let template = Template::parse(url)?;
    crate::provider::effect::http_template::url_segments::PathFields::of(&template)
        .map_err(|e| e.to_string())?;
    let vars = Vars {
        key: "k",
        message_id: "m",
        tenant: "t",
        consumer: "c",
        payload: None,
    };
    reqwest::Url::parse(&template.render_sample(&vars, encode_path_segment))
        .map_err(|e| e.to_string())
}

/// The bearer tokens: each empty (no authentication) or at least [`MIN_TOKEN_CHARS`] long,
/// and not the same as the other: an intake client holding the admin token could resolve and
/// redrive claims. Messages never show a token.
fn check_tokens(admin: &str, intake: &str) -> Result<(), (String, String)> {
    for (key, token) in [("http.admin_token", admin), ("http.intake_token", intake)] {
        let n = token.chars().count();
        if n > 0 && n < MIN_TOKEN_CHARS {
            return Err((
                key.into(),
                format!(
                    "is {n} characters; a token must have at least {MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 24`), or be empty for none; the value is not shown"
                ),
            ));
        }
    }
    if !admin.is_empty() && admin == intake {
        return Err((
            "http.intake_token".into(),
            "is the same as http.admin_token: every intake client could act as an operator; use two different tokens".into(),
        ));
    }
    Ok(())
}

/// `[http] session_secret`: empty, or at least [`MIN_SESSION_SECRET_CHARS`] characters (it
/// signs every operator's session).
fn check_session_secret(secret: &str) -> Result<(), (String, String)> {
    let n = secret.chars().count();
    if n > 0 && n < MIN_SESSION_SECRET_CHARS {
        return Err((
            "http.session_secret".into(),
            format!(
                "is {n} characters; it must have at least {MIN_SESSION_SECRET_CHARS} (e.g. `openssl rand -hex 32`), or be empty; the value is not shown"
            ),
        ));
    }
    Ok(())
}

/// Shortest `[http] session_secret` accepted.
pub const MIN_SESSION_SECRET_CHARS: usize = 32;

/// A consumer's `effect.rate_limit_key` and `effect.rate_limit_keys`.
fn check_rate_key(effect: &super::EffectConfig) -> Result<(), (&'static str, String)> {
    let (ceiling, key, keys) = effect.rate_limits();
    if let Some(key) = key {
        key.parse::<crate::domain::order_key::OrderKeyTemplate>()
            .map_err(|e| ("effect.rate_limit_key", e.to_string()))?;
        if ceiling.is_none() {
            return Err((
                "effect.rate_limit_key",
                "needs effect.rate_limit: the ceiling each key is paced to".into(),
            ));
        }
    }
    if keys == Some(0) {
        return Err(("effect.rate_limit_keys", "must be at least 1".into()));
    }
    if keys.is_some() && key.is_none() {
        return Err((
            "effect.rate_limit_keys",
            "read only with effect.rate_limit_key".into(),
        ));
    }
    Ok(())
}

/// A consumer's `order_key`, `fairness` and `tenant_weights`.
fn check_flow(flow: &super::FlowConfig) -> Result<(), (&'static str, String)> {
    if let Some(key) = &flow.order_key {
        key.parse::<crate::domain::order_key::OrderKeyTemplate>()
            .map_err(|e| ("order_key", e.to_string()))?;
    }
    if flow.fairness != super::Fairness::Tenant && !flow.tenant_weights.is_empty() {
        return Err((
            "tenant_weights",
            "read only with fairness = \"tenant\"".into(),
        ));
    }
    if let Some((tenant, w)) = flow
        .tenant_weights
        .iter()
        .find(|(_, w)| !(1..=1000).contains(*w))
    {
        return Err((
            "tenant_weights",
            format!("{tenant:?} = {w}: a weight is a whole number from 1 to 1000"),
        ));
    }
    Ok(())
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

/// Whether the pointers of `[consumers.provider_events]` can name a claim whose provider id is
/// not known yet by its full key (invariant I9): message id, tenant (when the key template has
/// `{tenant}`) and consumer. Setting none of them is allowed (only the provider's object id
/// names a claim then); setting some that can never name a claim is refused.
fn check_event_naming(
    pe: &ProviderEventsConfig,
    template: &KeyTemplate,
) -> Result<(), (&'static str, String)> {
    if !pe.reads_keys() {
        if !pe.tenant_pointer.is_empty() || !pe.consumer_pointer.is_empty() {
            return Err((
                "provider_events.message_id_pointer",
                "required with tenant_pointer or consumer_pointer (or set key_pointer): they name a claim only with its message id".into(),
            ));
        }
        return Ok(());
    }
    let by_key = !pe.key_pointer.is_empty();
    if template.mentions_tenant() && pe.tenant_pointer.is_empty() && !by_key {
        return Err((
            "provider_events.tenant_pointer",
            "required: the key has {tenant}, so an object must carry its tenant (or set key_pointer to the key it carries); a missing tenant is never taken as \"\"".into(),
        ));
    }
    if pe.consumer_pointer.is_empty() && !(by_key && template.mentions_consumer()) {
        return Err((
            "provider_events.consumer_pointer",
            "required: nothing else binds an object to this consumer (set key_pointer with {consumer} in the key, or consumer_pointer); one provider account delivers every consumer's events to every endpoint".into(),
        ));
    }
    Ok(())
}

impl TracesConfig {
    /// `[traces]`: an `http(s)://` endpoint with a host, a service name, an export period
    /// between 100 ms and 1 minute.
    fn validate(&self) -> Result<(), (String, String)> {
        if self.is_on() {
            let url = reqwest::Url::parse(&self.endpoint).map_err(|e| {
                (
                    "traces.endpoint".to_string(),
                    format!("{:?} is not a URL: {e}", self.endpoint),
                )
            })?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err((
                    "traces.endpoint".into(),
                    format!(
                        "{:?}: give the OTLP/HTTP traces URL, as http://host:4318/v1/traces",
                        self.endpoint
                    ),
                ));
            }
        }
        if self.service_name.trim().is_empty() {
            return Err(("traces.service_name".into(), "must not be empty".into()));
        }
        let every = self.export_every.0;
        if every < std::time::Duration::from_millis(100)
            || every > std::time::Duration::from_secs(60)
        {
            return Err((
                "traces.export_every".into(),
                format!("{every:?}: give between 100ms and 60s"),
            ));
        }
        Ok(())
    }
}

impl Config {
    /// `[store] read_url` and its companions: PostgreSQL only, on both sides.
    fn validate_read_replica(&self) -> Result<(), (String, String)> {
        let store = &self.store;
        if store.read_max_connections == 0 {
            return Err((
                "store.read_max_connections".into(),
                "must be at least 1".into(),
            ));
        }
        if store.read_url.is_empty() {
            return Ok(());
        }
        if store.url.starts_with("sqlite:") {
            return Err((
                "store.read_url".into(),
                "SQLite is a single file with no replica: set it only with a PostgreSQL store"
                    .into(),
            ));
        }
        if !(store.read_url.starts_with("postgres://")
            || store.read_url.starts_with("postgresql://"))
        {
            return Err((
                "store.read_url".into(),
                format!(
                    "{}: a read replica is a PostgreSQL standby (postgres://...)",
                    crate::store::redact_url(&store.read_url)
                ),
            ));
        }
        Ok(())
    }
}
