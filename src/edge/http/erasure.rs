//! `POST /v1/erasures` (an admin: the admin token or an admin's account): erases the payload, provider answer and error of one
//! message's finished claim, or of every finished claim of a tenant (a data-subject request),
//! through [`crate::ops::erasure`] — the same as `claimd claims erase`. `200` with the report
//! (open claims listed as not erased, with what to do); `404` when nothing matches.
//!
//! Erasure is an admin's action: the operator check refuses other roles (`403`, audited), and
//! each erasure done or refused here is a line of the operator audit.

use super::actions::{Asker, actor_of, audit_answer, bad_actor, bad_body};
use super::problem::{problem, store_down};
use crate::domain::operator_role::{Action, Identity};
use crate::edge::AppState;
use crate::ops::audit::Origin;
use crate::ops::erasure::{self, Report, Selection, Verdict};
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, State};
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
    /// Who acts, for the history (recorded as `api:<actor>`). Required with the admin token;
    /// an account's credential names its account instead.
    #[serde(default)]
    pub actor: String,
}

/// `POST /v1/erasures`.
pub async fn erase(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    origin: Option<Extension<Origin>>,
    body: Result<Json<ErasureRequest>, JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return bad_body(e),
    };
    let Some(actor) = actor_of(who.as_ref().map(|Extension(w)| w), &req.actor) else {
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
    let store = state.claimer.store();
    let answer = match erasure::erase(
        store.as_ref(),
        &selection,
        &actor,
        req.note.trim(),
        req.dry_run,
    )
    .await
    {
        Ok(Report { claims, .. }) if claims.is_empty() => Err(problem(
            StatusCode::NOT_FOUND,
            "no such claim",
            "no claim matches: check the consumer, message id and tenant",
        )),
        Ok(report) => Ok(report),
        Err(e) => Err(store_down(e)),
    };
    // A dry run changes nothing and is not an action; an erasure done or refused is.
    if !req.dry_run {
        let (status, detail) = match &answer {
            Ok(r) => (
                StatusCode::OK,
                format!(
                    "{} erased, {} already erased, {} open not erased",
                    r.count(Verdict::Erased),
                    r.count(Verdict::AlreadyErased),
                    r.count(Verdict::Open)
                ),
            ),
            Err(refusal) => (refusal.status(), String::new()),
        };
        let asker: Asker = (who, origin);
        let target = selection.audit_target();
        audit_answer(&state, asker, Action::Erase, &target, status, &detail).await;
    }
    match answer {
        Ok(report) => Json(report).into_response(),
        Err(refusal) => refusal,
    }
}
