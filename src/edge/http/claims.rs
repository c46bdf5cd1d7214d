//! Finding claims over HTTP (admin token): `GET /v1/claims` (filters, search and a keyset
//! cursor, as `claimd claims list`) and `GET /v1/claims/{consumer}/{message_id}` (one claim
//! with its history and payload, as `claimd claims show`).

use super::ops::ClaimView;
use super::problem::{problem, store_down};
use crate::config::Config;
use crate::domain::claim::Claim;
use crate::domain::operator_role::{Identity, IdentitySource};
use crate::domain::redaction::Exposure;
use crate::edge::AppState;
use crate::ops::claim_query::{ClaimQuery, PageError};
use crate::ops::exposure::{shown_claim, shown_claims};
use crate::store::{ClaimEvent, ClaimStore, StoreResult};
use axum::Json;
use axum::extract::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// How many claims `GET /v1/claims` lists without a `limit`.
pub const DEFAULT_LIMIT: u32 = 100;

/// How much of a payload a claim's view shows (the rest is counted, not shown).
pub const PAYLOAD_SHOWN_BYTES: usize = 16 * 1024;

/// `GET /v1/claims`: claims matching the query, newest first, and where the next page starts.
pub async fn list_claims(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    Query(q): Query<ClaimQuery>,
) -> Response {
    // On the read replica when there is one ([store] read_url).
    let reader = match state.reads.reader().await {
        Ok(r) => r,
        Err(e) => return store_down(e),
    };
    let page = match q.page(reader.store.as_ref(), DEFAULT_LIMIT).await {
        Ok(p) => p,
        Err(PageError::Query(e)) => {
            return problem(StatusCode::BAD_REQUEST, "bad query", &e.to_string());
        }
        Err(PageError::Store(e)) => return store_down(e),
    };
    let mut claims = page.claims;
    shown_claims(&state.config, &mut claims, exposure_of(&who));
    let views: Vec<ClaimView> = claims
        .iter()
        .map(|c| ClaimView {
            claim: c,
            stuck: c.is_stuck(page.now),
        })
        .collect();
    let next = page.next.map(|c| c.encode());
    let mut body = serde_json::json!({ "claims": views, "next_cursor": next });
    if state.reads.has_replica() {
        body["read_from"] = serde_json::json!(reader.from);
    }
    Json(body).into_response()
}

/// `?tenant=` of `GET /v1/claims/{consumer}/{message_id}` and of the claim page.
#[derive(Debug, Default, Deserialize)]
pub struct TenantQuery {
    /// The claim's tenant (empty: none).
    #[serde(default)]
    pub tenant: String,
}

/// A claim's payload as a view shows it: at most [`PAYLOAD_SHOWN_BYTES`], as text.
#[derive(Debug, Serialize)]
pub struct PayloadView {
    /// The payload's size in bytes.
    pub bytes: usize,
    /// Its first bytes, as UTF-8 (invalid sequences replaced).
    pub text: String,
    /// Only the first [`PAYLOAD_SHOWN_BYTES`] are in `text`.
    pub truncated: bool,
}

impl PayloadView {
    /// The view of `claim`'s payload.
    pub fn of(claim: &Claim) -> PayloadView {
        let shown = &claim.payload[..claim.payload.len().min(PAYLOAD_SHOWN_BYTES)];
        PayloadView {
            bytes: claim.payload.len(),
            text: String::from_utf8_lossy(shown).into_owned(),
            truncated: claim.payload.len() > PAYLOAD_SHOWN_BYTES,
        }
    }
}

/// How much of a claim's sensitive data (payload fields, the provider's answer, errors) the
/// operator page and the HTTP API show their viewer: everything to a person signed in with an
/// admin's own account, masked for everyone else — viewers, operators, and the shared admin
/// token (break-glass, not a person).
pub fn viewer_exposure(who: Option<&Identity>) -> Exposure {
    match who {
        Some(w) if w.source == IdentitySource::Account && w.role.may_see_sensitive() => {
            Exposure::Revealed
        }
        _ => Exposure::Masked,
    }
}

/// [`viewer_exposure`] of a request's identity, as the operator check handed it on.
pub fn exposure_of(who: &Option<Extension<Identity>>) -> Exposure {
    viewer_exposure(who.as_ref().map(|Extension(w)| w))
}

/// One claim, with its payload, and its history oldest first, as a viewer with `exposure`
/// sees them ([`shown_claim`]); `None`: no such claim.
pub async fn claim_with_history(
    store: &dyn ClaimStore,
    config: &Config,
    key: [&str; 3],
    exposure: Exposure,
) -> StoreResult<Option<(Claim, Vec<ClaimEvent>)>> {
    let [consumer, tenant, message_id] = key;
    let Some(mut claim) = store.find(consumer, tenant, message_id).await? else {
        return Ok(None);
    };
    let mut history = store.events(claim.id).await?;
    shown_claim(config, &mut claim, &mut history, exposure);
    Ok(Some((claim, history)))
}

/// `GET /v1/claims/{consumer}/{message_id}?tenant=`: the claim, its payload and its history.
pub async fn get_claim(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    Path((consumer, message_id)): Path<(String, String)>,
    Query(t): Query<TenantQuery>,
) -> Response {
    if let Some(refused) = crate::edge::http::problem::refusal([
        ("consumer", consumer.as_str()),
        ("message_id", &message_id),
        ("tenant", &t.tenant),
    ]) {
        return refused;
    }
    let store = state.claimer.store();
    let key = [consumer.as_str(), &t.tenant, &message_id];
    let found = claim_with_history(store.as_ref(), &state.config, key, exposure_of(&who)).await;
    let now = store.now().await;
    match (found, now) {
        (Ok(Some((claim, history))), Ok(now)) => {
            let behind = match store.waiting_behind(&claim).await {
                Ok(head) => head,
                Err(e) => return store_down(e),
            };
            let view = ClaimView {
                stuck: claim.is_stuck(now),
                claim: &claim,
            };
            Json(serde_json::json!({
                "claim": view,
                "payload": PayloadView::of(&claim),
                "history": history,
                "waiting_behind": behind,
                "trace_id": claim.trace_id(),
            }))
            .into_response()
        }
        (Ok(None), _) => problem(
            StatusCode::NOT_FOUND,
            "no such claim",
            &format!(
                "no claim {consumer}/{message_id} for tenant {:?} (search with GET /v1/claims?q=...)",
                t.tenant
            ),
        ),
        (Err(e), _) | (_, Err(e)) => store_down(e),
    }
}
