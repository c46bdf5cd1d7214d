//! PostgreSQL's multi-row writes, used by the group commit of the `batch` module: many claims
//! in one `INSERT … SELECT … FROM unnest(…)` ([`INSERT_CLAIMS`]) and many fenced settles with
//! their history lines in one statement ([`SETTLE_MANY`], or [`SETTLE_MANY_PLAIN`] when none
//! writes an outcome event). A conflicting claim is left to the
//! one-row path, which counts the repeat.

use crate::domain::claim::{Claim, ClaimState, Handoff, NewClaim};
use crate::store::args::{created as created_outcome, ms};
use crate::store::dialect::SqlPool;
use crate::store::outbox::{OutcomeConsumers, emits};
use crate::store::rows::claim_from_row;
use crate::store::sealing;
use crate::store::{ClaimOutcome, SettleItem, StoreError, StoreResult};
use sqlx::{Postgres, Row};
use std::collections::HashMap;

/// Many claims in one statement (committed together, before any effect: I1). Rows that
/// conflict are skipped here and looked at one by one afterwards.
pub(super) const INSERT_CLAIMS: &str = concat!(
    "INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, \
     content_type, lease_owner, lease_until, claim_token, handoff, handoff_attempt, \
     order_key, not_before, attempt, trace_parent, priority) \
     SELECT c, t, m, k, f, p, ct, w, \
            COALESCE(nb, CASE WHEN w IS NOT NULL THEN now() + l * interval '1 millisecond' END), \
            NULLIF(tok, ''), CASE WHEN nc THEN 'not_called' END, CASE WHEN nc THEN a END, \
            ok, nb, a, tp, pr \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], \
                 $7::text[], $8::text[], $9::bigint[], $10::text[], $11::bool[], $12::text[], \
                 $13::timestamptz[], $14::int[], $15::text[], $16::int[]) \
       AS u(c, t, m, k, f, p, ct, w, l, tok, nc, ok, nb, a, tp, pr) \
     ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING ",
    claim_cols!()
);

/// The per-row values of a batch of settles, unnested from parameter arrays `$1` to `$15`
/// (the columns of `settle_many_columns!`).
macro_rules! settle_many_arrays {
    () => {
        "$1::bigint[], $2::int[], $3::text[], $4::int[], $5::text[], $6::text[], $7::bool[], \
         $8::text[], $9::bigint[], $10::text[], $11::text[], $12::text[], $13::int[], \
         $14::text[], $15::text[]"
    };
}

/// The names of `settle_many_arrays!`' columns.
macro_rules! settle_many_columns {
    () => {
        "id, attempt, st, pstatus, presp, err, rec, hoff, rel, actor, action, outcome, estatus, \
         detail, pid"
    };
}

/// The fenced update of a batch of settles (the CTE `s`'s body, up to its `RETURNING` list,
/// which goes on): each row `WHERE id = u.id AND attempt = u.attempt AND state = 'started'`
/// (I2), as in the one-row settle, and its version bumped; a claim that completes drops its
/// last error there too.
macro_rules! settle_many_update {
    () => {
        "UPDATE claims c SET \
        state = COALESCE(u.st, c.state), \
        provider_status = COALESCE(u.pstatus, c.provider_status), \
        provider_response = COALESCE(u.presp, c.provider_response), \
        last_error = CASE WHEN u.st = 'completed' THEN NULL ELSE COALESCE(u.err, c.last_error) END, \
        reconciled = c.reconciled OR u.rec, \
        handoff = COALESCE(u.hoff, c.handoff), \
        handoff_attempt = CASE WHEN u.hoff IS NOT NULL THEN c.attempt ELSE c.handoff_attempt END, \
        waits = c.waits + CASE WHEN u.hoff IS NOT NULL THEN 1 ELSE 0 END, \
        processed_utc = CASE WHEN u.st IN ('completed', 'failed') THEN now() \
                             ELSE c.processed_utc END, \
        lease_owner = CASE WHEN u.st IS NULL OR u.st = 'started' THEN c.lease_owner END, \
        lease_until = CASE WHEN u.rel IS NOT NULL THEN now() + u.rel * interval '1 millisecond' \
                           WHEN u.st IS NULL OR u.st = 'started' THEN c.lease_until END, \
        provider_id = COALESCE(u.pid, c.provider_id), \
        pending_utc = CASE WHEN u.st = 'pending' THEN COALESCE(c.pending_utc, now()) \
                           ELSE c.pending_utc END, \
        version = c.version + 1, \
        updated_utc = now() \
      FROM u WHERE c.id = u.id AND c.attempt = u.attempt AND c.state = 'started' \
      RETURNING c.id, u.attempt, u.actor, u.action, u.outcome, u.estatus, u.detail"
    };
}

