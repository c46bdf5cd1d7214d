//! HTTP intake as a client sees it: statuses, problem bodies, duplicates and conflicts, and
//! that refused input leaves the store unchanged. By role: `bad_input` (refusals and the intake
//! token), `saturation` (a consumer at its limits), `keys` (keys, tenants and headers).

use crate::common;

use claimd::provider::sandbox::SandboxOptions;
use claimd::store::ClaimFilter;
use common::*;
use std::time::Duration;

mod bad_input;
mod cloudevents;
mod keys;
mod saturation;

async fn claim_count(running: &claimd::service::run::Running) -> usize {
    running
        .app()
        .store
        .list(&ClaimFilter {
            limit: 100_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .len()
}
