//! The HTTP API on `[http] listen`: this module only assembles the routes — intake
//! (`intake::http`), the read API, the operations routes (`http::ops`), the operator page
//! (`dashboard`) and health — with the token checks of `http::auth`.
//!
//! Operations routes (`/`, the operator page; `/v1/claims`, `/v1/report`, `/v1/audit`, the
//! actions) need an operator's identity (`http::operator_auth`: an account's credential or
//! session, or the break-glass admin token) whose role allows what is asked; intake needs
//! `intake_token` when configured; token comparisons are constant-time.

pub use crate::domain::constant_time::constant_time_eq;
pub use crate::edge::AppState;
pub use crate::edge::http::auth::bearer_token;
pub use crate::edge::http::ops::{ClaimView, Readiness};
pub use crate::edge::http::problem::problem;

use crate::edge::http::auth::require_intake;
use crate::edge::http::operator_auth::require_admin;
use crate::edge::http::{actions, claims, ops, provider_events, rejections, signin};
use crate::edge::intake;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post};

/// Builds the router.
pub fn router(state: AppState) -> Router {
    let intake = Router::new()
        .route("/v1/messages/{consumer}", post(intake::http::post_message))
        .route(
            "/v1/events/{consumer}",
            post(intake::cloudevents::post_event),
        )
        .route(
            "/v1/messages/{consumer}/{message_id}",
            get(intake::http::get_message),
        )
        .layer(DefaultBodyLimit::max(state.config.http.max_body_bytes))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_intake,
        ));
    let admin = page_routes(
        Router::new()
            .route("/v1/claims", get(claims::list_claims))
            .route("/v1/claims/{consumer}/{message_id}", get(claims::get_claim))
            .route("/v1/report", get(ops::get_report))
            .route("/v1/audit", get(crate::edge::http::audit::get_audit))
            .route(
                "/v1/claims/{consumer}/{message_id}/resolve",
                post(actions::resolve),
            )
            .route(
                "/v1/claims/{consumer}/{message_id}/redrive",
                post(actions::redrive),
            )
            .route(
                "/v1/claims/{consumer}/{message_id}/cancel",
                post(crate::edge::http::cancel::cancel),
            )
            .route("/v1/erasures", post(crate::edge::http::erasure::erase)),
    )
    .route_layer(middleware::from_fn_with_state(state.clone(), require_admin));
    Router::new()
        .merge(intake)
        .merge(admin)
        // Signed by the provider, not by a token; its body is read under a budget of its own
        // (see `http::provider_events`).
        .route(
            "/v1/provider-events/{consumer}",
            post(provider_events::post_event),
        )
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .route("/signin", get(signin::form).post(signin::sign_in))
        .route("/signout", post(signin::sign_out))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "not found", "no such route") })
        .with_state(state)
        // Outermost: a query that is not UTF-8 is refused before any route reads it lossily,
        // and every extractor's rejection leaves as problem+json.
        .layer(middleware::from_fn(rejections::problem_rejections))
}

/// The operator page's routes (`GET /`, the claim pages, the actions), behind the admin token.
#[cfg(feature = "page")]
fn page_routes(admin: Router<AppState>) -> Router<AppState> {
    admin
        .route("/", get(crate::edge::dashboard::page))
        .route("/claims", get(crate::edge::dashboard::claims::search))
        .route(
            "/claims/{consumer}/{message_id}",
            get(crate::edge::dashboard::claims::claim),
        )
        .route("/audit", get(crate::edge::dashboard::audit::audit_page))
        .route(
            "/actions/preview",
            post(crate::edge::dashboard::actions::preview),
        )
        .route(
            "/actions/apply",
            post(crate::edge::dashboard::actions::apply),
        )
}

/// Without the `page` feature `GET /` says why there is no page.
#[cfg(not(feature = "page"))]
fn page_routes(admin: Router<AppState>) -> Router<AppState> {
    admin.route(
        "/",
        get(|| async {
            problem(
                StatusCode::NOT_FOUND,
                "no operator page",
                &crate::domain::features::missing("page"),
            )
        }),
    )
}
