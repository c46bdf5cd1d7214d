//! HTTP intake: `POST /v1/messages/{consumer}` and `GET /v1/messages/{consumer}/{message_id}`.
//!
//! `202` new claim committed, `200` duplicate, `422` same key with another payload or a payload
//! the consumer's effect cannot use (an email without a recipient), `400` bad key or a body
//! that declares JSON and is not JSON, `404` unknown consumer, `413` body too large, `503`
//! store unavailable or saturated (nothing committed; `Retry-After` says when to retry).
//! Errors are `application/problem+json`.
//!
//! A retried `POST` (same key and body) after the claim settled answers `200` with the
//! outcome and `Idempotent-Replayed: true`; `Prefer: wait=N` holds the answer until the claim
//! settles or N seconds pass (see [`super::answer`]).

use crate::config::SourceConfig;
use crate::domain::claim::{Claim, ClaimState};
use crate::domain::trace_context::{TRACEPARENT, TraceParent};
use crate::edge::AppState;
use crate::edge::http::auth::tenant_header;
use crate::edge::http::problem::problem;
use crate::edge::http::server::{BodyReadTimeout, BodyRefused, BodyShare};
use crate::edge::intake::answer::{self, prefer_wait, settled};
use crate::engine::claimer::{Accepted, Delivery, SubmitError};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;

/// The claim as intake clients see it.
#[derive(Debug, Serialize)]
pub struct MessageView<'a> {
    /// Consumer name.
    pub consumer: &'a str,
    /// Tenant (`""` when none).
    pub tenant: &'a str,
    /// Message id.
    pub message_id: &'a str,
    /// Claim state.
    pub state: &'static str,
    /// Attempt number.
    pub attempt: i32,
    /// Whether this request was a duplicate (on `GET`: whether any duplicate arrived).
    pub duplicate: bool,
    /// Duplicate deliveries recognised for this message so far (this one included).
    pub duplicates: i64,
    /// When the claim was first committed.
    pub received_utc: DateTime<Utc>,
    /// When the effect was confirmed.
    pub processed_utc: Option<DateTime<Utc>>,
    /// The provider's status, once it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_status: Option<i32>,
    /// The provider's id of the object, when it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<&'a str>,
    /// The provider's answer (at most 4 KiB), once the claim is settled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_answer: Option<&'a str>,
    /// Why a settled claim did not complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
    /// A scheduled send's time (`Not-Before`): not sent before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// The claim's order key, when its consumer orders claims.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_key: Option<&'a str>,
}

impl<'a> MessageView<'a> {
    /// The view of `claim`.
    pub fn of(claim: &'a Claim, duplicate: bool) -> Self {
        MessageView {
            consumer: &claim.consumer,
            tenant: &claim.tenant,
            message_id: &claim.message_id,
            state: claim.state.as_str(),
            attempt: claim.attempt,
            duplicate: duplicate || claim.duplicate_count > 0,
            duplicates: claim.duplicate_count,
            received_utc: claim.received_utc,
            processed_utc: claim.processed_utc,
            provider_status: claim.provider_status,
            not_before: claim.not_before,
            order_key: claim.order_key.as_deref(),
            provider_id: claim.provider_id.as_deref(),
            provider_answer: claim
                .provider_response
                .as_deref()
                .filter(|_| settled(claim.state)),
            reason: claim
                .last_error
                .as_deref()
                .filter(|_| settled(claim.state) && claim.state != ClaimState::Completed),
        }
    }
}

/// `Prefer: wait=N` on this request, capped by `[http] max_wait`.
fn wait_asked(state: &AppState, headers: &HeaderMap) -> Option<std::time::Duration> {
    prefer_wait(
        headers.get_all("Prefer").iter().map(|v| v.as_bytes()),
        state.config.http.max_wait.0,
    )
}

