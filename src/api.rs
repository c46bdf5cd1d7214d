//! The HTTP API on `[http] listen`: intake, the read API, operations routes and health.
//!
//! Operations routes (`/`, the operator page; `/v1/claims`, `/v1/report`) need
//! `Authorization: Bearer <admin_token>`
//! when a token is configured; the comparison is constant-time.

use crate::claim::{Claim, ClaimState};
use crate::claimer::Claimer;
use crate::config::Config;
use crate::intake;
use crate::report::{self, SweeperActivity, SweeperHealth, Window};
use crate::store::ClaimFilter;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// What every route can reach.
#[derive(Clone)]
pub struct AppState {
    /// The claimer (and through it the store and consumers).
    pub claimer: Arc<Claimer>,
    /// The configuration in force.
    pub config: Arc<Config>,
    /// The sweeper's schedule period, for readiness.
    pub sweep_period: Duration,
    /// RabbitMQ intake, whose connection state readiness reports.
    pub amqp: Option<Arc<crate::intake::amqp::AmqpIntake>>,
    /// This worker's sweeper passes (running or not) and its start, for readiness.
    pub sweeper: Arc<SweeperActivity>,
    /// Bytes of request bodies that may be in memory at once (`[http] body_budget_bytes`).
    pub body_budget: Arc<crate::server::BodyBudget>,
}

impl AppState {
    /// The sweeper's health as this worker sees it: the store's last pass start plus its own
    /// running pass and start-up grace period.
    pub fn sweeper_health(&self, last: Option<DateTime<Utc>>, now: DateTime<Utc>) -> SweeperHealth {
        report::sweeper_health(last, now, self.sweep_period, Some(self.sweeper.local()))
    }
}

/// An `application/problem+json` answer.
pub fn problem(status: StatusCode, title: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r
}

/// Compares two secrets in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is case-insensitive
/// (RFC 9110 §11.1: `bearer`, `BEARER`) and may be followed by several spaces.
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at(value.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

fn bearer_ok(expected: &str, req: &Request) -> bool {
    if expected.is_empty() {
        return true;
    }
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => {
            bearer_token(v.as_bytes()).is_some_and(|got| constant_time_eq(got, expected.as_bytes()))
        }
        // None, or two Authorization headers: which one counts would be a guess.
        _ => false,
    }
}

async fn require_admin(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if bearer_ok(&state.config.http.admin_token, &req) {
        next.run(req).await
    } else {
        unauthorized()
    }
}

async fn require_intake(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if bearer_ok(&state.config.http.intake_token, &req) {
        next.run(req).await
    } else {
        unauthorized()
    }
}

fn unauthorized() -> Response {
    let mut r = problem(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "this route needs Authorization: Bearer <token>",
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// Builds the router.
pub fn router(state: AppState) -> Router {
    let intake = Router::new()
        .route("/v1/messages/{consumer}", post(intake::http::post_message))
        .route(
            "/v1/messages/{consumer}/{message_id}",
            get(intake::http::get_message),
        )
        .layer(DefaultBodyLimit::max(state.config.http.max_body_bytes))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_intake,
        ));
    let admin = Router::new()
        .route("/v1/claims", get(list_claims))
        .route("/v1/report", get(get_report))
        .route("/", get(crate::dashboard::page))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_admin));
    Router::new()
        .merge(intake)
        .merge(admin)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "not found", "no such route") })
        .with_state(state)
}

/// A claim in operator views (no payload).
#[derive(Debug, Serialize)]
pub struct ClaimView<'a> {
    /// The claim.
    #[serde(flatten)]
    pub claim: &'a Claim,
    /// Started and past its lease.
    pub stuck: bool,
}

#[derive(Debug, Deserialize)]
struct ClaimsQuery {
    state: Option<String>,
    consumer: Option<String>,
    stuck: Option<bool>,
    limit: Option<u32>,
}

async fn list_claims(State(state): State<AppState>, Query(q): Query<ClaimsQuery>) -> Response {
    let st = match q.state.as_deref().map(str::parse::<ClaimState>).transpose() {
        Ok(s) => s,
        Err(e) => return problem(StatusCode::BAD_REQUEST, "bad state", &e.to_string()),
    };
    let filter = ClaimFilter {
        state: st,
        consumer: q.consumer,
        stuck: q.stuck.unwrap_or(false),
        since: None,
        limit: q.limit.unwrap_or(100).min(10_000),
    };
    let store = state.claimer.store();
    let (claims, now) = match (store.list(&filter).await, store.now().await) {
        (Ok(c), Ok(n)) => (c, n),
        (Err(e), _) | (_, Err(e)) => return store_down(e),
    };
    let views: Vec<ClaimView> = claims
        .iter()
        .map(|c| ClaimView {
            claim: c,
            stuck: c.is_stuck(now),
        })
        .collect();
    Json(serde_json::json!({ "claims": views })).into_response()
}

