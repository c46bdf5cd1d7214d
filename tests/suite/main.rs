//! The fast integration suite: one test binary, so `cargo test` links it once instead of once
//! per file. Each module was a test file of its own; a new test file goes here as a module,
//! not at the top of `tests/` (every file there is a binary of its own, linked separately).
//! The long suites (provider faults and trouble, slow clients, the browser, the reliability
//! harness) stay binaries of their own behind the `long-tests` feature (Cargo.toml; README).
//!
//! Run one module with `cargo test --features full --test suite edge::` (a filter on the test path).

#[path = "../common/mod.rs"]
mod common;

mod accounts;
mod amqp;
mod claim_search;
mod cli_bulk;
mod cli_friendly;
mod crash;
mod dashboard;
mod db_effect;
mod edge;
mod edge_headers;
mod edge_hostile;
mod edge_output;
mod email;
mod end_to_end;
mod enqueue;
mod enqueue_search_path;
mod erasure;
mod evidence_send;
mod examples_local;
mod failover;
mod flow;
mod followups;
mod generations;
mod hangups;
mod hostile_input;
mod intake;
mod ledger;
mod library;
mod lifecycle;
mod localstripe;
mod localstripe_reconcile;
mod memory_budget;
mod metrics;
mod metrics_format;
mod migrate_plan;
mod mixed_versions;
mod nats;
mod openapi;
mod operator;
mod operator_api;
mod outcomes;
mod page_actions;
mod pooler;
mod priorities;
mod properties;
mod provider_events;
mod providers;
mod read_replica;
mod readiness;
mod reconcile_by_value;
mod reindex;
mod replication;
mod report_waits;
mod sandbox;
mod schedules;
mod sealed;
mod signin;
mod storage_health;
mod store;
mod traces;
mod upgrade_locks;
mod vanished;
mod walkthrough;
mod webhook_signatures;
