//! What can go wrong talking to the store: [`StoreError`], with outages (worth retrying)
//! told apart from bugs.

use super::url::redact_url;

/// What can go wrong talking to the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached (connection refused, pool timed out, I/O).
    #[error("store unavailable: {}", driver_words(.0))]
    Unavailable(#[source] sqlx::Error),
    /// The database refused a value as data it cannot hold (PostgreSQL's data exceptions,
    /// SQLSTATE class 22: a NUL in text, a time out of its range): the caller's input, never
    /// worth retrying. The routes check their input first; this is the last line.
    #[error("store query {query} refused a value: {}", driver_words(source))]
    BadInput {
        /// The named statement.
        query: &'static str,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// No server of the store URL takes writes now (a failover under way): which answered
    /// what. Worth retrying: the failover monitor points the pool at the new primary.
    #[error("store unavailable: {0}")]
    NoPrimary(String),
    /// A statement failed for another reason.
    #[error("store query {query} failed: {}", driver_words(source))]
    Query {
        /// The named statement.
        query: &'static str,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// Migrations could not be applied.
    #[error("migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database has a contract migration this build does not know (it removed or changed
    /// what this build reads): a newer release migrated it.
    #[error(
        "this database has migration {version:04} ({description}), which a newer claimd applied and \
         which changes what this build reads: deploy claimd built with migration {version:04} or \
         newer (docs/operations.md, \"Upgrading\")"
    )]
    SchemaTooNew {
        /// The contract migration's version.
        version: i64,
        /// Its description.
        description: String,
    },
    /// A stored value makes no sense (an unknown state name, say).
    #[error("corrupt row in claims: {0}")]
    Corrupt(String),
    /// A row kept changing between reading it and writing a decision on it (a provider
    /// event meeting polls and settles): worth retrying.
    #[error("contended: {0}")]
    Contended(String),
    /// The store already runs as many claim searches as it allows at once, and none ended
    /// within the wait: worth retrying shortly.
    #[error("busy: {0}")]
    Busy(String),
    /// The store URL is not one claimd knows (shown with its credentials redacted).
    #[error("store url {}: expected sqlite:... or postgres://...", redact_url(.0))]
    BadUrl(String),
    /// The store URL is refused, and why (shown with its credentials redacted).
    #[error("store url {}: {}", redact_url(.0), .1)]
    UrlRefused(String, String),
    /// The store URL names a database this build left out (its Cargo feature, `postgres` or
    /// `sqlite`, is off).
    #[error("store url {}: {}", redact_url(.0), crate::domain::features::missing(.1))]
    NotBuiltIn(String, &'static str),
    /// Migrations are pending and the store is reached through a pooler in transaction mode
    /// (`[store] pooler`), where sqlx's migration lock, a session advisory lock, would be
    /// taken on one server connection and released on another.
    #[error(
        "migrations are pending, and with [store] pooler = \"transaction\" claimd does not apply \
         them through the pooler: run `claimd migrate` against PostgreSQL itself (its own URL, \
         with CLAIMD__STORE__POOLER=none), then start again"
    )]
    PendingBehindPooler,
    /// An operator asked to send a claim whose payload was erased (payload retention or
    /// `claimd claims erase`): there is nothing left to send, so it is never sent again.
    #[error(
        "{0}: its payload was erased, so it can never be sent again; if the effect is still \
         wanted, submit it as a new message (a new message id) with the full payload"
    )]
    Erased(String),
    /// The role claimd connected as does not own the tables it was asked to change
    /// (`claimd reindex`): the owner, the role that runs `claimd migrate`, must.
    #[error(
        "{0}: only the owner of claimd's tables may do this; run it as the role that runs \
         `claimd migrate` (CLAIMD__STORE__URL with the owner's credentials)"
    )]
    NotOwner(String),
}

impl StoreError {
    /// Wraps a driver error from the named statement, telling outages apart from bugs.
    pub fn from_sqlx(query: &'static str, source: sqlx::Error) -> Self {
        match source {
            ref e if connection_lost(e) => StoreError::Unavailable(source),
            // SQLITE_BUSY (5) and SQLITE_LOCKED (6).
            sqlx::Error::Database(ref db) if db.code().is_some_and(|c| c == "5" || c == "6") => {
                StoreError::Unavailable(source)
            }
            sqlx::Error::Database(ref db) if db.code().is_some_and(|c| is_data_exception(&c)) => {
                StoreError::BadInput { query, source }
            }
            source => StoreError::Query { query, source },
        }
    }

    /// Whether the database refused the caller's input ([`StoreError::BadInput`]).
    pub fn is_bad_input(&self) -> bool {
        matches!(self, StoreError::BadInput { .. })
    }

    /// Whether retrying later may succeed.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_)
                | StoreError::NoPrimary(_)
                | StoreError::Contended(_)
                | StoreError::Busy(_)
        )
    }
}

/// Whether a driver error ends or refuses the connection rather than answers a statement
/// (I13): no connection to be had (I/O, TLS, the pool timed out or closed), PostgreSQL's class
/// `08` connection errors, `57P01` to `57P03` (shut down by an administrator — every
/// connection gets it on a fast restart or failover —, crashed, starting), `53300` (no free
/// connection) and `25006` (a read-only server: a standby after a failover). Nothing is
/// decided on such an error: the work is run again on a fresh connection.
pub fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| connection_lost_code(&c)),
        _ => false,
    }
}

/// The SQLSTATEs of [`connection_lost`].
fn connection_lost_code(code: &str) -> bool {
    matches!(code, "57P01" | "57P02" | "57P03" | "53300" | "25006")
        || (code.len() == 5 && code.starts_with("08"))
}

/// A driver error in the database's own words: its message and code, without the "at line N"
/// PostgreSQL's errors end with (a line of the server's C source, which users read as a line
/// of their statement). Other errors as the driver says them.
pub fn driver_words(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("{} (code {code})", db.message()),
            None => db.message().to_string(),
        },
        other => other.to_string(),
    }
}

/// A PostgreSQL data exception: SQLSTATE class 22 (22021 invalid byte sequence, 22008
/// datetime field overflow, 22P05 untranslatable character, ...). SQLSTATEs have five
/// characters; SQLite's codes (numbers, at most four digits) never match.
fn is_data_exception(code: &str) -> bool {
    code.len() == 5 && code.starts_with("22")
}

/// Result alias for store calls.
pub type StoreResult<T> = Result<T, StoreError>;

#[cfg(test)]
mod tests {
    use super::{connection_lost_code, is_data_exception};

    #[test]
    fn connection_errors_are_those_that_end_a_session() {
        for code in ["57P01", "57P03", "25006", "08006", "53300"] {
            assert!(connection_lost_code(code), "{code}");
        }
        for code in ["40P01", "23505", "57014", "5", "0800"] {
            assert!(!connection_lost_code(code), "{code}");
        }
    }

    #[test]
    fn data_exceptions_are_postgresql_class_22_only() {
        for code in ["22021", "22008", "22P05", "22007"] {
            assert!(is_data_exception(code), "{code}");
        }
        // 23505 unique violation, 08006 connection failure; SQLite's 22 (SQLITE_NOLFS), 2067.
        for code in ["23505", "08006", "22", "2067", "57P01"] {
            assert!(!is_data_exception(code), "{code}");
        }
    }
}
