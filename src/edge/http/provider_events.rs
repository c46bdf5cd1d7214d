//! `POST /v1/provider-events/{consumer}`: the provider's signed events (webhooks), taken by
//! `crate::engine::provider_event`. No bearer token: the signature is the proof, and an
//! event without a valid one is refused with nothing changed.
//!
//! Anyone can reach this route, so what can be refused without the body is refused before any
//! of it is read: an unknown consumer or one without provider events (`404`), signature
//! headers the consumer's scheme needs that are missing (`401`) or unreadable (`400`), a
//! declared `Content-Length` over the consumer's `max_body_bytes` (`413`). The body is then
//! read incrementally under `[http] provider_event_budget_bytes`, a budget of its own (intake
//! has `body_budget_bytes`): `503` + `Retry-After` when it has no room (providers retry), `413`
//! past the cap. Each of these answers closes the connection (the body is not read).

use super::problem::problem;
use crate::edge::AppState;
use crate::edge::http::server::{BodyReadTimeout, BodyRefused, BodyShare, declared_length};
use crate::engine::provider_event::refusal;
use crate::provider::provider_events::headers::check_headers;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Takes one provider event for `consumer`.
pub async fn post_event(
    State(state): State<AppState>,
    Path(consumer): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(c) = state.claimer.consumer(&consumer) else {
        return unread(problem(
            StatusCode::NOT_FOUND,
            "unknown consumer",
            &format!(
                "no consumer named {:?}",
                crate::domain::table::escape_controls(&consumer)
            ),
        ));
    };
    let name = c.name();
    let Some(events) = c.provider_events.as_deref() else {
        return unread(problem(
            StatusCode::NOT_FOUND,
            "no provider events here",
            &format!("consumer {name} takes no provider events ([consumers.provider_events])"),
        ));
    };
    if let Err(e) = check_headers(events.scheme(), &headers) {
        state.claimer.metrics().provider_event(name, refusal(&e));
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
        return unread(problem(
            status,
            "unsigned or badly signed event",
            &format!("refused: {e}; the body was not read; nothing changed"),
        ));
    }
    let limit = events.config.body_limit(&state.config.http);
    // `_share` keeps the body counted in the budget until the event is handled.
    let (body, _share) = match read_event(&state, name, limit, &headers, body).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let now = chrono::Utc::now().timestamp();
    let answer =
        crate::engine::provider_event::receive(&state.claimer, c, &headers, &body, now).await;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status.is_success() {
        (status, Json(answer)).into_response()
    } else {
        let title = match answer.status {
            401 => "unsigned or badly signed event",
            404 => "no provider events here",
            503 => "store unavailable",
            _ => "refused event",
        };
        problem(status, title, &answer.result)
    }
}

/// Reads the event's body into one buffer, taking room in the provider-event budget as it
/// grows (as intake does with its own budget: a first slice before anything is read, then
/// doubling up to the declared length): `413` over `limit` (a declared length before
/// reading), `503` + `Retry-After` when the budget has no room within `intake_wait`, `408`
/// when the body does not arrive within `body_read_timeout`.
async fn read_event(
    state: &AppState,
    consumer: &str,
    limit: usize,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Vec<u8>, BodyShare), Response> {
    let wait = state.config.http.intake_wait.0;
    state
        .provider_event_budget
        .read(body, declared_length(headers), limit, wait)
        .await
        .map_err(|refused| match refused {
            BodyRefused::TooLarge => too_large(state, consumer, limit),
            BodyRefused::BudgetSpent => budget_spent(state, consumer),
            BodyRefused::Unreadable(e) => unreadable(&e),
        })
}

/// `413`: the event is over the consumer's cap.
fn too_large(state: &AppState, consumer: &str, limit: usize) -> Response {
    state
        .claimer
        .metrics()
        .provider_event(consumer, "too_large");
    unread(problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        "event too large",
        &format!(
            "the event body is over the limit of {limit} bytes (consumers.provider_events.max_body_bytes, within [http] max_body_bytes); nothing changed"
        ),
    ))
}

/// `503` + `Retry-After`: provider-event bodies in memory are at their budget.
fn budget_spent(state: &AppState, consumer: &str) -> Response {
    state
        .claimer
        .metrics()
        .provider_event(consumer, "body_budget");
    let mut r = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        "provider-event bodies in memory are at [http] provider_event_budget_bytes; nothing changed: deliver it again",
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    unread(r)
}

fn unreadable(e: &axum::Error) -> Response {
    let (status, title) = if BodyReadTimeout::is_cause_of(e) {
        (StatusCode::REQUEST_TIMEOUT, "body too slow")
    } else {
        (StatusCode::BAD_REQUEST, "unreadable body")
    };
    unread(problem(status, title, &format!("{e}; nothing changed")))
}

/// `r`, closing the connection: the body is not read (or not all of it), so the connection
/// cannot carry another request.
fn unread(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}
