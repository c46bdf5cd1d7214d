//! Database effects: work that runs in the transaction that settles its claim, so the
//! business write, the settle (fenced on the attempt) and its outcome event commit together
//! or not at all. A crash before the commit leaves the claim `started` with nothing applied;
//! a takeover may simply run it again.

use crate::domain::claim::Claim;
use crate::store::error::connection_lost;
use async_trait::async_trait;

/// The open transaction a [`DatabaseEffect`] writes in: a connection of the store's own
/// database, inside `BEGIN`. Do not commit or roll it back: claimd does, after the settle.
#[derive(Debug)]
#[non_exhaustive]
pub enum DbTx<'a> {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(&'a mut sqlx::PgConnection),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(&'a mut sqlx::SqliteConnection),
}

/// An effect that is a write to the database claimd's store lives in (credit an account,
/// create an invoice). [`apply`](DatabaseEffect::apply) runs inside the transaction that
/// then settles the claim `completed`; no idempotency key and no lookup are needed, because
/// the write commits if and only if the claim settles.
///
/// Return the driver's error as it is: deadlocks, serialization failures, a lost connection
/// and a busy SQLite database are retried by running the whole transaction again; any other
/// database error rolls back and fails the claim with its message (nothing was applied), as
/// does [`sqlx::Error::InvalidArgument`] (the claim cannot be applied as it is: say why).
#[async_trait]
pub trait DatabaseEffect: Send + Sync {
    /// Checks a payload before it is claimed (intake refuses it with this sentence, and
    /// nothing is committed). Default: any payload.
    fn validate(&self, _payload: &[u8]) -> Result<(), String> {
        Ok(())
    }

    /// Makes the write for `claim` in `tx`.
    async fn apply(&self, tx: DbTx<'_>, claim: &Claim) -> Result<(), sqlx::Error>;
}

/// Why a database effect's transaction did not commit. Nothing of it was applied.
#[derive(Debug, thiserror::Error)]
pub enum DbEffectError {
    /// The effect's own statements failed (rolled back).
    #[error("{}", crate::store::driver_words(.0))]
    Effect(sqlx::Error),
    /// The transaction ran past the effect's timeout and was cut (rolled back).
    #[error(
        "the transaction ran past effect.timeout ({}) and was rolled back",
        crate::domain::duration::Dur(*.0)
    )]
    TimedOut(std::time::Duration),
    /// The store failed around them: begin, the settle, the commit (rolled back, or the
    /// commit's answer was lost: the claim is then settled or still `started`, never half).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// What to do after a database effect's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbRetry {
    /// Run the whole transaction again (deadlock, serialization failure, busy or locked
    /// database, a lost connection, a server shutting down, read-only or recovering).
    Again,
    /// The database refused the write for good (a constraint, bad data, a syntax error).
    Never,
}

/// Classifies a database effect's error: PostgreSQL's `40P01` (deadlock) and `40001`
/// (serialization failure), SQLite's `SQLITE_BUSY` and `SQLITE_LOCKED` (codes 5 and 6,
/// with their extended codes), and whatever ends a transaction rather than answers it (I13:
/// class `08` connection errors, `57P01` administrator shutdown — every connection gets it
/// on a fast restart or failover —, `57P02` crash shutdown, `57P03` cannot connect now,
/// `53300` too many connections, `25006` a read-only server, `57014` a statement cancelled,
/// as `effect.timeout` does) are worth running again, as is any error that is not the
/// database's answer (I/O, a pool timeout).
pub fn retry_of(e: &sqlx::Error) -> DbRetry {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            let transient = matches!(code.as_ref(), "40P01" | "40001" | "57014")
                || connection_lost(e)
                || code.parse::<i64>().is_ok_and(|c| matches!(c & 0xff, 5 | 6));
            if transient {
                DbRetry::Again
            } else {
                DbRetry::Never
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => DbRetry::Again,
        _ => DbRetry::Never,
    }
}

/// Whether a database effect's run failed for want of a working connection — none free in
/// the pool, none reachable, the server gone, shutting down or read-only — rather than by
/// anything its statements did. Such runs decided nothing about the claim (I13): an attempt
/// that ends on one is a wait, not counted towards `max_attempts`.
pub fn lost_connection(e: &DbEffectError) -> bool {
    use crate::store::StoreError;
    match e {
        DbEffectError::Effect(e)
        | DbEffectError::Store(StoreError::Unavailable(e) | StoreError::Query { source: e, .. }) => {
            connection_lost(e)
        }
        _ => false,
    }
}

/// Whether a store error met around a database effect is worth running the transaction
/// again: a deadlock or serialization failure of the settle itself, or the store being
/// unreachable.
pub fn store_retry_of(e: &crate::store::StoreError) -> DbRetry {
    use crate::store::StoreError;
    match e {
        StoreError::Unavailable(_)
        | StoreError::NoPrimary(_)
        | StoreError::Contended(_)
        | StoreError::Busy(_) => DbRetry::Again,
        StoreError::Query { source, .. } => retry_of(source),
        _ => DbRetry::Never,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_database_errors_are_run_again() {
        assert_eq!(retry_of(&sqlx::Error::PoolTimedOut), DbRetry::Again);
        assert_eq!(
            retry_of(&sqlx::Error::RowNotFound),
            DbRetry::Never,
            "a bug in the effect is not retried"
        );
        assert_eq!(
            retry_of(&sqlx::Error::InvalidArgument("no field".into())),
            DbRetry::Never,
            "a claim that cannot be applied as it is fails"
        );
    }

    #[test]
    fn a_run_without_a_working_connection_decided_nothing() {
        let pool = DbEffectError::Store(crate::store::StoreError::Unavailable(
            sqlx::Error::PoolTimedOut,
        ));
        assert!(lost_connection(&pool));
        let io = DbEffectError::Effect(sqlx::Error::Io(std::io::Error::other("reset")));
        assert!(lost_connection(&io));
        assert!(!lost_connection(&DbEffectError::TimedOut(
            std::time::Duration::from_secs(1)
        )));
        assert!(!lost_connection(&DbEffectError::Effect(
            sqlx::Error::RowNotFound
        )));
    }
}
