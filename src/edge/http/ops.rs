//! The operations routes: the report, Prometheus metrics, liveness and
//! readiness.

use super::problem::{problem, store_down};
use crate::domain::claim::Claim;
use crate::edge::AppState;
use crate::ops::report::{self, SweeperHealth, Window};
use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A claim in operator views (no payload).
#[derive(Debug, Serialize)]
pub struct ClaimView<'a> {
    /// The claim.
    #[serde(flatten)]
    pub claim: &'a Claim,
    /// Started and past its lease.
    pub stuck: bool,
}

/// Parameters of `GET /v1/report`.
#[derive(Debug, Deserialize)]
pub struct ReportQuery {
    /// Query parameter `consumer`.
    pub consumer: Option<String>,
    /// Query parameter `since`.
    pub since: Option<String>,
}

/// `GET /v1/report`: the report JSON, as `claimd report --format json`.
pub async fn get_report(State(state): State<AppState>, Query(q): Query<ReportQuery>) -> Response {
    // Without `since`, the default window (24h), as `claimd report`; `since=all` for all time.
    let window = match q.since.as_deref().map(str::parse::<Window>).transpose() {
        Ok(w) => w.unwrap_or_default(),
        Err(e) => return problem(StatusCode::BAD_REQUEST, "bad since", &e.to_string()),
    };
    if let Err(e) = crate::ops::params::report_window("since", window)
        .and_then(|_| crate::ops::params::text("consumer", q.consumer.as_deref().unwrap_or("")))
    {
        return crate::edge::http::problem::bad_parameter(&e);
    }
    let names = state.config.consumer_names();
    // On the read replica when there is one ([store] read_url).
    let reader = match state.reads.reader().await {
        Ok(r) => r,
        Err(e) => return store_down(e),
    };
    match report::build(
        &reader.store,
        &names,
        q.consumer.as_deref(),
        window,
        state.sweep_period,
    )
    .await
    {
        Ok(mut r) => {
            r.sweeper = state.sweeper_health(r.sweeper.last_run_utc, r.generated_utc);
            if !state.reads.has_replica() {
                return Json(r).into_response();
            }
            let mut v = serde_json::json!(r);
            v["read_from"] = serde_json::json!(reader.from);
            Json(v).into_response()
        }
        Err(e) => store_down(e),
    }
}

/// `GET /metrics`: Prometheus exposition.
///
/// Prometheus text format 0.0.4 unless the scraper's `Accept` asks for OpenMetrics.
pub async fn metrics(State(state): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    let format = crate::engine::metrics::Exposition::negotiate(
        headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()),
    );
    let names = state.config.consumer_names();
    state.claimer.metrics().local_sweeper(state.sweeper.local());
    state
        .claimer
        .metrics()
        .body_bytes_in_flight(state.body_budget.in_use_bytes());
    let destinations: Vec<_> = state
        .claimer
        .consumers()
        .map(|c| (c.name().to_string(), c.destination.status()))
        .collect();
    state.claimer.metrics().destinations(&destinations);
    let keys: Vec<_> = state
        .claimer
        .consumers()
        .filter_map(|c| {
            let rk = c.rate_key.as_ref()?;
            let top = rk.paces.top(crate::engine::key_pace::TOP_KEYS);
            Some((c.name().to_string(), rk.paces.len(), top))
        })
        .collect();
    state.claimer.metrics().rate_keys.set(&keys);
    if state.claimer.store().dialect() == "postgres" {
        let mode = state.claimer.replication().get().map(|r| r.mode);
        let metrics = state.claimer.metrics();
        metrics
            .replication
            .set(mode.unwrap_or(crate::store::replication::ReplicationMode::Unknown));
    }
    if let Some(status) = state.reads.status().await {
        let metrics = state.claimer.metrics();
        metrics.replication.read_replica.set(&status);
    }
    match state
        .claimer
        .metrics()
        .render(state.claimer.store(), &names, format)
        .await
    {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            )],
            text,
        )
            .into_response(),
        Err(e) => store_down(e),
    }
}

