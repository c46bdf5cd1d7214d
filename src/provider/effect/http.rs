//! The HTTP effect: one request per attempt, shaped as configured (the payload verbatim, or a
//! JSON or form body from a template; the idempotency key in a header and/or the body), and a
//! status lookup read by [`http_status`](super::http_status). Secrets (configured headers, URL query strings) never reach logs or errors.

use super::http_answer::{Read, describe, never_processed, outcome_of, read_bounded};
use super::http_status::read_answer;
use super::http_template::{
    BodyTemplate, Field, RenderError, Template, Vars, encode_path_segment, form_encode,
};
use super::{Effect, Lookup, MAX_READ_BYTES, MAX_RESPONSE_BYTES, Outcome};
use crate::domain::claim::Claim;
use crate::provider::effect::settings::{
    BodyMode, HttpEffectConfig, HttpVersion, ProbeMode, StatusCheck, ValueOutcomes,
};
use crate::store::truncate;
use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Client, Method, Url};
use std::time::Duration;

mod url_check;

/// Why an HTTP effect cannot be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum HttpEffectError {
    /// A configured header name or value is not valid HTTP.
    #[error("header {0:?} is not a valid HTTP header")]
    BadHeader(String),
    /// The HTTP client could not be built.
    #[error("cannot build HTTP client: {0}")]
    Client(String),
    /// The URL, templates or key placement are unusable (the message names the key).
    #[error("{0}")]
    Shape(String),
}

/// Checks one configured provider header, as configuration validation does before anything
/// starts: the name must be a valid header name and the value a valid header value (no line
/// breaks or other control characters). The message never contains the value (it is usually a
/// secret).
pub fn check_header(name: &str, value: &str) -> Result<(), String> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a valid HTTP header name"))?;
    HeaderValue::from_str(value).map_err(|_| {
        "the value is not a valid HTTP header value (a line break or other control character, \
         often a trailing newline from a secret file); the value is not shown"
            .to_string()
    })?;
    Ok(())
}

/// The parts of an HTTP effect's configuration parsed once, at config load and when the
/// effect is built: the method, the URL (parsed, or a template), the status URL template, the
/// body template, the key header. An error names the configuration key (`effect.url`).
#[derive(Debug, Clone)]
pub struct RequestShape {
    method: Method,
    url: Target,
    idem_header: Option<HeaderName>,
    status_url: Option<Template>,
    body: BodyMode,
    body_template: Option<BodyTemplate>,
    paths: url_check::UrlPaths,
}

/// Where a request goes: a URL parsed once, or a template rendered per message.
#[derive(Debug, Clone)]
enum Target {
    Fixed(Url),
    Template(Template),
}

