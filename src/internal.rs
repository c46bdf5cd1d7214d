//! claimd's parts other than the front door: the store, the claimer, the sweeper, intake, the
//! HTTP API, the CLI, the operator page, the sandbox provider, reports and metrics.
//!
//! Public only because the `claimd` binary, the integration tests, the benchmarks and the
//! examples of claimd's repository are crates of their own and use these parts directly.
//! **No stability promise**: anything here may change in any release. A program embedding
//! claimd uses the crate root ([`crate::Worker`] and the types beside it; `docs/library.md`).
//! Inside the crate every module here is also reachable as `crate::<module>`.

#[path = "api.rs"]
pub mod api;
#[path = "app.rs"]
pub mod app;
#[path = "claim.rs"]
pub mod claim;
#[path = "claim_query.rs"]
pub mod claim_query;
#[path = "claimer/mod.rs"]
pub mod claimer;
#[path = "cli/mod.rs"]
pub mod cli;
#[path = "config/mod.rs"]
pub mod config;
#[path = "consumer.rs"]
pub mod consumer;
#[path = "dashboard/mod.rs"]
pub mod dashboard;
#[path = "destination.rs"]
pub mod destination;
#[path = "duration.rs"]
pub mod duration;
#[path = "effect/mod.rs"]
pub mod effect;
#[path = "http/mod.rs"]
pub mod http;
#[path = "intake/mod.rs"]
pub mod intake;
#[path = "ledger/mod.rs"]
pub mod ledger;
#[path = "lookup.rs"]
pub mod lookup;
#[path = "metrics.rs"]
pub mod metrics;
#[path = "operator_action.rs"]
pub mod operator_action;
#[path = "operator_command.rs"]
pub mod operator_command;
#[path = "outcome_relay/mod.rs"]
pub mod outcome_relay;
#[path = "pending_poller.rs"]
pub mod pending_poller;
#[path = "policy.rs"]
pub mod policy;
#[path = "provider_events/mod.rs"]
pub mod provider_events;
#[path = "reconcile.rs"]
pub mod reconcile;
#[path = "report.rs"]
pub mod report;
#[path = "retention.rs"]
pub mod retention;
#[path = "run.rs"]
pub mod run;
#[path = "sandbox/mod.rs"]
pub mod sandbox;
#[path = "server.rs"]
pub mod server;
#[path = "settle.rs"]
pub mod settle;
#[path = "store/mod.rs"]
pub mod store;
#[path = "sweeper.rs"]
pub mod sweeper;
#[path = "table.rs"]
pub mod table;
#[path = "tls.rs"]
pub mod tls;
