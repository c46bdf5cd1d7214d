//! A store error as an operator reads it on the command line: what failed and what to do, in
//! the database's own words, never the driver's internals (PostgreSQL's errors carry the
//! line of the server's C source they came from, `... at line 948`, which says nothing to
//! anyone running claimd).

use crate::store::{StoreError, redact_url};
use sqlx::migrate::MigrateError;

/// One line: what failed, the database's message, and what to do when the error says.
/// `url` is the configured store URL (shown with its password redacted).
pub fn describe(e: &StoreError, url: &str) -> String {
    let store = redact_url(url);
    match e {
        StoreError::Unavailable(source) => {
            let (words, hint) = driver(source);
            format!(
                "the store {store} cannot be reached: {words}; {}",
                hint.unwrap_or(
                    "check that the database is running and that [store] url names it, then retry"
                )
            )
        }
        StoreError::Query { query, source } => {
            let (words, hint) = driver(source);
            // PostgreSQL connects at the first statement: a refused connection is no query's.
            let line = if opening(source) {
                format!("the store {store} cannot be opened: {words}")
            } else {
                format!("the store {store} refused {query}: {words}")
            };
            with_hint(line, hint)
        }
        StoreError::Migrate(m) => migrate(m, &store),
        other => other.to_string(),
    }
}

fn with_hint(line: String, hint: Option<&str>) -> String {
    match hint {
        Some(h) => format!("{line}; {h}"),
        None => line,
    }
}

fn migrate(m: &MigrateError, store: &str) -> String {
    match m {
        MigrateError::Execute(source) | MigrateError::ExecuteMigration(source, _) => {
            let (words, hint) = driver(source);
            with_hint(
                format!("the store {store} could not be migrated: {words}"),
                hint,
            )
        }
        MigrateError::VersionMissing(v) | MigrateError::VersionTooNew(v, _) => format!(
            "the store {store} was migrated by a newer claimd (migration {v} is unknown to this \
             one): run the claimd version that migrated it, or restore a backup made for this one"
        ),
        other => format!(
            "the store {store} could not be migrated: {other}; it holds migrations this claimd \
             did not write: check that [store] url names claimd's own database"
        ),
    }
}

/// Whether the database refused the connection itself (no such database, bad password, no
/// free connection), rather than a statement.
fn opening(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if db.code().is_some_and(|c| matches!(&*c, "3D000" | "28P01" | "28000" | "53300")))
}

/// The driver's error in the database's words, and what to do about the known cases.
fn driver(e: &sqlx::Error) -> (String, Option<&'static str>) {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let hint = match code.as_str() {
                "3D000" => Some(
                    "create that database (createdb NAME), or fix the database name in [store] url",
                ),
                "28P01" | "28000" => Some("check the user and password in [store] url"),
                "42501" => Some("grant the store's user rights on claimd's tables"),
                "53300" => Some(
                    "the server has no free connection: lower [store] max_connections, or retry",
                ),
                // SQLite: cannot open, read-only, disk full.
                "14" => Some("check that the file's directory exists and claimd may write there"),
                "8" => Some("the file or its directory is read-only: claimd needs to write there"),
                "13" => Some("the disk is full: free space"),
                "26" => Some("the file is not a SQLite database: check [store] url"),
                _ => None,
            };
            let words = if code.is_empty() {
                db.message().to_string()
            } else {
                format!("{} (code {code})", db.message())
            };
            (words, hint)
        }
        sqlx::Error::PoolTimedOut => (
            "no connection within the time allowed".into(),
            Some("check that the database is running and reachable, then retry"),
        ),
        other => (other.to_string(), None),
    }
}