/// The answer with `claim`: `settled_status` with the outcome once it is settled (a
/// duplicate's marked `Idempotent-Replayed: true`), `status` as before otherwise; waited for
/// first when the client asked (`Preference-Applied: wait=N`) and a waiter's place is free
/// (else answered at once, without `Preference-Applied`).
async fn answer_with(
    state: &AppState,
    claim: Claim,
    status: StatusCode,
    duplicate: bool,
    wait: Option<std::time::Duration>,
) -> Response {
    let (claim, applied) = match wait {
        Some(w) if !settled(claim.state) => {
            match state.waiters.try_place(&state.claimer.metrics().waiters) {
                Some(_place) => {
                    let store = state.claimer.store();
                    let signals = state.claimer.settler().signals();
                    let waited = answer::await_outcome(store, signals, &claim, w).await;
                    (waited.unwrap_or(claim), wait)
                }
                None => (claim, None),
            }
        }
        _ => (claim, wait),
    };
    let done = settled(claim.state);
    let status = if done { StatusCode::OK } else { status };
    let mut r = (status, Json(MessageView::of(&claim, duplicate))).into_response();
    if done && duplicate {
        r.headers_mut()
            .insert(answer::REPLAYED, header::HeaderValue::from_static("true"));
    }
    if let Some(w) = applied
        && let Ok(v) = header::HeaderValue::from_str(&format!("wait={}", w.as_secs()))
    {
        r.headers_mut().insert(answer::PREFERENCE_APPLIED, v);
    }
    r
}

/// Tenant bytes for `consumer` (the first value; intake refuses repeated headers).
pub(super) fn tenant_of<'h>(state: &AppState, consumer: &str, headers: &'h HeaderMap) -> &'h [u8] {
    headers
        .get(tenant_header(state, consumer))
        .map(|v| v.as_bytes())
        .unwrap_or(b"")
}

/// A `400` when `name` appears more than once: which value is the message's identity would be
/// a guess.
pub(super) fn repeated(headers: &HeaderMap, name: &str) -> Option<Response> {
    (headers.get_all(name).iter().count() > 1).then(|| {
        problem(
            StatusCode::BAD_REQUEST,
            "repeated header",
            &format!("the {name} header appears more than once; send it once"),
        )
    })
}

fn http_consumer_exists(state: &AppState, consumer: &str) -> bool {
    state
        .claimer
        .consumer(consumer)
        .is_some_and(|c| c.config.source == SourceConfig::Http)
}

/// `POST /v1/messages/{consumer}`
pub async fn post_message(
    State(state): State<AppState>,
    Path(consumer): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(refused) = unknown_consumer(&state, &consumer) {
        return refused;
    }
    let tenant_name = tenant_header(&state, &consumer);
    for name in [
        "Idempotency-Key",
        tenant_name,
        header::CONTENT_TYPE.as_str(),
        NOT_BEFORE,
        PRIORITY,
    ] {
        if let Some(refused) = repeated(&headers, name) {
            return refused;
        }
    }
    let Some(key) = headers.get("Idempotency-Key") else {
        return problem(
            StatusCode::BAD_REQUEST,
            "missing idempotency key",
            "the Idempotency-Key header is required: 1-255 visible ASCII characters",
        );
    };
    let not_before = match not_before(&headers) {
        Ok(at) => at,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "bad Not-Before", &detail),
    };
    let priority = match priority(&headers) {
        Ok(p) => p,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "bad Message-Priority", &detail),
    };
    // `share` (of the body budget) goes with the claim until its call starts: the body is in
    // memory till then, whether or not this client is still waiting.
    let (body, share) = match read_body(&state, &consumer, &headers, body).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    // Raw bytes: the claimer refuses what it cannot store and send on (never stored as "").
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let delivery = Delivery {
        tenant: tenant_of(&state, &consumer, &headers).to_vec(),
        consumer,
        message_id: key.as_bytes().to_vec(),
        payload: body.into(),
        content_type,
        not_before,
        trace_parent: trace_parent(&headers),
        priority,
    };
    submit_and_answer(&state, delivery, share, &headers).await
}

