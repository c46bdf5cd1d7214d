//! The spill file of a build without the `sqlite` feature: the ledger spills the provider's
//! objects to a temporary SQLite file, so without SQLite `claimd reconcile --ledger` says so.

use super::LedgerError;
use super::matching::LedgerObject;

/// No spill file without SQLite: [`Spill::create`] refuses, so none exists.
#[derive(Debug)]
pub enum Spill {}

impl Spill {
    /// Refuses: the ledger needs the `sqlite` feature.
    pub async fn create() -> Result<Spill, LedgerError> {
        Err(LedgerError::Spill(crate::domain::features::missing(
            "sqlite",
        )))
    }
    /// Never called: no spill exists.
    pub async fn insert(&self, _objects: &[LedgerObject]) -> Result<(), LedgerError> {
        match *self {}
    }
    /// Never called: no spill exists.
    pub async fn seal(&self) -> Result<(), LedgerError> {
        match *self {}
    }
    /// Never called: no spill exists.
    pub async fn page(
        &self,
        _after: Option<&LedgerObject>,
        _limit: u32,
    ) -> Result<Vec<LedgerObject>, LedgerError> {
        match *self {}
    }
}
