//! Running PostgreSQL's statements through a pooler in transaction mode (PgBouncer with
//! `pool_mode = transaction`, RDS Proxy): [`Pooler`], `[store] pooler`.
//!
//! Such a pooler hands each *transaction* of a client to whichever server connection is free,
//! and gives the connection back at the end of it; a statement outside an explicit
//! transaction is a transaction of its own. Session state does not survive that:
//!
//! - sqlx prepares every statement under a name (`sqlx_s_1`, …) kept per client connection;
//!   on a server connection another client already used, the name exists (`prepared
//!   statement "sqlx_s_1" already exists`) or is another statement ("bind message supplies N
//!   parameters"). So every statement is prepared unnamed (`persistent(false)`);
//! - an unnamed statement is parsed in one round trip (ending in `Sync`) and bound in the
//!   next: between the two the pooler may switch server connections. So every statement
//!   that is not already inside a transaction runs in one of its own (`BEGIN`, the
//!   statement, `COMMIT`), which pins one server connection for both halves.
//!
//! This works the same with PgBouncer 1.21+ and `max_prepared_statements` set: that setting
//! tracks named statements, which claimd then does not use. How a statement is run so is
//! [`SqlPool`](super::dialect::SqlPool)'s (`all`, `optional`, `run`, `in_tx`).

use serde::{Deserialize, Serialize};

/// What sits between claimd and PostgreSQL (`[store] pooler`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooler {
    /// Nothing, or a pooler in session mode: a client keeps its server connection.
    #[default]
    None,
    /// A pooler in transaction mode: no named statement, every statement in a transaction,
    /// no `LISTEN` (enqueued claims are found by polling), no session advisory lock.
    Transaction,
}

impl Pooler {
    /// Whether statements must avoid every kind of session state.
    pub fn per_transaction(self) -> bool {
        self == Pooler::Transaction
    }

    /// The name `[store] pooler` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::None => "none",
            Pooler::Transaction => "transaction",
        }
    }
}