/// The CTE `e` that writes the history line of each row of `s`.
macro_rules! settle_many_events {
    () => {
        "e AS ( \
      INSERT INTO claim_events (claim_id, attempt, actor, action, outcome, provider_status, \
                                detail) \
      SELECT id, attempt, actor, action, outcome, estatus, detail FROM s)"
    };
}

/// Many fenced settles and their history lines in one statement, each as the one-row settle
/// (`settle_many_update!`). Each row's outcome event is written by the same statement when
/// its `outcomes` list (JSON, `$16`, per row: `[]` unless the settle ends or pauses the claim)
/// names its consumer.
pub(super) const SETTLE_MANY: &str = concat!(
    "WITH u AS (SELECT * FROM unnest(",
    settle_many_arrays!(),
    ", $16::text[]) AS u(",
    settle_many_columns!(),
    ", outcomes)), s AS (",
    settle_many_update!(),
    ", u.outcomes, c.consumer, c.tenant, c.message_id, c.idem_key, c.state, \
     c.provider_status, c.provider_id, c.provider_response, c.last_error, c.version), ",
    settle_many_events!(),
    ", ",
    outbox_insert!(
        "COALESCE(detail, last_error)",
        "actor",
        "action",
        "s",
        "outcomes"
    ),
    " SELECT id FROM s"
);

/// [`SETTLE_MANY`] without the outbox's CTE (no `$16`), for a batch none of whose settles
/// writes an outcome event.
pub(super) const SETTLE_MANY_PLAIN: &str = concat!(
    "WITH u AS (SELECT * FROM unnest(",
    settle_many_arrays!(),
    ") AS u(",
    settle_many_columns!(),
    ")), s AS (",
    settle_many_update!(),
    "), ",
    settle_many_events!(),
    " SELECT id FROM s"
);

/// Inserts many claims in one statement: per item its new claim, or `None` when the key was
/// already claimed (before, or earlier in this batch). An inserted row belongs to the caller
/// whose claim token it carries: of two callers with one key in the batch, only the one whose
/// row went in is answered with it (the other is left to the one-row path, a repeat), as in
/// SQLite's group commit.
pub(super) async fn insert_batch(
    pool: &SqlPool<Postgres>,
    new: &[&NewClaim],
) -> StoreResult<Vec<Option<ClaimOutcome>>> {
    let col = |f: fn(&NewClaim) -> &str| new.iter().map(|n| f(n)).collect::<Vec<&str>>();
    let query = sqlx::query(INSERT_CLAIMS)
        .bind(col(|n| &n.consumer))
        .bind(col(|n| &n.tenant))
        .bind(col(|n| &n.message_id))
        .bind(col(|n| &n.idem_key))
        .bind(col(|n| &n.fingerprint))
        .bind(
            new.iter()
                .map(|n| sealing::seal_bytes(&n.payload).into_owned())
                .collect::<Vec<Vec<u8>>>(),
        )
        .bind(col(|n| &n.content_type))
        .bind(
            new.iter()
                .map(|n| n.lease_owner())
                .collect::<Vec<Option<&str>>>(),
        )
        .bind(new.iter().map(|n| ms(n.lease)).collect::<Vec<i64>>())
        .bind(col(|n| &n.claim_token))
        .bind(new.iter().map(|n| n.not_called()).collect::<Vec<bool>>())
        .bind(
            new.iter()
                .map(|n| n.order_key.as_deref())
                .collect::<Vec<Option<&str>>>(),
        )
        .bind(new.iter().map(|n| n.not_before).collect::<Vec<_>>())
        .bind(new.iter().map(|n| n.first_attempt()).collect::<Vec<i32>>())
        .bind(
            new.iter()
                .map(|n| n.trace_parent.as_deref())
                .collect::<Vec<Option<&str>>>(),
        )
        .bind(
            new.iter()
                .map(|n| i32::from(n.priority))
                .collect::<Vec<i32>>(),
        );
    let rows = pool.all(query).await.map_err(err("insert_claims"))?;
    let mut created: HashMap<(String, String, String), Claim> = rows
        .iter()
        .map(|r| {
            claim_from_row(r).map(|c| {
                (
                    (c.consumer.clone(), c.tenant.clone(), c.message_id.clone()),
                    c,
                )
            })
        })
        .collect::<StoreResult<_>>()?;
    Ok(new
        .iter()
        .map(|n| {
            let key = (n.consumer.clone(), n.tenant.clone(), n.message_id.clone());
            let mine = created
                .get(&key)
                .is_some_and(|c| n.claim_token.is_empty() || n.inserted(c));
            mine.then(|| created.remove(&key))
                .flatten()
                .map(|c| created_outcome(n, c))
        })
        .collect())
}

