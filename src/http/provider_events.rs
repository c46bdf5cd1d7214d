//! `POST /v1/provider-events/{consumer}`: the provider's signed events (webhooks), taken by
//! `crate::provider_events::receive`. No bearer token: the signature is the proof, and an
//! event without a valid one is refused with nothing changed.

use super::problem::problem;
use super::state::AppState;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

/// Takes one provider event for `consumer`.
pub async fn post_event(
    State(state): State<AppState>,
    Path(consumer): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(c) = state.claimer.consumer(&consumer) else {
        return problem(
            StatusCode::NOT_FOUND,
            "unknown consumer",
            &format!(
                "no consumer named {:?}",
                crate::table::escape_controls(&consumer)
            ),
        );
    };
    let now = chrono::Utc::now().timestamp();
    let answer = crate::provider_events::receive(&state.claimer, c, &headers, &body, now).await;
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
