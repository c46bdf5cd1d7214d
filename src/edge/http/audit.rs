//! `GET /v1/audit` (any signed-in role): the operator audit as JSON, newest first, with the
//! same filters as `claimd audit` (`since`, `actor`, `limit`) and `before` (an id) for the
//! next page. Always read from the primary: the audit of the last minute matters.

use super::problem::{problem, store_down};
use crate::edge::AppState;
use crate::ops::audit::{self, AuditQuery};
use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// `GET /v1/audit`: `{"entries": [...], "next_before": id|null}`.
pub async fn get_audit(State(state): State<AppState>, Query(q): Query<AuditQuery>) -> Response {
    let store = state.claimer.store();
    let filter = match q.filter(chrono::Utc::now()) {
        Ok(f) => f,
        Err(e) => return problem(StatusCode::BAD_REQUEST, "bad audit query", &e),
    };
    match audit::list(store.as_ref(), &filter).await {
        Ok(entries) => {
            let next_before = (entries.len() == filter.limit as usize)
                .then(|| entries.last().map(|e| e.id))
                .flatten();
            Json(serde_json::json!({ "entries": entries, "next_before": next_before }))
                .into_response()
        }
        Err(e) => store_down(e),
    }
}