impl RequestShape {
    /// Parses the shape of `[consumers.effect]`; `Err((key, why))` names the key under
    /// `effect.`.
    pub fn parse(config: &HttpEffectConfig) -> Result<RequestShape, (&'static str, String)> {
        let method = Method::from_bytes(config.method.as_bytes()).map_err(|_| {
            (
                "method",
                format!("{:?} is not an HTTP method", config.method),
            )
        })?;
        let url_template = Template::parse(&config.url).map_err(|e| ("url", e))?;
        let url_paths = url_check::paths_of("url", &url_template)?;
        let url = if url_template.fields().next().is_none() {
            Target::Fixed(Url::parse(&config.url).map_err(|e| ("url", e.to_string()))?)
        } else {
            // Checked with sample values (payload fields included), so a template that cannot
            // make a URL fails now.
            let sample = url_template.render_sample(&SAMPLE, encode_path_segment);
            Url::parse(&sample).map_err(|e| ("url", format!("{e} (with sample values)")))?;
            Target::Template(url_template)
        };
        let idem_header = match config.idempotency_header.as_str() {
            "" => None,
            h => Some(HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                (
                    "idempotency_header",
                    format!("{h:?} is not a valid HTTP header name"),
                )
            })?),
        };
        let status_url = match config.status_url.as_str() {
            "" => None,
            u => {
                let t = Template::parse(u).map_err(|e| ("status_url", e))?;
                url_check::paths_of("status_url", &t)?;
                if !t.fields().any(|f| *f == Field::Key) {
                    return Err(("status_url", "must contain {key}".into()));
                }
                let sample = t.render_sample(&SAMPLE, encode_path_segment);
                Url::parse(&sample)
                    .map_err(|e| ("status_url", format!("{e} (with sample values)")))?;
                Some(t)
            }
        };
        let body_template = match (config.body, &config.body_template) {
            (BodyMode::Passthrough, None) => None,
            (BodyMode::Passthrough, Some(_)) => {
                return Err((
                    "body_template",
                    "is only used with body = \"json\" or \"form\"".into(),
                ));
            }
            (_, None) => {
                return Err((
                    "body_template",
                    "is required with body = \"json\" or \"form\"".into(),
                ));
            }
            (mode, Some(v)) => {
                if !v.is_object() {
                    return Err(("body_template", "must be a table".into()));
                }
                let t = BodyTemplate::parse(v).map_err(|e| ("body_template", e))?;
                if mode == BodyMode::Form && has_null(v) {
                    return Err((
                        "body_template",
                        "a form body has no null; leave the field out".into(),
                    ));
                }
                Some(t)
            }
        };
        let shape = RequestShape {
            method,
            url,
            idem_header,
            paths: url_check::UrlPaths::new(url_paths, status_url.as_ref()),
            status_url,
            body: config.body,
            body_template,
        };
        if shape.idem_header.is_none() && !shape.sends_key_elsewhere() {
            return Err((
                "idempotency_header",
                "is empty, and neither the URL nor the body template contains {key}: the provider would never see the key".into(),
            ));
        }
        for (key, pointer) in [
            ("status.found_pointer", &config.status.found_pointer),
            ("status.id_pointer", &config.status.id_pointer),
        ] {
            crate::provider::effect::settings::check_pointer(pointer).map_err(|e| (key, e))?;
        }
        if let Some(o) = &config.outcome {
            o.check().map_err(|(key, e)| {
                (
                    match key {
                        "pointer" => "outcome.pointer",
                        "completed" => "outcome.completed",
                        "pending" => "outcome.pending",
                        "needs_attention" => "outcome.needs_attention",
                        "failed" => "outcome.failed",
                        "id_pointer" => "outcome.id_pointer",
                        "reason_pointer" => "outcome.reason_pointer",
                        "pending_poll" => "outcome.pending_poll",
                        _ => "outcome.pending_for",
                    },
                    e,
                )
            })?;
        }
        if let Some(l) = &config.ledger {
            l.check()?;
        }
        if let Some(proof) = &config.non_receipt_status {
            let retried = config
                .not_applied_status
                .as_deref()
                .unwrap_or(&crate::provider::effect::NOT_APPLIED_WITH_KEYS);
            // Proof of non-receipt must also be an answer retried with the same key: a status
            // outside `not_applied_status` is an unknown outcome or a rejection, never "not
            // received".
            if let Some(s) = proof.iter().find(|s| !retried.contains(s)) {
                return Err((
                    "non_receipt_status",
                    format!(
                        "{s} is not in effect.not_applied_status ({retried:?}): only an answer retried with the same key can prove the provider never received the call"
                    ),
                ));
            }
        }
        Ok(shape)
    }

    fn templates(&self) -> impl Iterator<Item = &Template> {
        let url = match &self.url {
            Target::Template(t) => Some(t),
            Target::Fixed(_) => None,
        };
        url.into_iter()
            .chain(self.status_url.iter())
            .chain(self.body_template.iter().flat_map(|b| b.templates()))
    }

    fn sends_key_elsewhere(&self) -> bool {
        let url = match &self.url {
            Target::Template(t) => Some(t),
            Target::Fixed(_) => None,
        };
        url.into_iter()
            .chain(self.body_template.iter().flat_map(|b| b.templates()))
            .any(|t| t.fields().any(|f| *f == Field::Key))
    }

    /// Whether any template names a payload field (then the payload must be a JSON object).
    pub fn needs_payload(&self) -> bool {
        self.templates().any(Template::needs_payload)
    }

    /// The request's URL for a claim.
    fn url(&self, vars: &Vars<'_>) -> Result<Url, String> {
        match &self.url {
            Target::Fixed(u) => Ok(u.clone()),
            Target::Template(t) => {
                let text = t
                    .render(vars, encode_path_segment)
                    .map_err(|e| e.to_string())?;
                Url::parse(&text).map_err(|e| format!("the rendered URL is not valid: {e}"))
            }
        }
    }

    /// The body and its content type for a claim (pass-through: the message's own).
    fn body(&self, claim: &Claim, vars: &Vars<'_>) -> Result<(Bytes, String), RenderError> {
        let Some(template) = &self.body_template else {
            return Ok((claim.payload.clone(), claim.content_type.clone()));
        };
        let value = template.render(vars)?;
        Ok(match self.body {
            BodyMode::Form => (
                Bytes::from(form_encode(&value)),
                "application/x-www-form-urlencoded".into(),
            ),
            _ => (Bytes::from(value.to_string()), "application/json".into()),
        })
    }
}

