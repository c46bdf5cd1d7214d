//! Intake: where messages come in. Each source turns a message into a
//! [`Delivery`](crate::engine::claimer::Delivery) and acknowledges only after
//! [`Claimer::submit`](crate::engine::claimer::Claimer::submit) returns.

#[cfg(feature = "amqp")]
pub mod amqp;
#[cfg(not(feature = "amqp"))]
pub mod amqp_off;
#[cfg(not(feature = "amqp"))]
pub use amqp_off as amqp;
pub mod answer;
pub mod broker;
pub mod cloudevents;
#[cfg(any(feature = "amqp", feature = "nats"))]
pub(crate) mod guard;
pub mod http;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(not(feature = "nats"))]
pub mod nats_off;
#[cfg(not(feature = "nats"))]
pub use nats_off as nats;
pub mod refusal;
