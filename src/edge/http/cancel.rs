//! `POST /v1/claims/{consumer}/{message_id}/cancel` (admin token): cancels a scheduled send
//! before its time (`ops::schedule::cancel`, the same as `claimd claims cancel`). `200` with
//! the claim, now `failed`; `409` once its time came and the sweeper took it, or for a claim
//! that was never scheduled; `404` for no such claim.

use super::actions::{actor_of, audit_answer, bad_actor, bad_body};
use super::ops::ClaimView;
use super::problem::{problem, store_down};
use crate::domain::operator_role::{Action, Identity};
use crate::edge::AppState;
use crate::ops::audit::Origin;
use crate::ops::schedule::{CancelError, cancel as cancel_scheduled};
use axum::Json;
use axum::extract::Extension;
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
    /// Who acts, for the history (recorded as `api:<actor>`). Required with the admin token;
    /// with an account's credential the account's name is recorded instead.
    #[serde(default)]
    pub actor: String,
}

/// `POST /v1/claims/{consumer}/{message_id}/cancel`.
pub async fn cancel(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    origin: Option<Extension<Origin>>,
    Path((consumer, message_id)): Path<(String, String)>,
    body: Result<Json<CancelRequest>, JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return bad_body(e),
    };
    let target = crate::ops::audit::claim_target(&consumer, &req.tenant, &message_id);
    let actor = actor_of(who.as_ref().map(|Extension(w)| w), &req.actor);
    let answer = cancel_claim(&state, &consumer, &message_id, &req, actor).await;
    let detail = format!("reason: {}", req.reason);
    audit_answer(
        &state,
        (who, origin),
        Action::Cancel,
        &target,
        answer.status(),
        &detail,
    )
    .await;
    answer
}

async fn cancel_claim(
    state: &AppState,
    consumer: &str,
    message_id: &str,
    req: &CancelRequest,
    actor: Option<String>,
) -> Response {
    if req.reason.trim().is_empty() {
        return problem(
            StatusCode::BAD_REQUEST,
            "reason required",
            "\"reason\" must say why the send is cancelled",
        );
    }
    let Some(actor) = actor else {
        return bad_actor();
    };
    if let Some(refused) = crate::edge::http::problem::refusal([
        ("consumer", consumer),
        ("message_id", message_id),
        ("tenant", &req.tenant),
        ("reason", &req.reason),
    ]) {
        return refused;
    }
    let store = state.claimer.store();
    let reason = req.reason.trim();
    match cancel_scheduled(store, consumer, &req.tenant, message_id, &actor, reason).await {
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
