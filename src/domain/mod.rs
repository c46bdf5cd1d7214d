//! The pure domain: claims and their states, durations, the checks and text helpers every
//! layer shares. No I/O and nothing from the layers above.

pub mod claim;
pub mod constant_time;
pub mod credential;
pub mod duration;
pub mod features;
pub mod follow_up;
pub mod generation;
pub mod json_body;
pub mod operator_role;
pub mod order_key;
pub mod periodic;
pub mod priority;
pub mod redaction;
pub mod schedule;
pub mod sealed;
pub mod table;
pub mod trace_context;
pub mod url_segment;
