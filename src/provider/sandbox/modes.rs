//! The sandbox's provider shapes beyond the default: the key in a JSON body field (Square's
//! `idempotency_key`), status lookups that lag writes (a search that is eventually consistent,
//! as Stripe documents for its search API), and a lookup endpoint that does not exist (every
//! lookup answers `404`). Also the search route: `GET /v1/search?key=K` answers
//! `200 {"object":"search_result","data":[...]}`, an empty list when nothing matches.

use super::*;

/// How the simulated provider deviates from the default shape. Every field may be left at
/// its default (the default shape).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxModes {
    /// Read the idempotency key from this top-level field of a JSON body instead of the
    /// `Idempotency-Key` header (a request without it gets `400`).
    pub key_field: Option<String>,
    /// An applied effect shows in lookups (`/v1/effects/{key}`, `/v1/search`) only this long
    /// after it was first applied.
    pub lookup_delay: Duration,
    /// Every lookup answers `404` as if the route did not exist.
    pub lookup_missing: bool,
    /// A rate limit per account: `(field, n)` takes at most `n` `POST`s a second for each
    /// value of the JSON body's top-level `field` (a token bucket per value holding one
    /// second's worth), answering `429` with `Retry-After: 1` beyond it. A body without the
    /// field is not limited.
    pub per_key_limit: Option<(String, u32)>,
    /// How long an effect a message asked to be `processing` (`"sandbox": "processing"`) stays
    /// so before it succeeds; `None`: [`DEFAULT_PROCESSING_FOR`].
    pub processing_for: Option<Duration>,
    /// Where the end of a `processing` effect is announced as a signed event, if anywhere.
    pub webhook: Option<SandboxWebhook>,
}

/// How long a `processing` effect lasts unless [`SandboxModes::processing_for`] says.
pub const DEFAULT_PROCESSING_FOR: Duration = Duration::from_secs(10);

/// A webhook endpoint the sandbox announces finished `processing` effects to, as a payment
/// provider does: `POST` of a Stripe-shaped event (`{"id","type","created","data":{"object"}}`)
/// signed with `Stripe-Signature` under `secret`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxWebhook {
    /// The endpoint, e.g. claimd's `http://127.0.0.1:8080/v1/provider-events/payments`.
    pub url: String,
    /// The signing secret (any text; claimd's `provider_events.secrets` must hold it).
    pub secret: String,
}

impl SandboxModes {
    /// Whether a record is visible to lookups yet.
    pub(super) fn visible(&self, record: &EffectRecord) -> bool {
        let age = (Utc::now() - record.first_applied_utc)
            .to_std()
            .unwrap_or_default();
        age >= self.lookup_delay
    }

    /// The account a body's `POST` counts against under [`SandboxModes::per_key_limit`].
    pub(super) fn limited_key(&self, body: &[u8]) -> Option<(String, u32)> {
        let (field, n) = self.per_key_limit.as_ref()?;
        let v = serde_json::from_slice::<Value>(body).ok()?;
        let key = match v.get(field)? {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        Some((key, *n))
    }

    /// The key from the body field, when that is where this provider reads it.
    pub(super) fn key_from_body(&self, body: &[u8]) -> Option<Result<String, String>> {
        let field = self.key_field.as_ref()?;
        let key = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get(field).and_then(Value::as_str).map(str::to_string))
            .filter(|k| !k.is_empty() && k.len() <= 255);
        Some(
            key.ok_or_else(|| format!("the JSON body needs a {field:?} field of 1-255 characters")),
        )
    }
}

/// `GET /v1/search?key=K`.
pub(super) fn search(inner: &Inner, query: Option<&str>) -> Response<Full<Bytes>> {
    let key = query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("key="))
        .and_then(|k| percent_decode(&k.replace('+', " ")));
    let Some(key) = key else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            "search needs ?key=".into(),
        );
    };
    let data: Vec<EffectRecord> = inner
        .effect(&key)
        .filter(|r| inner.modes.visible(r))
        .into_iter()
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"object": "search_result", "data": data}),
    )
}

/// `GET /v1/messages?reference=K`: the message sent under key `K`, as an SMS API lists it.
pub(super) fn messages(inner: &Inner, query: Option<&str>) -> Response<Full<Bytes>> {
    let reference = query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("reference="))
        .and_then(|k| percent_decode(&k.replace('+', " ")));
    let Some(reference) = reference else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            "list messages with ?reference=".into(),
        );
    };
    let data: Vec<Value> = inner
        .effect(&reference)
        .filter(|r| inner.modes.visible(r))
        .map(|r| {
            json!({
                "id": r.response.get("id").cloned().unwrap_or(Value::Null),
                "reference": r.key,
                "status": "sent",
                "sent_count": r.applied,
            })
        })
        .into_iter()
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// `GET /v1/<objects>/search?query=metadata['claimd_key']:'K'`: the stored response of key
/// `K` (the last quoted value of the query), as Stripe's search lists objects.
pub(super) fn search_query(inner: &Inner, query: Option<&str>) -> Response<Full<Bytes>> {
    let text = query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("query="))
        .and_then(|q| percent_decode(&q.replace('+', " ")));
    let key = text.as_deref().and_then(|q| {
        let q = q.strip_suffix('\'')?;
        q.rsplit_once('\'').map(|(_, k)| k.to_string())
    });
    let Some(key) = key else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            "search needs ?query=field:'value'".into(),
        );
    };
    let data: Vec<Value> = inner
        .effect(&key)
        .filter(|r| inner.modes.visible(r))
        .map(|r| r.response)
        .into_iter()
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"object": "search_result", "data": data}),
    )
}

/// What a lookup route answers when this provider has no lookup endpoint.
pub(super) fn no_route(path: &str) -> Response<Full<Bytes>> {
    problem(
        StatusCode::NOT_FOUND,
        "Not Found",
        format!("no route for {path}"),
    )
}