fn has_null(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Null => true,
        serde_json::Value::Object(m) => m.values().any(has_null),
        serde_json::Value::Array(a) => a.iter().any(has_null),
        _ => false,
    }
}

/// Values a template is checked with at config load.
const SAMPLE: Vars<'static> = Vars {
    key: "k",
    message_id: "m",
    tenant: "t",
    consumer: "c",
    payload: None,
};

/// The values for a claim's templates; `payload` is the claim's payload parsed when needed.
fn vars<'a>(claim: &'a Claim, payload: Option<&'a serde_json::Value>) -> Vars<'a> {
    Vars {
        key: &claim.idem_key,
        message_id: &claim.message_id,
        tenant: &claim.tenant,
        consumer: &claim.consumer,
        payload,
    }
}

/// The configured headers (`effect.headers`), each marked sensitive so that no debug output
/// prints it.
pub fn header_map(
    configured: &std::collections::BTreeMap<String, String>,
) -> Result<HeaderMap, HttpEffectError> {
    let mut headers = HeaderMap::new();
    for (name, value) in configured {
        let n = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| HttpEffectError::BadHeader(name.clone()))?;
        let mut v =
            HeaderValue::from_str(value).map_err(|_| HttpEffectError::BadHeader(name.clone()))?;
        v.set_sensitive(true);
        headers.insert(n, v);
    }
    Ok(headers)
}

/// Calls a provider over HTTP.
#[derive(Debug, Clone)]
pub struct HttpEffect {
    client: Client,
    shape: RequestShape,
    headers: HeaderMap,
    status: StatusCheck,
    not_found_after: Duration,
    /// `effect.not_applied_status`: the statuses retried later with the same key.
    not_applied: Box<[u16]>,
    /// `effect.non_receipt_status`: of those, the ones that prove the call never arrived.
    non_receipt: Box<[u16]>,
    /// `[effect.outcome]`: the outcome by the value in the answer.
    outcomes: Option<Box<ValueOutcomes>>,
}

