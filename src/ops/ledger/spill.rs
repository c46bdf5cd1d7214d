//! The spill file: compact provider objects written to a temporary SQLite file and read back
//! in key order (providers list in creation order; the merge needs key order).

use super::LedgerError;
use super::matching::{LedgerObject, ObjectVerdict};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};
use std::path::PathBuf;

/// Compact provider objects on disk, read back in key order.
#[derive(Debug)]
pub struct Spill {
    pool: SqlitePool,
    path: PathBuf,
}

impl Drop for Spill {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Spill {
    /// A new, empty spill file in the system's temporary directory.
    pub async fn create() -> Result<Spill, LedgerError> {
        let path = std::env::temp_dir().join(format!(
            "claimd-ledger-{}-{:016x}.db",
            std::process::id(),
            fastrand::u64(..)
        ));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            // A scratch file: nothing to recover after a crash.
            .journal_mode(SqliteJournalMode::Off)
            .synchronous(SqliteSynchronous::Off);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            // No idle reaper: sqlx's maintenance task can spin at 100% CPU and stall the runtime
            // (a num_idle underflow, launchbadge/sqlx #3645); connections live until they fail.
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await
            .map_err(|e| LedgerError::Spill(e.to_string()))?;
        let spill = Spill { pool, path };
        sqlx::query(
            "CREATE TABLE objects (key TEXT NOT NULL, created INTEGER NOT NULL, id TEXT NOT NULL, \
             amount INTEGER, currency TEXT, status TEXT, verdict TEXT NOT NULL, refunded INTEGER)",
        )
        .execute(&spill.pool)
        .await
        .map_err(|e| LedgerError::Spill(e.to_string()))?;
        Ok(spill)
    }

    /// Writes one page's objects in one transaction.
    pub async fn insert(&self, objects: &[LedgerObject]) -> Result<(), LedgerError> {
        let fail = |e: sqlx::Error| LedgerError::Spill(e.to_string());
        let mut tx = self.pool.begin().await.map_err(fail)?;
        for o in objects {
            sqlx::query("INSERT INTO objects VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")
                .bind(&o.key)
                .bind(o.created)
                .bind(&o.id)
                .bind(o.amount)
                .bind(&o.currency)
                .bind(&o.status)
                .bind(o.verdict.code())
                .bind(o.refunded)
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
        }
        tx.commit().await.map_err(fail)
    }

    /// Indexes the file for reading in key order (once, after the last insert).
    pub async fn seal(&self) -> Result<(), LedgerError> {
        sqlx::query("CREATE INDEX objects_key ON objects (key, created, id)")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(|e| LedgerError::Spill(e.to_string()))
    }

    /// The next `limit` objects in key order (byte order, then creation, then id) after
    /// `after` (none: from the start).
    pub async fn page(
        &self,
        after: Option<&LedgerObject>,
        limit: u32,
    ) -> Result<Vec<LedgerObject>, LedgerError> {
        let (key, created, id) = match after {
            Some(o) => (o.key.as_str(), o.created, o.id.as_str()),
            None => ("", i64::MIN, ""),
        };
        let rows = sqlx::query(
            "SELECT key, created, id, amount, currency, status, verdict, refunded FROM objects \
             WHERE (key, created, id) > (?1, ?2, ?3) ORDER BY key, created, id LIMIT ?4",
        )
        .bind(key)
        .bind(created)
        .bind(id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| LedgerError::Spill(e.to_string()))?;
        rows.iter()
            .map(|r| {
                let verdict: String = r.try_get("verdict")?;
                Ok(LedgerObject {
                    key: r.try_get("key")?,
                    created: r.try_get("created")?,
                    id: r.try_get("id")?,
                    amount: r.try_get("amount")?,
                    currency: r.try_get("currency")?,
                    status: r.try_get("status")?,
                    verdict: ObjectVerdict::from_code(&verdict),
                    refunded: r.try_get("refunded")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| LedgerError::Spill(e.to_string()))
    }
}
