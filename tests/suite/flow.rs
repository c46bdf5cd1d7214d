//! Flow control per key (docs/flow-control.md), on PostgreSQL and SQLite: order keys' lines
//! across a flapping provider and SIGKILLs (`order`), fair taking across tenants (`fairness`).

#[path = "flow/fairness.rs"]
mod fairness;
#[path = "flow/lines.rs"]
mod lines;
#[path = "flow/order.rs"]
mod order;
#[path = "flow/rate_key.rs"]
mod rate_key;
#[path = "flow/schedule.rs"]
mod schedule;
#[path = "flow/seams.rs"]
mod seams;
