//! The engine: claim -> call -> settle, and what finishes the rest: the sweeper and its
//! pending poller, retention, the policy that classifies answers, destinations (breaker and
//! pace), waiters of `Prefer: wait`, provider events applied to claims, and the metrics and
//! traces the engine keeps. Uses config, provider, store and domain.

pub mod claimer;
pub mod consumer;
pub mod destination;
pub mod enqueued;
pub mod follow_ups;
pub mod key_pace;
pub mod metrics;
pub mod periodic;
pub mod policy;
pub mod provider_event;
pub mod retention;
pub mod settle;
pub mod sweep_activity;
pub mod sweeper;
pub mod traces;
pub mod waiters;
