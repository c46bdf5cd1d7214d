//! `POST /v1/erasures` (admin token): erases the payload, provider answer and error of one
//! message's finished claim, or of every finished claim of a tenant (a data-subject request),
//! through [`crate::ops::erasure`] — the same as `claimd claims erase`. `200` with the report
//! (open claims listed as not erased, with what to do); `404` when nothing matches.
//!
//! Erasure is an admin's action: [`authorize_erasure`] is where the caller's role is checked
//! and the audit record written; for now the admin token the route sits behind is the gate.

use super::actions::{actor_of, bad_actor, bad_body};
use super::problem::{problem, store_down};
use crate::edge::AppState;
use crate::ops::erasure::{self, Report, Selection};
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

/// Body of `POST /v1/erasures`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErasureRequest {
    /// Consumer of the one message (with `message_id`).
    #[serde(default)]
    pub consumer: Option<String>,
    /// The one message's id (with `consumer`).
    #[serde(default)]
    pub message_id: Option<String>,
    /// The message's tenant; alone, every claim of this tenant.
    #[serde(default)]
    pub tenant: String,
    /// Why (kept in each claim's history, e.g. the request's reference); optional.
    #[serde(default)]
    pub note: String,
    /// Only report what would be erased.
    #[serde(default)]
    pub dry_run: bool,
    /// Who acts, for the history (recorded as `api:<actor>`). Required.
    pub actor: String,
}

/// Whether `actor` may erase what `selection` names: `None` when it may, else the refusal to
/// answer. Today every caller with the admin token may (the route's gate). This is the one
/// place where the caller's role (admin only) is to be checked and the erasure's audit record
/// written.
pub fn authorize_erasure(
    _state: &AppState,
    _actor: &str,
    _selection: &Selection,
) -> Option<Response> {
    None
}

/// `POST /v1/erasures`.
pub async fn erase(
    State(state): State<AppState>,
    body: Result<Json<ErasureRequest>, JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return bad_body(e),
    };
    let Some(actor) = actor_of(&req.actor) else {
        return bad_actor();
    };
    if let Some(refused) = crate::edge::http::problem::refusal([
        ("consumer", req.consumer.as_deref().unwrap_or("")),
        ("message_id", req.message_id.as_deref().unwrap_or("")),
        ("tenant", &req.tenant),
        ("note", &req.note),
    ]) {
        return refused;
    }
    let selection = match Selection::from_parts(
        req.consumer.as_deref(),
        req.message_id.as_deref(),
        &req.tenant,
    ) {
        Ok(s) => s,
        Err(why) => {
            let why = why
                .replace(
                    "--consumer C --message ID",
                    "\"consumer\" and \"message_id\"",
                )
                .replace(
                    "--consumer and --message",
                    "\"consumer\" and \"message_id\"",
                )
                .replace("--tenant T", "\"tenant\" alone");
            return problem(StatusCode::BAD_REQUEST, "bad selection", &why);
        }
    };
    if let Some(refused) = authorize_erasure(&state, &actor, &selection) {
        return refused;
    }
    let store = state.claimer.store();
    match erasure::erase(
        store.as_ref(),
        &selection,
        &actor,
        req.note.trim(),
        req.dry_run,
    )
    .await
    {
        Ok(Report { claims, .. }) if claims.is_empty() => problem(
            StatusCode::NOT_FOUND,
            "no such claim",
            "no claim matches: check the consumer, message id and tenant",
        ),
        Ok(report) => Json(report).into_response(),
        Err(e) => store_down(e),
    }
}
