//! The edges: the HTTP server and API, HTTP and AMQP intake, the operator page, and the
//! outcome relay that tells destinations what happened. Each turns a wire protocol into calls
//! on the engine and operations below.

pub mod api;
pub mod dashboard;
pub mod http;
pub mod intake;
pub mod outcome_relay;
