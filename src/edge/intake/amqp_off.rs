//! The AMQP intake of a build without the `amqp` feature: it has no consumers (a configuration
//! with `source = "amqp"` is refused at load), so there is nothing to start, check or stop.

use crate::config::Config;
use crate::engine::claimer::Claimer;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use super::refusal::DeadLetterReason;

/// One AMQP consumer's state; none exist without the AMQP intake.
#[derive(Debug)]
pub enum AmqpConsumerState {}

impl AmqpConsumerState {
    /// The consumer's name.
    pub fn name(&self) -> &str {
        match *self {}
    }
    /// Whether its session is up.
    pub fn connected(&self) -> bool {
        match *self {}
    }
    /// The last connection error.
    pub fn last_error(&self) -> Option<String> {
        match *self {}
    }
    /// Messages dead-lettered, by reason.
    pub fn dead_lettered(&self) -> BTreeMap<DeadLetterReason, u64> {
        match *self {}
    }
}

/// The AMQP intake without AMQP: no consumers.
#[derive(Debug, Default)]
pub struct AmqpIntake {}

impl AmqpIntake {
    /// Nothing to start: the configuration has no AMQP consumer (refused at load).
    pub fn start(_claimer: Arc<Claimer>, _config: &Config) -> AmqpIntake {
        AmqpIntake {}
    }
    /// No consumers.
    pub fn consumers(&self) -> &[Arc<AmqpConsumerState>] {
        &[]
    }
    /// No consumer has any name.
    pub fn consumer(&self, _name: &str) -> Option<&Arc<AmqpConsumerState>> {
        None
    }
    /// Trivially connected.
    pub fn connected(&self) -> bool {
        true
    }
    /// Nothing disconnected.
    pub fn disconnected(&self) -> Vec<String> {
        Vec::new()
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
