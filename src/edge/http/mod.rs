//! The HTTP side's shared parts, apart from the routes that use them: the state every route
//! reaches, problem+json errors (`rejections`: the extractors' refusals as problem+json), the checks on parameters before the store is asked
//! (`params`), bearer-token checks (`auth`), who an operator is and what their role allows
//! (`operator_auth`), the operations routes, the operator actions and the audit. `api`
//! assembles the router from these, `intake::http` and the operator page (`dashboard`).

pub mod actions;
pub mod audit;
pub mod auth;
pub mod cancel;
pub mod claims;
pub mod erasure;
pub mod guard;
pub mod operator_auth;
pub mod ops;
pub mod problem;
pub mod provider_events;
pub mod rejections;
pub mod server;
pub mod session;
pub mod signin;
