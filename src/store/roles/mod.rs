//! The store's traits by role, one file each: who calls what. [`ClaimStore`](super::ClaimStore)
//! is all of them together, with the few methods every role shares.

mod accounts;
mod engine;
mod intake;
mod ledger;
mod lines;
mod operator;
mod outbox;
mod reports;
mod schedules;
mod seal;

pub use accounts::AccountStore;
pub use engine::EngineStore;
pub use intake::IntakeStore;
pub use ledger::LedgerStore;
pub use lines::{LineHead, LineStore};
pub use operator::OperatorStore;
pub use outbox::OutboxStore;
pub use reports::ReportStore;
pub use schedules::{ScheduleSlot, ScheduleStore};
pub use seal::SealStore;