impl HttpEffect {
    /// Builds the effect from `[consumers.effect]`.
    pub fn new(config: &HttpEffectConfig) -> Result<Self, HttpEffectError> {
        let shape = RequestShape::parse(config)
            .map_err(|(key, why)| HttpEffectError::Shape(format!("effect.{key}: {why}")))?;
        let headers = header_map(&config.headers)?;
        let builder = crate::provider::tls::http_client_builder()
            .timeout(config.timeout.0)
            .connect_timeout(config.timeout.0.min(Duration::from_secs(5)))
            .pool_max_idle_per_host(256)
            // A redirect is the provider's answer, never followed: reqwest would re-send a
            // POST as a GET for 301/302/303 and read the page it lands on (a `200` there
            // would settle an effect that never happened, a login page would read as "found").
            // A 3xx is an unknown outcome, and a refusal at the start-up probe.
            .redirect(reqwest::redirect::Policy::none())
            // No retries inside the client: claimd retries (with the same key, in its history
            // and metrics) what `never_processed` shows was not processed, and reqwest's retry
            // layer keeps a copy of every request's headers while it is in flight (about
            // 0.3 KiB a call; docs/performance.md, round four). Lookups are asked again in
            // `ask`.
            .retry(reqwest::retry::never().max_retries_per_request(0));
        // HTTP/1.1 unless asked: only then, with the `http2` feature compiled in, would reqwest
        // offer h2 in TLS negotiation, moving every call to one connection unasked.
        let builder = match config.http_version {
            HttpVersion::Http1 => builder.http1_only(),
            // Pings while calls are open, so a connection that went silent is dropped
            // before every call on it waits out its timeout.
            HttpVersion::Http2 => builder
                .http2_prior_knowledge()
                .http2_keep_alive_interval(Duration::from_secs(10))
                .http2_keep_alive_timeout(Duration::from_secs(10)),
        };
        let client = builder
            .build()
            .map_err(|e| HttpEffectError::Client(e.to_string()))?;
        Ok(HttpEffect {
            not_applied: config
                .not_applied_status
                .clone()
                .unwrap_or_else(|| crate::provider::effect::NOT_APPLIED_WITH_KEYS.to_vec())
                .into(),
            non_receipt: config
                .non_receipt_status
                .clone()
                .unwrap_or_else(|| crate::provider::effect::NON_RECEIPT_STATUS.to_vec())
                .into(),
            client,
            shape,
            headers,
            status: config.status.clone(),
            not_found_after: config.not_found_after.0,
            outcomes: config.outcome.clone(),
        })
    }

    /// The claim's payload as JSON, when a template needs its fields.
    fn payload(&self, claim: &Claim) -> Result<Option<serde_json::Value>, String> {
        if !self.shape.needs_payload() {
            return Ok(None);
        }
        serde_json::from_slice(&claim.payload)
            .map(Some)
            .map_err(|e| {
                format!("the payload is not JSON ({e}); the request template needs its fields")
            })
    }

    /// One GET of the status endpoint for `vars`, read as the configuration says.
    async fn ask(&self, template: &Template, vars: &Vars<'_>) -> Lookup {
        let url = match self.shape.paths.status_url(template, vars) {
            Ok(u) => u,
            Err(e) => {
                return Lookup::Unknown {
                    error: format!("status_url: {e}"),
                };
            }
        };
        // A lookup changes nothing at the provider, so one that an HTTP/2 provider did not
        // process (`never_processed`) is asked again at once, up to twice, as reqwest's own
        // retry layer did before it was turned off for the payments' sake.
        let mut left = 2;
        let answer = loop {
            let mut request = self.client.get(&url).headers(self.headers.clone());
            if let Some(h) = &self.shape.idem_header {
                request = request.header(h, vars.key);
            }
            match request.send().await {
                Err(e) if left > 0 && never_processed(&e) => left -= 1,
                answer => break answer,
            }
        };
        match answer {
            Err(e) => Lookup::Unknown {
                error: format!("status endpoint {}", describe(&e)),
            },
            Ok(r) => {
                let status = r.status().as_u16();
                let reads_body = !self.status.found_pointer.is_empty()
                    || !self.status.id_pointer.is_empty()
                    || self.outcomes.is_some();
                let body = match read_bounded(r).await {
                    Ok(Read::Whole(body)) => body,
                    // Read only to decide by its content: too long to read is no answer.
                    Ok(Read::TooLong(_)) if reads_body && (200..300).contains(&status) => {
                        return Lookup::Unknown {
                            error: format!(
                                "status endpoint answered {status} with an answer longer than {} KiB, not read: no decision",
                                MAX_READ_BYTES / 1024
                            ),
                        };
                    }
                    Ok(Read::TooLong(start)) => start,
                    Err(_) => Bytes::new(),
                };
                let mut answer = read_answer(&self.status, status, &body);
                // The whole answer goes on only when it is read by value (then it is cut for
                // storage when settled); otherwise what is kept is what is stored.
                if let Lookup::Found { response, .. } = &mut answer
                    && self.outcomes.is_none()
                {
                    *response = truncate(response, MAX_RESPONSE_BYTES);
                }
                answer
            }
        }
    }

