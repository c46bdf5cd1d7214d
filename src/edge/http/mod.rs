//! The HTTP side's shared parts, apart from the routes that use them: the state every route
//! reaches, problem+json errors (`rejections`: the extractors' refusals as problem+json), the checks on parameters before the store is asked
//! (`params`), bearer-token checks, the operations routes and the operator actions. `api`
//! assembles the router from these, `intake::http` and the operator page (`dashboard`).

pub mod actions;
pub mod auth;
pub mod cancel;
pub mod claims;
pub mod erasure;
pub mod guard;
pub mod ops;
pub mod problem;
pub mod provider_events;
pub mod rejections;
pub mod server;
pub mod session;
pub mod signin;
