//! Intake: where messages come in. Each source turns a message into a
//! [`Delivery`](crate::engine::claimer::Delivery) and acknowledges only after
//! [`Claimer::submit`](crate::engine::claimer::Claimer::submit) returns.

pub mod amqp;
pub mod answer;
pub mod http;
