//! The archive of finished claims (`[retention] archive_after`, migration 0027): a batch of
//! finished claims older than `archive_after` leaves `claims` in one statement and lands in
//! `claims_archive` with its history, partitioned by the UTC month its retention ends; a claim
//! whose window is already over is only deleted. Retention then drops whole months
//! ([`drop_months`]) instead of deleting rows. The partitions a batch needs are created first,
//! through `claimd.claims_archive_months` (the runtime role has no `CREATE`).

use crate::store::args::ms;
use crate::store::dialect::SqlPool;
use crate::store::{ArchiveBatch, RetentionWindows, StoreError, StoreResult};
use sqlx::{Postgres, Row};

/// The finished claims the archive takes (`$1`: archive_after ms), written once for every
/// statement here: a parent waits while a child of it is open, as for deletion.
macro_rules! archivable {
    () => {
        "state IN ('completed', 'failed') \
         AND updated_utc < now() - $1 * interval '1 millisecond' \
         AND NOT EXISTS (SELECT 1 FROM claims k WHERE k.parent_id = claims.id \
           AND k.state NOT IN ('completed', 'failed'))"
    };
}

/// When a claim's retention ends: its last change plus its state's window (`$2` completed,
/// `$3` failed, ms).
macro_rules! retain_until {
    ($row:literal) => {
        concat!(
            $row,
            ".updated_utc + CASE WHEN ",
            $row,
            ".state = 'completed' THEN $2 ELSE $3 END * interval '1 millisecond'"
        )
    };
}

/// The UTC days the next batch's claims will be kept until (`$4`: how many claims to look at),
/// for the partitions of their months to exist before the move.
const DAYS: &str = concat!(
    "SELECT DISTINCT pg_catalog.to_char((",
    retain_until!("b"),
    ") AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day \
     FROM (SELECT updated_utc, state FROM claims WHERE ",
    archivable!(),
    " ORDER BY updated_utc LIMIT $4) b WHERE ",
    retain_until!("b"),
    " > now()"
);

/// Creates the partitions of the months of the given days (`$1`, `YYYY-MM-DD` texts).
const MAKE_MONTHS: &str = "SELECT claimd.claims_archive_months($1::text[]::date[]) AS made";

/// One batch: chosen once and locked (skipping rows an operator holds), deleted with the
/// predicate checked again (I7: a row changed meanwhile must still be finished and old), and
/// the rows whose window is not over inserted into the archive with their history lines (read
/// from the statement's snapshot: the cascade of the delete runs at its end).
const MOVE: &str = concat!(
    "WITH batch AS MATERIALIZED (SELECT id AS batch_id FROM claims WHERE ",
    archivable!(),
    " ORDER BY updated_utc LIMIT $4 FOR UPDATE SKIP LOCKED), \
     moved AS (DELETE FROM claims USING batch WHERE id = batch_id AND ",
    archivable!(),
    " RETURNING claims.*), \
     kept AS (INSERT INTO claims_archive SELECT ",
    retain_until!("m"),
    ", now(), COALESCE((SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(e) ORDER BY e.id) \
       FROM claim_events e WHERE e.claim_id = m.id), '[]'::jsonb), m.* \
     FROM moved m WHERE ",
    retain_until!("m"),
    " > now() RETURNING state) \
     SELECT (SELECT COUNT(*) FROM kept) AS archived, \
       (SELECT COUNT(*) FROM moved WHERE state = 'completed') \
         - (SELECT COUNT(*) FROM kept WHERE state = 'completed') AS deleted_completed, \
       (SELECT COUNT(*) FROM moved WHERE state = 'failed') \
         - (SELECT COUNT(*) FROM kept WHERE state = 'failed') AS deleted_failed"
);

/// What a run would move (a dry run), all batches at once.
const COUNT: &str = concat!(
    "SELECT COUNT(*) FILTER (WHERE ",
    retain_until!("claims"),
    " > now()) AS archived, \
       COUNT(*) FILTER (WHERE state = 'completed' AND ",
    retain_until!("claims"),
    " <= now()) AS deleted_completed, \
       COUNT(*) FILTER (WHERE state = 'failed' AND ",
    retain_until!("claims"),
    " <= now()) AS deleted_failed \
     FROM claims WHERE ",
    archivable!()
);