/// One statement for many fenced settles (ids distinct).
/// `mark_called` for many claims: the one-row statement's fenced update, joined on the
/// claims' ids and attempts; the ids of the claims it changed.
pub(super) const MARK_CALLED_MANY: &str = "\
    UPDATE claims c SET \
      handoff = CASE WHEN c.handoff = 'not_called' THEN NULL ELSE c.handoff END, \
      handoff_attempt = CASE WHEN c.handoff = 'not_called' THEN NULL ELSE c.handoff_attempt END \
    FROM unnest($1::bigint[], $2::int[]) AS u(id, attempt) \
    WHERE c.id = u.id AND c.attempt = u.attempt AND c.state = 'started' \
    RETURNING c.id";

/// Clears the "not called yet" markers of `marks` (distinct ids) in one statement.
pub(super) async fn mark_called_batch(
    pool: &SqlPool<Postgres>,
    marks: &[(i64, i32)],
) -> StoreResult<Vec<bool>> {
    let query = sqlx::query(MARK_CALLED_MANY)
        .bind(marks.iter().map(|m| m.0).collect::<Vec<_>>())
        .bind(marks.iter().map(|m| m.1).collect::<Vec<_>>());
    let changed = ids(pool.all(query).await, "mark_called_many")?;
    Ok(marks.iter().map(|m| changed.contains(&m.0)).collect())
}

pub(super) async fn settle_batch(
    pool: &SqlPool<Postgres>,
    items: &[SettleItem<'_>],
    outcomes: &OutcomeConsumers,
) -> StoreResult<Vec<bool>> {
    let state = |i: &SettleItem<'_>| i.settlement.state.map(|st| st.as_str());
    let writes: Vec<Option<&str>> = items
        .iter()
        .map(|i| outcomes.writes(emits(ClaimState::Started, i.settlement.state)))
        .collect();
    // A batch that writes no outcome event skips the outbox's CTE altogether.
    let plain = writes.iter().all(Option::is_none);
    let sql = if plain {
        SETTLE_MANY_PLAIN
    } else {
        SETTLE_MANY
    };
    let query = sqlx::query(sql)
        .bind(items.iter().map(|i| i.id).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.attempt).collect::<Vec<_>>())
        .bind(items.iter().map(state).collect::<Vec<_>>())
        .bind(
            items
                .iter()
                .map(|i| i.settlement.provider_status)
                .collect::<Vec<_>>(),
        )
        .bind(
            items
                .iter()
                .map(|i| sealed_text(i.settlement.provider_response.as_deref()))
                .collect::<Vec<_>>(),
        )
        .bind(
            items
                .iter()
                .map(|i| sealed_text(i.settlement.error.as_deref()))
                .collect::<Vec<_>>(),
        )
        .bind(
            items
                .iter()
                .map(|i| i.settlement.reconciled)
                .collect::<Vec<_>>(),
        )
        .bind(
            items
                .iter()
                .map(|i| i.settlement.handoff.map(Handoff::as_str))
                .collect::<Vec<_>>(),
        )
        .bind(
            items
                .iter()
                .map(|i| i.settlement.lease_for.map(ms))
                .collect::<Vec<_>>(),
        )
        .bind(items.iter().map(|i| i.event.actor).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.event.action).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.event.outcome).collect::<Vec<_>>())
        .bind(
            items
                .iter()
                .map(|i| i.event.provider_status)
                .collect::<Vec<_>>(),
        )
        .bind(
            items
                .iter()
                .map(|i| sealed_text(i.event.detail))
                .collect::<Vec<_>>(),
        )
        .bind(
            items
                .iter()
                .map(|i| i.settlement.provider_id.as_deref())
                .collect::<Vec<_>>(),
        );
    let query = if plain {
        query
    } else {
        query.bind(writes.iter().map(|w| w.unwrap_or("[]")).collect::<Vec<_>>())
    };
    let done = ids(pool.all(query).await, "settle_many")?;
    Ok(items.iter().map(|i| done.contains(&i.id)).collect())
}

/// The ids (first column) of the rows a statement returned.
fn ids(
    rows: Result<Vec<sqlx::postgres::PgRow>, sqlx::Error>,
    query: &'static str,
) -> StoreResult<std::collections::HashSet<i64>> {
    rows.and_then(|rows| rows.iter().map(|r| r.try_get::<i64, _>(0)).collect())
        .map_err(err(query))
}

fn err(query: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::from_sqlx(query, e)
}

/// A text column's value as stored (sealed when encryption is on).
fn sealed_text(plain: Option<&str>) -> Option<String> {
    sealing::seal_text(plain).map(std::borrow::Cow::into_owned)
}