    /// Builds the claim's request and sends it; `Err` is the outcome when it cannot be built
    /// (nothing was sent).
    fn send(
        &self,
        claim: &Claim,
    ) -> Result<impl Future<Output = reqwest::Result<reqwest::Response>> + use<>, Outcome> {
        let built = self.payload(claim).and_then(|payload| {
            let vars = vars(claim, payload.as_ref());
            self.shape.paths.check_url(&vars)?;
            let url = self.shape.url(&vars)?;
            let body = self.shape.body(claim, &vars).map_err(|e| e.to_string())?;
            Ok((url, body))
        });
        let (url, (body, content_type)) = match built {
            Ok(b) => b,
            // Checked at intake; a claim made under another configuration can still miss a
            // field. Nothing was sent.
            Err(error) => {
                return Err(Outcome::NotApplied {
                    status: None,
                    retry_after: None,
                    error: format!("{}: {error}", crate::provider::effect::NOT_BUILT),
                });
            }
        };
        let mut request = self
            .client
            .request(self.shape.method.clone(), url)
            .headers(self.headers.clone())
            .body(body);
        if let Some(h) = &self.shape.idem_header {
            request = request.header(h, claim.idem_key.as_str());
        }
        if !content_type.is_empty() {
            request = request.header(CONTENT_TYPE, content_type);
        }
        Ok(request.send())
    }
}

#[async_trait]
impl Effect for HttpEffect {
    fn url_segments(&self) -> serde_json::Value {
        self.shape.paths.registry()
    }

    fn outcomes(&self) -> Option<&ValueOutcomes> {
        self.outcomes.as_deref()
    }

    fn lookup_object(&self) -> &str {
        &self.status.found_pointer
    }

    async fn perform(&self, claim: &Claim) -> Outcome {
        // This future is held for the whole provider call. What it keeps across an await it
        // keeps in full, even once moved out: so the request is built in a plain function, and
        // the answer (the response, its body) is read in a boxed future of its own.
        let sent = match self.send(claim) {
            Ok(sent) => sent,
            Err(not_sent) => return not_sent,
        };
        let response = match sent.await {
            Ok(r) => r,
            Err(e) if e.is_connect() || never_processed(&e) => {
                // The TCP connection never opened, or the provider said it did not process
                // the request: it was not applied.
                return Outcome::NotApplied {
                    status: None,
                    retry_after: None,
                    error: describe(&e),
                };
            }
            Err(e) => {
                return Outcome::Unknown {
                    status: None,
                    error: describe(&e),
                };
            }
        };
        Box::pin(outcome_of(
            response,
            &self.not_applied,
            self.outcomes.is_some(),
        ))
        .await
    }

    async fn lookup(&self, claim: &Claim) -> Option<Lookup> {
        let template = self.shape.status_url.as_ref()?;
        Some(match self.payload(claim) {
            Ok(payload) => self.ask(template, &vars(claim, payload.as_ref())).await,
            Err(error) => Lookup::Unknown { error },
        })
    }

    fn can_reconcile(&self) -> bool {
        self.shape.status_url.is_some()
    }

    fn proves_non_receipt(&self, status: Option<i32>) -> bool {
        // No answer here means no connection, or an HTTP/2 stream the provider refused
        // (`perform` makes any other transport error unknown).
        status.is_none_or(|s| u16::try_from(s).is_ok_and(|s| self.non_receipt.contains(&s)))
    }

