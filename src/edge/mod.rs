//! The edges: the HTTP server and API, HTTP and AMQP intake, the operator page, and the
//! outcome relay that tells destinations what happened. Each turns a wire protocol into calls
//! on the engine and operations below.

pub mod api;
#[cfg(feature = "page")]
pub mod dashboard;
pub mod http;
pub mod intake;
pub mod outcome_relay;

use crate::config::Config;
use crate::engine::claimer::Claimer;
use crate::ops::report::{self, SweeperActivity, SweeperHealth};
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;

/// What every route can reach.
#[derive(Clone)]
pub struct AppState {
    /// The claimer (and through it the store and consumers).
    pub claimer: Arc<Claimer>,
    /// The configuration in force.
    pub config: Arc<Config>,
    /// Where operators' searches and reports read: the primary, or the read replica
    /// (`[store] read_url`).
    pub reads: crate::store::read_replica::Reads,
    /// The sweeper's schedule period, for readiness.
    pub sweep_period: Duration,
    /// RabbitMQ intake, whose connection state readiness reports.
    pub amqp: Option<Arc<crate::edge::intake::amqp::AmqpIntake>>,
    /// NATS JetStream intake, whose connection state readiness reports.
    pub nats: Option<Arc<crate::edge::intake::nats::NatsIntake>>,
    /// This worker's sweeper passes (running or not) and its start, for readiness.
    pub sweeper: Arc<SweeperActivity>,
    /// Bytes of request bodies that may be in memory at once (`[http] body_budget_bytes`).
    pub body_budget: Arc<crate::edge::http::server::BodyBudget>,
    /// Bytes of provider-event bodies that may be in memory at once
    /// (`[http] provider_event_budget_bytes`), apart from intake's.
    pub provider_event_budget: Arc<crate::edge::http::server::BodyBudget>,
    /// The cap on requests waiting for an outcome (`[http] max_waiters`).
    pub waiters: Arc<crate::engine::waiters::Waiters>,
    /// Sign-in throttle and refusal log limits, shared by every route.
    pub guard: Arc<http::guard::Guard>,
}

impl AppState {
    /// The sweeper's health as this worker sees it: the store's last pass start plus its own
    /// running pass and start-up grace period.
    pub fn sweeper_health(&self, last: Option<DateTime<Utc>>, now: DateTime<Utc>) -> SweeperHealth {
        report::sweeper_health(last, now, self.sweep_period, Some(self.sweeper.local()))
    }
}
