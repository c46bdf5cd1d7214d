//! The NATS intake of a build without the `nats` feature: it has no consumers (a configuration
//! with `source = "nats"` is refused at load), so there is nothing to start, check or stop.

use crate::config::Config;
use crate::engine::claimer::Claimer;
use std::sync::Arc;

/// The NATS intake without NATS: no consumers.
#[derive(Debug, Default)]
pub struct NatsIntake {}

impl NatsIntake {
    /// Nothing to start: the configuration has no NATS consumer (refused at load).
    pub fn start(_claimer: Arc<Claimer>, _config: &Config) -> NatsIntake {
        NatsIntake {}
    }
    /// Trivially connected.
    pub fn connected(&self) -> bool {
        true
    }
    /// Ready.
    pub fn check(&self) -> Result<(), String> {
        Ok(())
    }
    /// No dead-letter publish failing.
    pub fn dead_letter_check(&self) -> Result<(), String> {
        Ok(())
    }
    /// Nothing to stop.
    pub async fn stop(&self) {}
}