    fn not_found_after(&self) -> Duration {
        self.not_found_after
    }

    fn validate(&self, payload: &[u8], _content_type: &str) -> Result<(), String> {
        url_check::payload_fields(&self.shape, payload).map(|_| ())
    }

    fn check_message(
        &self,
        m: &crate::provider::effect::Incoming<'_>,
    ) -> Result<(), crate::provider::effect::Unusable> {
        url_check::check_message(&self.shape, m)
    }

    async fn probe_status(&self) -> Result<Option<String>, String> {
        let Some(template) = &self.shape.status_url else {
            return Ok(None);
        };
        if self.status.probe == ProbeMode::Off {
            return Ok(None);
        }
        if template.needs_payload() {
            return Ok(Some(
                "effect.status_url names payload fields: not probed at start".into(),
            ));
        }
        let key = format!("claimd-probe-{:016x}", fastrand::u64(..));
        let vars = Vars {
            key: &key,
            message_id: &key,
            ..SAMPLE
        };
        let why = match self.ask(template, &vars).await {
            Lookup::NotFound { .. } => return Ok(None),
            Lookup::Found { status, .. } => format!(
                "a lookup of a key that cannot exist ({key}) answered {status} and reads as \"found\": every unknown outcome would be settled as applied; set effect.status.found_pointer to what only a real match has"
            ),
            // Only an answer that proves a mistake stops the start (a 401 or 403: the
            // credentials; another 4xx, such as the 404 of a route that does not exist: the URL or
            // effect.status); a provider that is down (5xx, 408, 429) must not keep every
            // consumer's worker from starting.
            Lookup::Unknown { error } if answered_mistake(&error) => format!(
                "a lookup of a key that cannot exist ({key}) did not come back \"not found\" ({error}); is effect.status_url right, its credentials (effect.headers), and effect.status.not_found_status / found_pointer?"
            ),
            // No answer, or one of a provider in trouble: nothing about the endpoint's shape.
            Lookup::Unknown { error } => {
                return Ok(Some(format!(
                    "could not probe effect.status_url at start, starting anyway: {error}"
                )));
            }
        };
        match self.status.probe {
            ProbeMode::Warn => Ok(Some(why)),
            _ => Err(why),
        }
    }
}

/// Whether a status lookup's error is an answer that proves a configuration mistake: a `4xx`
/// other than `408` (time-out) and `429` (rate limited), a redirect (`3xx`: the route moved,
/// and claimd never follows one), or a `2xx` whose body cannot be read as configured. A `5xx`
/// is the provider's trouble, not the configuration's.
fn answered_mistake(error: &str) -> bool {
    let Some(rest) = error.strip_prefix("status endpoint answered ") else {
        return false;
    };
    let status: u16 = rest
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or(0);
    matches!(status, 200..=499) && !matches!(status, 408 | 429)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_that_prove_a_mistake_refuse_the_start() {
        for mistake in [401, 403, 404, 400, 405, 301, 302, 307] {
            let e = format!(
                "status endpoint answered {mistake}, which is neither found nor the configured \"not found\" ([]): x"
            );
            assert!(answered_mistake(&e), "{e}");
        }
        assert!(answered_mistake(
            "status endpoint answered 200 with a body that is not JSON: x"
        ));
        for trouble in [500, 502, 503, 504, 408, 429] {
            let e = format!(
                "status endpoint answered {trouble}, which is neither found nor the configured \"not found\" ([404]): x"
            );
            assert!(!answered_mistake(&e), "{e}");
        }
        assert!(!answered_mistake("connection refused"));
        assert!(!answered_mistake("timed out after 1s"));
    }

    #[test]
    fn keys_are_encoded_for_paths() {
        assert_eq!(encode_path_segment("order-1"), "order-1");
        assert_eq!(encode_path_segment("a/b?c#d"), "a%2Fb%3Fc%23d");
        assert_eq!(encode_path_segment("pay:acme:1"), "pay%3Aacme%3A1");
    }
}