/// The producer's `traceparent` header, when it parses (one that does not is ignored).
pub(super) fn trace_parent(headers: &HeaderMap) -> Option<TraceParent> {
    headers
        .get(TRACEPARENT)
        .and_then(|v| TraceParent::parse(v.as_bytes()))
}

/// `404` unless `consumer` takes HTTP intake.
pub(super) fn unknown_consumer(state: &AppState, consumer: &str) -> Option<Response> {
    (!http_consumer_exists(state, consumer)).then(|| {
        problem(
            StatusCode::NOT_FOUND,
            "unknown consumer",
            &format!("no consumer named {consumer:?} takes HTTP intake"),
        )
    })
}

/// Submits `delivery` (its body holding `share` of the budget) and answers: `202` new, `200`
/// duplicate (both waited for under `Prefer: wait`), or the refusal.
pub(super) async fn submit_and_answer(
    state: &AppState,
    delivery: Delivery,
    share: BodyShare,
    headers: &HeaderMap,
) -> Response {
    let wait = wait_asked(state, headers);
    match state.claimer.submit_held(delivery, share).await {
        Ok(Accepted::New(claim)) => {
            answer_with(state, claim, StatusCode::ACCEPTED, false, wait).await
        }
        Ok(Accepted::Duplicate(claim)) => {
            answer_with(state, claim, StatusCode::OK, true, wait).await
        }
        Err(e) => submit_error(e),
    }
}

/// The header giving a message's priority (docs/flow-control.md, "Priorities").
pub(super) const PRIORITY: &str = crate::domain::priority::HEADER;

/// The priority `Message-Priority` names (an integer from -100 to 100), the default without
/// one; why not otherwise.
pub(super) fn priority(headers: &HeaderMap) -> Result<i16, String> {
    match headers.get(PRIORITY) {
        None => Ok(crate::domain::priority::DEFAULT),
        Some(v) => crate::domain::priority::parse(v.as_bytes())
            .map_err(|e| format!("the {PRIORITY} header: {e}")),
    }
}

/// The header asking for a scheduled send (docs/flow-control.md).
const NOT_BEFORE: &str = "Not-Before";

/// The time `Not-Before` names (an RFC 3339 time, or a duration from now); `None` without
/// one or for a time already past; why not (naming the header and its forms) otherwise.
pub(super) fn not_before(
    headers: &HeaderMap,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, String> {
    let Some(value) = headers.get(NOT_BEFORE) else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| {
        "Not-Before must be visible ASCII: an RFC 3339 time or a duration".to_string()
    })?;
    crate::domain::schedule::parse_not_before(NOT_BEFORE, text, chrono::Utc::now())
        .map_err(|e| e.to_string())
}

fn too_large(limit: usize) -> Response {
    problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body too large",
        &format!("the body is over the limit of {limit} bytes ([http] max_body_bytes)"),
    )
}

/// Reads the body into one buffer, taking budget for the memory it holds as it grows: a first
/// slice before anything is read (`503` + `Retry-After` when the budget stays spent for
/// `intake_wait`, nothing read), then more as bytes arrive, the buffer doubling up to the
/// declared length (the last step lands on it exactly, so a declared body is held once). `413`
/// past `max_body_bytes` (a declared length is refused before reading), `408` when it does not
/// arrive within `body_read_timeout`, `503` when the budget has no room for the rest.
pub(super) async fn read_body(
    state: &AppState,
    consumer: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Vec<u8>, BodyShare), Response> {
    let limit = state.config.http.max_body_bytes;
    let declared = crate::edge::http::server::declared_length(headers);
    let wait = state.config.http.intake_wait.0;
    state
        .body_budget
        .read(body, declared, limit, wait)
        .await
        .map_err(|refused| match refused {
            BodyRefused::TooLarge => too_large(limit),
            BodyRefused::BudgetSpent => budget_spent(state, consumer),
            BodyRefused::Unreadable(e) => unreadable(&e),
        })
}

