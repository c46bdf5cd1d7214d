//! Operations: what operators read and do: the report, reconciliation, claim queries,
//! operator actions and commands, the ledger (claimd's claims against the provider's own
//! list). Uses the engine and the layers below; the edges (CLI, HTTP, page) call it.

pub mod accounts;
pub mod audit;
pub mod claim_family;
pub mod claim_query;
pub mod erasure;
pub mod exposure;
pub mod keys;
pub mod ledger;
pub mod operator_action;
pub mod operator_command;
pub mod params;
pub mod periodic;
pub mod reconcile;
pub mod report;
pub mod schedule;