/// The OpenAPI 3.1 document of this API (`docs/openapi.json`, built in).
pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// `GET /openapi.json`: the API's OpenAPI document (no token: it holds no data).
pub async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        OPENAPI,
    )
        .into_response()
}

/// `GET /healthz`: the process answers.
pub async fn healthz() -> Response {
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// `GET /readyz`: whether this instance can take work (store reachable, accepting, broker
/// connected, a synchronous standby when one is required), with the safety net's state in the
/// body (it does not decide readiness: a busy or not-yet-run sweeper is no reason to stop
/// sending this instance traffic).
#[derive(Debug, Serialize)]
pub struct Readiness {
    /// This instance can take work: store, accepting and broker all fine.
    pub ready: bool,
    /// Store reachable (`"ok"`), or what is wrong.
    pub store: String,
    /// Store writes succeed (`"ok"`), or the run of failed writes and the last error
    /// ([`crate::store::writes`]).
    pub writes: String,
    /// Taking new work (false while shutting down).
    pub accepting: bool,
    /// Every RabbitMQ consumer connected (`"ok"`), or which are not.
    pub broker: String,
    /// Dead-lettering works (`"ok"`), or which consumers' dead-letter publishes are failing,
    /// since when and why (their bad messages are requeued and come back). It does not decide
    /// readiness: good messages and HTTP intake still work.
    pub dead_letters: String,
    /// `"ok"`, unless `[store] require_synchronous_standby` is set and the store's replication
    /// is not synchronous now: then why (intake answers `503` meanwhile).
    pub replication: String,
    /// What the store's replication means for an acknowledged claim, as last read
    /// (PostgreSQL only; [`crate::store::replication::ReplicationMode`]): `synchronous`,
    /// `asynchronous`, `none` or `unknown`. It decides readiness only through `replication`.
    pub replication_mode: Option<&'static str>,
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

/// `"ok"` unless the last store writes all failed; then a write probe (at most one per
/// second), whose success ends the run.
async fn write_health(state: &AppState) -> String {
    let writes = state.claimer.writes();
    if writes.probe_due() {
        let probe = state.claimer.store().probe_write(state.claimer.instance());
        match tokio::time::timeout(READY_STORE_WAIT, probe).await {
            Ok(Ok(())) => writes.succeeded(),
            Ok(Err(e)) => writes.failed(&e),
            Err(_) => {}
        }
    }
    writes.failing().unwrap_or_else(|| "ok".into())
}

/// The broker intakes' lines as one: `ok` when none has a complaint, else theirs joined.
fn joined<const N: usize>(checks: [Option<Result<(), String>>; N]) -> String {
    let complaints: Vec<String> = checks
        .into_iter()
        .flatten()
        .filter_map(Result::err)
        .collect();
    if complaints.is_empty() {
        "ok".to_string()
    } else {
        complaints.join("; ")
    }
}

/// How long readiness waits for the store before calling it unavailable.
const READY_STORE_WAIT: Duration = Duration::from_secs(2);

/// `GET /readyz`: see [`Readiness`].
pub async fn readyz(State(state): State<AppState>) -> Response {
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
        writes: write_health(&state).await,
        accepting: state.claimer.is_accepting(),
        broker: joined([
            state.amqp.as_ref().map(|a| a.check()),
            state.nats.as_ref().map(|n| n.check()),
        ]),
        dead_letters: joined([
            state.amqp.as_ref().map(|a| a.dead_letter_check()),
            state.nats.as_ref().map(|n| n.dead_letter_check()),
        ]),
        replication: state
            .claimer
            .replication()
            .refusal()
            .unwrap_or_else(|| "ok".into()),
        replication_mode: (state.claimer.store().dialect() == "postgres").then(|| {
            let last = state.claimer.replication().get();
            last.map_or("unknown", |r| r.mode.as_str())
        }),
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
            body.store = store.trouble().map_or_else(
                || {
                    format!(
                        "store did not answer within {}s",
                        READY_STORE_WAIT.as_secs()
                    )
                },
                |why| format!("store unavailable: {why}"),
            )
        }
    }
    body.ready = body.store == "ok"
        && body.writes == "ok"
        && body.accepting
        && body.broker == "ok"
        && body.replication == "ok";
    let status = if body.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}