#[derive(Debug, Deserialize)]
struct ReportQuery {
    consumer: Option<String>,
    since: Option<String>,
}

async fn get_report(State(state): State<AppState>, Query(q): Query<ReportQuery>) -> Response {
    // Without `since`, the default window (24h), as `claimd report`; `since=all` for all time.
    let window = match q.since.as_deref().map(str::parse::<Window>).transpose() {
        Ok(w) => w.unwrap_or_default(),
        Err(e) => return problem(StatusCode::BAD_REQUEST, "bad since", &e.to_string()),
    };
    let names = state.config.consumer_names();
    match report::build(
        state.claimer.store(),
        &names,
        q.consumer.as_deref(),
        window,
        state.sweep_period,
    )
    .await
    {
        Ok(mut r) => {
            r.sweeper = state.sweeper_health(r.sweeper.last_run_utc, r.generated_utc);
            Json(r).into_response()
        }
        Err(e) => store_down(e),
    }
}

fn store_down(e: crate::store::StoreError) -> Response {
    tracing::warn!(error = %e, "store read failed");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "store unavailable",
        "the claim store could not be read; retry",
    )
}

async fn metrics(State(state): State<AppState>) -> Response {
    let names = state.config.consumer_names();
    state.claimer.metrics().local_sweeper(state.sweeper.local());
    state
        .claimer
        .metrics()
        .body_bytes_in_flight(state.body_budget.in_use_bytes());
    match state
        .claimer
        .metrics()
        .render(state.claimer.store(), &names)
        .await
    {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            )],
            text,
        )
            .into_response(),
        Err(e) => store_down(e),
    }
}

async fn healthz() -> Response {
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// `GET /readyz`: whether this instance can take work (store reachable, accepting, broker
/// connected), with the safety net's state in the body (it does not decide readiness: a busy
/// or not-yet-run sweeper is no reason to stop sending this instance traffic).
#[derive(Debug, Serialize)]
pub struct Readiness {
    /// This instance can take work: store, accepting and broker all fine.
    pub ready: bool,
    /// Store reachable (`"ok"`), or what is wrong.
    pub store: String,
    /// Taking new work (false while shutting down).
    pub accepting: bool,
    /// Every RabbitMQ consumer connected (`"ok"`), or which are not.
    pub broker: String,
    /// The sweeper: `"ok"`, or what is going on (starting, a long pass, not running).
    pub sweeper: String,
    /// The sweeper's health in detail (status, running, last pass start).
    pub sweeper_health: Option<SweeperHealth>,
    /// Start of the last sweeper pass by any instance.
    pub sweeper_last_run_utc: Option<DateTime<Utc>>,
    /// `started` claims past their lease, all consumers.
    pub stuck: Option<i64>,
    /// Age of the oldest `started` claim, seconds.
    pub oldest_started_age_s: Option<f64>,
}

/// How long readiness waits for the store before calling it unavailable.
const READY_STORE_WAIT: Duration = Duration::from_secs(2);

async fn readyz(State(state): State<AppState>) -> Response {
    let store = state.claimer.store();
    let reads = async {
        store.ping().await?;
        let now = store.now().await?;
        let last = store.last_sweep().await?;
        let open = store.open_counts().await?;
        Ok::<_, crate::store::StoreError>((now, last, open))
    };
    let mut body = Readiness {
        ready: false,
        store: "ok".into(),
        accepting: state.claimer.is_accepting(),
        broker: match state.amqp.as_ref().map(|a| a.check()) {
            None | Some(Ok(())) => "ok".to_string(),
            Some(Err(e)) => e,
        },
        sweeper: "unknown (store unavailable)".into(),
        sweeper_health: None,
        sweeper_last_run_utc: None,
        stuck: None,
        oldest_started_age_s: None,
    };
    match tokio::time::timeout(READY_STORE_WAIT, reads).await {
        Ok(Ok((now, last, open))) => {
            let health = state.sweeper_health(last, now);
            body.sweeper = health.describe(state.sweep_period);
            body.sweeper_health = Some(health);
            body.sweeper_last_run_utc = last;
            body.stuck = Some(open.iter().map(|c| c.stuck).sum());
            body.oldest_started_age_s = open
                .iter()
                .filter_map(|c| c.oldest_started_age_s)
                .reduce(f64::max);
        }
        Ok(Err(e)) => body.store = e.to_string(),
        Err(_) => {
            body.store = format!(
                "store did not answer within {}s",
                READY_STORE_WAIT.as_secs()
            )
        }
    }
    body.ready = body.store == "ok" && body.accepting && body.broker == "ok";
    let status = if body.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for v in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "bEaReR   s3cret",
        ] {
            assert_eq!(bearer_token(v.as_bytes()), Some(&b"s3cret"[..]), "{v}");
        }
        for v in ["Basic s3cret", "Bearers3cret", "Bearer ", "s3cret", ""] {
            assert_eq!(bearer_token(v.as_bytes()), None, "{v}");
        }
    }
}
