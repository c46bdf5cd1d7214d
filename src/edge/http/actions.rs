//! Operator actions over HTTP (admin token): `POST /v1/claims/{consumer}/{message_id}/resolve`
//! and `.../redrive`, the same store transitions as `claimd claims resolve|redrive`, recorded
//! in the claim's history with who asked.
//!
//! Only `needs_attention` and `failed` claims can be acted on: a `started` claim belongs to the
//! worker holding its lease and to the sweeper (answered `409`). The store checks the state in
//! the same statement that changes it, so an action racing the sweeper or retention cannot act
//! on a claim that moved meanwhile. A request that names the claim's `version` (as
//! `GET /v1/claims/...` showed it) acts only on that version: a claim that changed since,
//! even back to the same state, is answered `409` "the claim changed since you read it".

use super::ops::ClaimView;
use super::problem::{problem, store_down};
use crate::domain::claim::{Claim, ClaimState};
use crate::domain::operator_role::{Action, Identity, IdentitySource};
use crate::edge::AppState;
use crate::ops::audit::{self, AuditAction, AuditResult, Origin, Record};
use crate::store::Seen;
use axum::Json;
use axum::extract::Extension;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

/// Body of `POST .../resolve`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    /// `completed` (the provider did it) or `failed` (it did not and will not).
    pub to: String,
    /// Why: what the operator saw at the provider. Required.
    pub note: String,
    /// The claim's tenant (`""` when none).
    #[serde(default)]
    pub tenant: String,
    /// Who acts, for the history (recorded as `api:<actor>`). Required with the admin token;
    /// with an account's credential the account's name is recorded instead.
    #[serde(default)]
    pub actor: String,
    /// The claim's version as the caller read it; absent: whatever it is now.
    #[serde(default)]
    pub version: Option<i64>,
}

/// Body of `POST .../redrive`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedriveRequest {
    /// The claim's tenant (`""` when none).
    #[serde(default)]
    pub tenant: String,
    /// Who acts, for the history (recorded as `api:<actor>`). Required with the admin token;
    /// with an account's credential the account's name is recorded instead.
    #[serde(default)]
    pub actor: String,
    /// The claim's version as the caller read it; absent: whatever it is now.
    #[serde(default)]
    pub version: Option<i64>,
}

/// Who is recorded in the claim's history: `api:` and the account's name for an account,
/// else `api:` and the body's `actor`, when it is 1-64 printable ASCII characters.
pub(super) fn actor_of(who: Option<&Identity>, actor: &str) -> Option<String> {
    if let Some(w) = who.filter(|w| w.source == IdentitySource::Account) {
        return Some(format!("api:{}", w.name));
    }
    let actor = actor.trim();
    let printable = actor.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    (!actor.is_empty() && actor.len() <= 64 && printable).then(|| format!("api:{actor}"))
}

pub(super) fn bad_actor() -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "bad actor",
        "\"actor\" must name who acts: 1-64 printable ASCII characters (an account's credential names its account instead)",
    )
}

pub(super) fn bad_body(e: JsonRejection) -> Response {
    problem(StatusCode::BAD_REQUEST, "bad request body", &e.body_text())
}

/// What the caller saw of the claim, when it named a version: the claim read now must be at
/// that version (else the `409` to answer), and the action is fenced on it.
async fn seen(
    state: &AppState,
    consumer: &str,
    tenant: &str,
    message_id: &str,
    version: Option<i64>,
) -> Result<Option<Seen>, Response> {
    let Some(version) = version else {
        return Ok(None);
    };
    match state
        .claimer
        .store()
        .get(consumer, tenant, message_id)
        .await
    {
        Ok(Some(c)) if c.version == version => Ok(Some(Seen::of(&c))),
        Ok(Some(c)) => Err(changed(version, c.version)),
        // No such claim: the transition answers it.
        Ok(None) => Ok(None),
        Err(e) => Err(store_down(e)),
    }
}

fn changed(seen: i64, now: i64) -> Response {
    problem(
        StatusCode::CONFLICT,
        "changed since read",
        &format!("the claim changed since you read it (version {seen}, now {now}); reload"),
    )
}

/// A transition fenced on `seen` that was refused: `409` naming the version the claim moved
/// to when it changed since it was read.
async fn refused_since(state: &AppState, key: [&str; 3], seen: Option<Seen>) -> Option<Response> {
    let seen = seen?.version?;
    let [consumer, tenant, message_id] = key;
    match state
        .claimer
        .store()
        .get(consumer, tenant, message_id)
        .await
    {
        Ok(Some(c)) if c.version != seen => Some(changed(seen, c.version)),
        _ => None,
    }
}

/// Who asked and from where, as the admin check handed them to the route.
pub(super) type Asker = (Option<Extension<Identity>>, Option<Extension<Origin>>);