/// Drops the months whose retention is over.
const DROP_MONTHS: &str = "SELECT claimd.drop_claims_archive_months() AS dropped";

/// Whether the archive has a partition (a catalog read any role may make): a store that never
/// archived does not call the function, nor need the grant to run it.
const HAS_DAYS: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits \
    WHERE inhparent = pg_catalog.to_regclass('claims_archive')) AS any";

/// SQLSTATE of an insert no partition takes.
const NO_PARTITION: &str = "23514";

/// Moves one batch (or counts everything, on a dry run). A batch whose rows changed between
/// the look at their days and the move (a month without its partition) is tried up to twice more.
pub(super) async fn batch(
    pool: &SqlPool<Postgres>,
    w: &RetentionWindows,
    after: std::time::Duration,
    size: u32,
    dry_run: bool,
) -> StoreResult<ArchiveBatch> {
    let (after, completed, failed) = (ms(after), ms(w.completed), ms(w.failed));
    if dry_run {
        let q = sqlx::query(COUNT).bind(after).bind(completed).bind(failed);
        let row = pool.all(q).await.map_err(err("archive_count"))?;
        return row
            .first()
            .map(counts)
            .transpose()
            .map(Option::unwrap_or_default);
    }
    let mut tries = 0;
    loop {
        tries += 1;
        // Twice the batch: the move may skip rows an operator holds and take later ones.
        let q = sqlx::query(DAYS)
            .bind(after)
            .bind(completed)
            .bind(failed)
            .bind(i64::from(size) * 2);
        let days: Vec<String> = pool
            .all(q)
            .await
            .map_err(err("archive_days"))?
            .iter()
            .map(|r| r.try_get("day"))
            .collect::<Result<_, _>>()
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        // The function takes at most 400 days a call.
        for some in days.chunks(400) {
            let q = sqlx::query(MAKE_MONTHS).bind(some);
            pool.all(q).await.map_err(err("claims_archive_months"))?;
        }
        let q = sqlx::query(MOVE)
            .bind(after)
            .bind(completed)
            .bind(failed)
            .bind(i64::from(size));
        match pool.all(q).await {
            Ok(rows) => {
                return rows
                    .first()
                    .map(counts)
                    .transpose()
                    .map(Option::unwrap_or_default);
            }
            Err(sqlx::Error::Database(db))
                if tries < 3 && db.code().is_some_and(|c| c == NO_PARTITION) => {}
            Err(e) => return Err(StoreError::from_sqlx("archive_move", e)),
        }
    }
}

/// Drops the archive's months whose retention is over; how many.
pub(super) async fn drop_months(pool: &SqlPool<Postgres>) -> StoreResult<u64> {
    let any = pool
        .all(sqlx::query(HAS_DAYS))
        .await
        .map_err(err("archive_has_days"))?
        .first()
        .map(|r| r.try_get::<bool, _>("any"))
        .transpose()
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    if any != Some(true) {
        return Ok(0);
    }
    let rows = pool
        .all(sqlx::query(DROP_MONTHS))
        .await
        .map_err(err("drop_claims_archive_months"))?;
    let n: Option<i32> = rows
        .first()
        .map(|r| r.try_get("dropped"))
        .transpose()
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(n.unwrap_or(0).max(0) as u64)
}

fn counts(row: &sqlx::postgres::PgRow) -> StoreResult<ArchiveBatch> {
    let n = |col: &str| {
        row.try_get::<i64, _>(col)
            .map(|v| v.max(0) as u64)
            .map_err(|e| StoreError::Corrupt(e.to_string()))
    };
    Ok(ArchiveBatch {
        archived: n("archived")?,
        deleted_completed: n("deleted_completed")?,
        deleted_failed: n("deleted_failed")?,
    })
}

fn err(query: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::from_sqlx(query, e)
}
