//! Intake: where messages come in. Each source turns a message into a
//! [`Delivery`](crate::claimer::Delivery) and acknowledges only after
//! [`Claimer::submit`](crate::claimer::Claimer::submit) returns.

pub mod amqp;
pub mod answer;
pub mod http;
pub mod json_body;
pub mod waiters;
