//! What can go wrong talking to the store: [`StoreError`], with outages (worth retrying)
//! told apart from bugs.

use super::url::redact_url;

/// What can go wrong talking to the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached (connection refused, pool timed out, I/O).
    #[error("store unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A statement failed for another reason.
    #[error("store query {query} failed: {source}")]
    Query {
        /// The named statement.
        query: &'static str,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// Migrations could not be applied.
    #[error("migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value makes no sense (an unknown state name, say).
    #[error("corrupt row in claims: {0}")]
    Corrupt(String),
    /// A row kept changing between reading it and writing a decision on it (a provider
    /// event meeting polls and settles): worth retrying.
    #[error("contended: {0}")]
    Contended(String),
    /// The store URL is not one claimd knows (shown with its credentials redacted).
    #[error("store url {}: expected sqlite:... or postgres://...", redact_url(.0))]
    BadUrl(String),
}

impl StoreError {
    /// Wraps a driver error from the named statement, telling outages apart from bugs.
    pub fn from_sqlx(query: &'static str, source: sqlx::Error) -> Self {
        match source {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(source),
            sqlx::Error::Database(ref db)
                if db.code().is_some_and(|c| {
                    // 57P01 admin shutdown, 57P03 cannot connect now, 08xxx connection errors,
                    // SQLITE_BUSY (5) and SQLITE_LOCKED (6).
                    c.starts_with("08") || c == "57P01" || c == "57P03" || c == "5" || c == "6"
                }) =>
            {
                StoreError::Unavailable(source)
            }
            source => StoreError::Query { query, source },
        }
    }

    /// Whether retrying later may succeed.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Contended(_))
    }
}

/// Result alias for store calls.
pub type StoreResult<T> = Result<T, StoreError>;
