//! claimd makes external side effects (payments, emails, webhooks) happen exactly once in
//! effect, although the messages asking for them arrive at least once.
//!
//! A message is claimed (a row committed alone, unique on consumer, tenant and message id),
//! acknowledged, then performed with the message's idempotency key and settled. A sweeper
//! finishes what a crash or a timeout left `started`. See `docs/architecture.md`.

#![warn(missing_docs)]

pub mod api;
pub mod app;
pub mod claim;
pub mod claim_query;
pub mod claimer;
pub mod cli;
pub mod config;
pub mod consumer;
pub mod dashboard;
pub mod destination;
pub mod duration;
pub mod effect;
pub mod http;
pub mod intake;
pub mod ledger;
pub mod lookup;
pub mod metrics;
pub mod operator_action;
pub mod operator_command;
pub mod outcome_relay;
pub mod pending_poller;
pub mod policy;
pub mod provider_events;
pub mod reconcile;
pub mod report;
pub mod retention;
pub mod run;
pub mod sandbox;
pub mod server;
pub mod settle;
pub mod store;
pub mod sweeper;
pub mod table;