/// Records an action's answer (its status) in the operator audit: `done` for a `2xx`, else
/// refused with the status.
pub(super) async fn audit_answer(
    state: &AppState,
    asker: Asker,
    action: Action,
    target: &str,
    status: StatusCode,
    detail: &str,
) {
    let who = asker.0.map_or_else(Identity::admin_token, |Extension(w)| w);
    let origin = asker.1.map_or(Origin::Unknown, |Extension(o)| o);
    let result = if status.is_success() {
        AuditResult::Done
    } else {
        AuditResult::Refused(format!(
            "{} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        ))
    };
    audit::record_or_log(
        state.claimer.store().as_ref(),
        &Record {
            who: &who,
            action: AuditAction::Act(action),
            target,
            origin: &origin,
            result,
            detail,
        },
    )
    .await;
}

/// The answer to a store transition: the claim, `409` for a state that allows no action,
/// `404` for no such claim.
fn answer(
    outcome: crate::store::StoreResult<Option<Result<Claim, ClaimState>>>,
    consumer: &str,
    message_id: &str,
    verb: &str,
) -> Response {
    match outcome {
        Ok(Some(Ok(claim))) => {
            let now = chrono::Utc::now();
            Json(ClaimView {
                stuck: claim.is_stuck(now),
                claim: &claim,
            })
            .into_response()
        }
        Ok(Some(Err(state))) => problem(
            StatusCode::CONFLICT,
            "not actionable",
            &format!(
                "{consumer}/{message_id} is {state}; only needs_attention or failed claims can be {verb}{}",
                if state == ClaimState::Started {
                    " (a started claim belongs to the worker and the sweeper)"
                } else {
                    ""
                }
            ),
        ),
        Ok(None) => problem(
            StatusCode::NOT_FOUND,
            "no such claim",
            &format!("no claim {consumer}/{message_id} for that tenant"),
        ),
        Err(e @ crate::store::StoreError::Erased(_)) => {
            problem(StatusCode::CONFLICT, "erased", &e.to_string())
        }
        Err(e) => store_down(e),
    }
}

/// `POST /v1/claims/{consumer}/{message_id}/resolve`: settles a parked or failed claim by hand.
pub async fn resolve(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    origin: Option<Extension<Origin>>,
    Path((consumer, message_id)): Path<(String, String)>,
    body: Result<Json<ResolveRequest>, JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return bad_body(e),
    };
    let target = audit::claim_target(&consumer, &req.tenant, &message_id);
    let detail = format!("to {}; note: {}", req.to, req.note);
    let actor = actor_of(who.as_ref().map(|Extension(w)| w), &req.actor);
    let answer = resolve_claim(&state, &consumer, &message_id, &req, actor).await;
    audit_answer(
        &state,
        (who, origin),
        Action::Resolve,
        &target,
        answer.status(),
        &detail,
    )
    .await;
    answer
}

async fn resolve_claim(
    state: &AppState,
    consumer: &str,
    message_id: &str,
    req: &ResolveRequest,
    actor: Option<String>,
) -> Response {
    let to = match req.to.as_str() {
        "completed" => ClaimState::Completed,
        "failed" => ClaimState::Failed,
        other => {
            return problem(
                StatusCode::BAD_REQUEST,
                "bad target state",
                &format!("\"to\" is {other:?}; it must be \"completed\" or \"failed\""),
            );
        }
    };
    if req.note.trim().is_empty() {
        return problem(
            StatusCode::BAD_REQUEST,
            "note required",
            "\"note\" must say why (what the provider shows for this key)",
        );
    }
    let Some(actor) = actor else {
        return bad_actor();
    };
    if let Some(refused) = crate::edge::http::problem::refusal([
        ("consumer", consumer),
        ("message_id", message_id),
        ("tenant", &req.tenant),
        ("note", &req.note),
    ]) {
        return refused;
    }
    let seen = match seen(state, consumer, &req.tenant, message_id, req.version).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let outcome = state
        .claimer
        .store()
        .resolve(
            consumer,
            &req.tenant,
            message_id,
            to,
            &actor,
            &req.note,
            seen,
        )
        .await;
    if let Ok(Some(Err(_))) = outcome
        && let Some(r) = refused_since(state, [consumer, &req.tenant, message_id], seen).await
    {
        return r;
    }
    answer(outcome, consumer, message_id, "resolved")
}

/// `POST /v1/claims/{consumer}/{message_id}/redrive`: puts a parked or failed claim back to
/// `started` (new attempt, same key) for the next sweep to perform.
pub async fn redrive(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    origin: Option<Extension<Origin>>,
    Path((consumer, message_id)): Path<(String, String)>,
    body: Result<Json<RedriveRequest>, JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return bad_body(e),
    };
    let target = audit::claim_target(&consumer, &req.tenant, &message_id);
    let actor = actor_of(who.as_ref().map(|Extension(w)| w), &req.actor);
    let answer = redrive_claim(&state, &consumer, &message_id, &req, actor).await;
    audit_answer(
        &state,
        (who, origin),
        Action::Redrive,
        &target,
        answer.status(),
        "",
    )
    .await;
    answer
}

async fn redrive_claim(
    state: &AppState,
    consumer: &str,
    message_id: &str,
    req: &RedriveRequest,
    actor: Option<String>,
) -> Response {
    let Some(actor) = actor else {
        return bad_actor();
    };
    if let Some(refused) = crate::edge::http::problem::refusal([
        ("consumer", consumer),
        ("message_id", message_id),
        ("tenant", &req.tenant),
    ]) {
        return refused;
    }
    let seen = match seen(state, consumer, &req.tenant, message_id, req.version).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let outcome = state
        .claimer
        .store()
        .redrive(consumer, &req.tenant, message_id, &actor, seen)
        .await;
    if let Ok(Some(Err(_))) = outcome
        && let Some(r) = refused_since(state, [consumer, &req.tenant, message_id], seen).await
    {
        return r;
    }
    answer(outcome, consumer, message_id, "redriven")
}
