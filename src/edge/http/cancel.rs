//! `POST /v1/claims/{consumer}/{message_id}/cancel` (admin token): cancels a scheduled send
//! before its time (`ops::schedule::cancel`, the same as `claimd claims cancel`). `200` with
//! the claim, now `failed`; `409` once its time came and the sweeper took it, or for a claim
//! that was never scheduled; `404` for no such claim.

use super::actions::{actor_of, bad_actor, bad_body};
use super::ops::ClaimView;
use super::problem::{problem, store_down};
use crate::edge::AppState;
use crate::ops::schedule::{CancelError, cancel as cancel_scheduled};
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

/// Body of `POST .../cancel`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Why (kept in the claim's history and its reason). Required.
    pub reason: String,
    /// The claim's tenant (`""` when none).
    #[serde(default)]
    pub tenant: String,
    /// Who acts, for the history (recorded as `api:<actor>`). Required.
    pub actor: String,
}

/// `POST /v1/claims/{consumer}/{message_id}/cancel`.
pub async fn cancel(
    State(state): State<AppState>,
    Path((consumer, message_id)): Path<(String, String)>,
    body: Result<Json<CancelRequest>, JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return bad_body(e),
    };
    if req.reason.trim().is_empty() {
        return problem(
            StatusCode::BAD_REQUEST,
            "reason required",
            "\"reason\" must say why the send is cancelled",
        );
    }
    let Some(actor) = actor_of(&req.actor) else {
        return bad_actor();
    };
    if let Some(refused) = crate::edge::http::problem::refusal([
        ("consumer", consumer.as_str()),
        ("message_id", &message_id),
        ("tenant", &req.tenant),
        ("reason", &req.reason),
    ]) {
        return refused;
    }
    let store = state.claimer.store();
    let reason = req.reason.trim();
    match cancel_scheduled(store, &consumer, &req.tenant, &message_id, &actor, reason).await {
        Ok(claim) => Json(ClaimView {
            stuck: false,
            claim: &claim,
        })
        .into_response(),
        Err(e @ CancelError::NotFound { .. }) => {
            problem(StatusCode::NOT_FOUND, "no such claim", &e.to_string())
        }
        Err(e @ CancelError::TooLate(_)) => {
            problem(StatusCode::CONFLICT, "not cancellable", &e.to_string())
        }
        Err(CancelError::Store(e)) => store_down(e),
    }
}