/// `503` + `Retry-After`: bodies in memory are at `body_budget_bytes`.
fn budget_spent(state: &AppState, consumer: &str) -> Response {
    state.claimer.metrics().refused(consumer, "body_budget");
    let mut r = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        "request bodies in memory are at [http] body_budget_bytes; nothing was recorded: retry",
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    // The body is not read (or not all of it): the connection cannot carry another request.
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

fn unreadable(e: &axum::Error) -> Response {
    let mut r = if BodyReadTimeout::is_cause_of(e) {
        problem(
            StatusCode::REQUEST_TIMEOUT,
            "body too slow",
            &format!("{e}; nothing was recorded"),
        )
    } else {
        problem(
            StatusCode::BAD_REQUEST,
            "unreadable body",
            &format!("{e}; nothing was recorded"),
        )
    };
    // The rest of the body is not read: the connection cannot carry another request.
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

/// Maps a refused delivery to its HTTP answer.
pub fn submit_error(e: SubmitError) -> Response {
    match e {
        SubmitError::UnknownConsumer(_) => {
            problem(StatusCode::NOT_FOUND, "unknown consumer", &e.to_string())
        }
        SubmitError::BadId(_) => problem(
            StatusCode::BAD_REQUEST,
            "invalid idempotency key or tenant",
            &e.to_string(),
        ),
        SubmitError::Conflict { .. } => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "payload mismatch",
            &format!("{e}; use a new Idempotency-Key for a new message"),
        ),
        SubmitError::BadContentType(_) => problem(
            StatusCode::BAD_REQUEST,
            "invalid content type",
            &format!("{e}; nothing was recorded"),
        ),
        SubmitError::TenantNotKeyed { .. } => problem(
            StatusCode::BAD_REQUEST,
            "tenant not accepted",
            &format!("{e}; nothing was recorded"),
        ),
        SubmitError::KeyTooLong { .. } => problem(
            StatusCode::BAD_REQUEST,
            "idempotency key too long",
            &format!("{e}; nothing was recorded"),
        ),
        SubmitError::NotJson(_) => problem(
            StatusCode::BAD_REQUEST,
            "body is not JSON",
            &format!("{e}; nothing was recorded"),
        ),
        SubmitError::UnsafeUrlValue(_) => problem(
            StatusCode::BAD_REQUEST,
            "unsafe URL value",
            &format!("{e}; nothing was recorded"),
        ),
        SubmitError::BadPayload(_) => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unusable payload",
            &format!("{e}; nothing was recorded"),
        ),
        SubmitError::Busy(_) | SubmitError::ShuttingDown | SubmitError::Interrupted => {
            let mut r = problem(StatusCode::SERVICE_UNAVAILABLE, "busy", &e.to_string());
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            r
        }
        SubmitError::NotReplicated(_) => {
            let mut r = problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "no synchronous standby",
                &e.to_string(),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
            r
        }
        SubmitError::Store(ref inner) => {
            tracing::warn!(error = %inner, "claim not committed");
            let mut r = problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "store unavailable",
                "the claim store did not confirm the message: retry (if it was recorded after all, the retry is answered as a duplicate and the message is performed once)",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            r
        }
    }
}

/// `GET /v1/messages/{consumer}/{message_id}`
pub async fn get_message(
    State(state): State<AppState>,
    Path((consumer, message_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let tenant = String::from_utf8_lossy(tenant_of(&state, &consumer, &headers)).into_owned();
    let names = [("consumer", consumer.as_str()), ("message_id", &message_id)];
    if let Some(refused) = crate::edge::http::problem::refusal(names) {
        return refused;
    }
    match state
        .claimer
        .store()
        .get(&consumer, &tenant, &message_id)
        .await
    {
        Ok(Some(claim)) => {
            let wait = wait_asked(&state, &headers);
            answer_with(&state, claim, StatusCode::OK, false, wait).await
        }
        Ok(None) => problem(
            StatusCode::NOT_FOUND,
            "no such message",
            &format!("no claim for {consumer}/{message_id} (tenant {tenant:?})"),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "read failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "store unavailable",
                "the claim store could not be read; retry",
            )
        }
    }
}
