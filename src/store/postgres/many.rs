//! PostgreSQL's multi-row writes, used by the group commit of the `batch` module: many claims
//! in one `INSERT … SELECT … FROM unnest(…)` ([`INSERT_CLAIMS`]) and many fenced settles with
//! their history lines in one statement ([`SETTLE_MANY`], or [`SETTLE_MANY_PLAIN`] when none
//! writes an outcome event). The repeat of a key already claimed is counted by the claims'
//! statement too; what it cannot answer is left to the one-row path.

use crate::domain::claim::{Claim, ClaimState, Handoff, NewClaim};
use crate::store::args::{created as created_outcome, ms, repeat_outcome};
use crate::store::dialect::ClaimsAndSettles;
use crate::store::dialect::SqlPool;
use crate::store::outbox::{OutcomeConsumers, emits};
use crate::store::rows::claim_from_row;
use crate::store::sealing;
use crate::store::{ClaimOutcome, SettleItem, StoreError, StoreResult};
use sqlx::{Postgres, Row};
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

/// The CTEs of [`INSERT_CLAIMS`] (`cu`, the calls; `ins`; `rep`), parameters `$1` to `$17`.
macro_rules! insert_claims_ctes {
    () => {
        concat!(
            "cu AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], \
                 $5::text[], $6::bytea[], $7::text[], $8::text[], $9::bigint[], $10::text[], \
                 $11::bool[], $12::text[], $13::timestamptz[], $14::int[], $15::text[], \
                 $16::int[], $17::bool[]) \
             AS cu(c, t, m, k, f, p, ct, w, l, tok, nc, ok, nb, a, tp, pr, r)), \
             ins AS (INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, \
             payload, content_type, lease_owner, lease_until, claim_token, handoff, \
             handoff_attempt, order_key, not_before, attempt, trace_parent, priority) \
             SELECT c, t, m, k, f, p, ct, w, \
                COALESCE(nb, CASE WHEN w IS NOT NULL \
                                  THEN now() + l * interval '1 millisecond' END), \
                NULLIF(tok, ''), CASE WHEN nc THEN 'not_called' END, CASE WHEN nc THEN a END, \
                ok, nb, a, tp, pr \
             FROM cu \
             ON CONFLICT (consumer, tenant, message_id) DO NOTHING RETURNING ",
            claim_cols!(),
            "), rep AS (UPDATE claims SET \
               duplicate_count = duplicate_count + \
                 CASE WHEN claim_token = NULLIF(cu.tok, '') THEN 0 \
                      WHEN fingerprint = cu.f THEN 1 ELSE 0 END, \
               mismatch_count = mismatch_count + \
                 CASE WHEN claim_token = NULLIF(cu.tok, '') THEN 0 \
                      WHEN fingerprint = cu.f THEN 0 ELSE 1 END \
             FROM cu WHERE cu.r AND consumer = cu.c AND tenant = cu.t AND message_id = cu.m \
               AND state <> 'started' RETURNING ",
            claim_cols!(),
            ")"
        )
    };
}

/// The rows of `insert_claims_ctes!`: each claim inserted or counted as a repeat, and which.
macro_rules! claim_rows {
    () => {
        "SELECT true AS fresh, * FROM ins UNION ALL SELECT false, * FROM rep"
    };
}

/// Many claims in one statement (committed together, before any effect: I1), and the repeat
/// of each key that was already claimed counted in the same statement (`rep`, as the one-row
/// `count_repeat`), so a duplicate delivery costs no transaction of its own. `$17` marks the
/// first call of each key in the batch: only it is counted here (one `UPDATE … FROM` changes
/// a row once). A claim still `started` is left out of `rep`: a batch of settles may hold its
/// lock, and two multi-row statements locking the same rows in turn could deadlock. Rows that
/// neither statement answers (a later call of a key in the batch, a key claimed by a
/// transaction this statement's snapshot does not see, a claim still `started`) are left to
/// the one-row path. Each row returned says whether it was inserted (`fresh`).
pub(super) const INSERT_CLAIMS: &str = concat!("WITH ", insert_claims_ctes!(), " ", claim_rows!());

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
        concat!(
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
      FROM u WHERE c.id = u.id AND c.attempt = u.attempt AND ",
            pg_still_started!(),
            " RETURNING c.id, u.attempt, u.actor, u.action, u.outcome, u.estatus, u.detail"
        )
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

/// Inserts many claims in one statement: per item its new claim, its repeat (counted by the
/// same statement) or `None` when it is left to the one-row path (see [`INSERT_CLAIMS`]).
pub(super) async fn insert_batch(
    pool: &SqlPool<Postgres>,
    new: &[&NewClaim],
) -> StoreResult<Vec<Option<ClaimOutcome>>> {
    let first = first_of_keys(new);
    let query = bind_claims(sqlx::query(INSERT_CLAIMS), new, first.clone());
    let rows = pool.all(query).await.map_err(err("insert_claims"))?;
    claims_from_rows(new, &first, &rows)
}

/// A statement's arguments as bound so far.
type PgQuery<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

/// Which calls of `new` are the first of their key in the batch: the ones whose repeat
/// [`INSERT_CLAIMS`] counts.
fn first_of_keys(new: &[&NewClaim]) -> Vec<bool> {
    let mut seen = HashSet::new();
    new.iter()
        .map(|n| seen.insert((&n.consumer, &n.tenant, &n.message_id)))
        .collect()
}

/// Binds the claims' arrays (`insert_claims_ctes!`' seventeen parameters).
fn bind_claims<'q>(query: PgQuery<'q>, new: &'q [&'q NewClaim], first: Vec<bool>) -> PgQuery<'q> {
    let col = |f: fn(&'q NewClaim) -> &'q str| new.iter().map(|n| f(n)).collect::<Vec<&str>>();
    query
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
        )
        .bind(first)
}

/// Per call of `new`, its outcome from the claim rows (`claim_rows!`) the statement returned.
/// An inserted row belongs to the caller whose claim token it carries: of two callers with
/// one key in the batch, only the one whose row went in is answered with it (the other is left
/// to the one-row path, a repeat), as in SQLite's group commit. A counted repeat answers the
/// key's first call.
fn claims_from_rows<'r>(
    new: &[&NewClaim],
    first: &[bool],
    rows: impl IntoIterator<Item = &'r sqlx::postgres::PgRow>,
) -> StoreResult<Vec<Option<ClaimOutcome>>> {
    let mut created: HashMap<Key, Claim> = HashMap::new();
    let mut repeated: HashMap<Key, Claim> = HashMap::new();
    for r in rows {
        let fresh: bool = r.try_get("fresh").map_err(err("insert_claims"))?;
        let c = claim_from_row(r)?;
        let key = (c.consumer.clone(), c.tenant.clone(), c.message_id.clone());
        if fresh { &mut created } else { &mut repeated }.insert(key, c);
    }
    Ok(new
        .iter()
        .zip(first)
        .map(|(n, first)| {
            let key = (n.consumer.clone(), n.tenant.clone(), n.message_id.clone());
            let mine = created
                .get(&key)
                .is_some_and(|c| n.claim_token.is_empty() || n.inserted(c));
            if mine {
                return created.remove(&key).map(|c| created_outcome(n, c));
            }
            first
                .then(|| repeated.remove(&key))
                .flatten()
                .map(|c| repeat_outcome(n, c))
        })
        .collect())
}

/// A claim's unique key: consumer, tenant, message id.
type Key = (String, String, String);

/// One statement for many fenced settles (ids distinct).
/// `mark_called` for many claims: the one-row statement's fenced update, joined on the
/// claims' ids and attempts; the ids of the claims it changed.
pub(super) const MARK_CALLED_MANY: &str = concat!(
    "UPDATE claims c SET \
      handoff = CASE WHEN c.handoff = 'not_called' THEN NULL ELSE c.handoff END, \
      handoff_attempt = CASE WHEN c.handoff = 'not_called' THEN NULL ELSE c.handoff_attempt END \
    FROM unnest($1::bigint[], $2::int[]) AS u(id, attempt) \
    WHERE c.id = u.id AND c.attempt = u.attempt AND ",
    pg_still_started!(),
    " RETURNING c.id"
);

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

/// Settles many claims (distinct ids) in one statement: per item whether it still held the
/// claim.
pub(super) async fn settle_batch(
    pool: &SqlPool<Postgres>,
    items: &[SettleItem<'_>],
    outcomes: &OutcomeConsumers,
) -> StoreResult<Vec<bool>> {
    let writes = outcome_writes(items, outcomes);
    // A batch that writes no outcome event skips the outbox's CTE altogether.
    let sql = if writes.is_none() {
        SETTLE_MANY_PLAIN
    } else {
        SETTLE_MANY
    };
    let query = bind_settles(sqlx::query(sql), items, writes);
    let done = ids(pool.all(query).await, "settle_many")?;
    Ok(items.iter().map(|i| done.contains(&i.id)).collect())
}

/// Per settle the consumers its outcome event goes to (`[]`: none), or `None` when no settle
/// of the batch writes one.
fn outcome_writes<'o>(
    items: &[SettleItem<'_>],
    outcomes: &'o OutcomeConsumers,
) -> Option<Vec<&'o str>> {
    let writes: Vec<Option<&str>> = items
        .iter()
        .map(|i| outcomes.writes(emits(ClaimState::Started, i.settlement.state)))
        .collect();
    (!writes.iter().all(Option::is_none))
        .then(|| writes.iter().map(|w| w.unwrap_or("[]")).collect())
}

/// Binds the settles' arrays (`settle_many_arrays!`, then the outcome events' consumers when
/// `writes` has them).
fn bind_settles<'q>(
    query: PgQuery<'q>,
    items: &'q [SettleItem<'q>],
    writes: Option<Vec<&'q str>>,
) -> PgQuery<'q> {
    let state = |i: &SettleItem<'_>| i.settlement.state.map(|st| st.as_str());
    let query = query
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
    match writes {
        Some(writes) => query.bind(writes),
        None => query,
    }
}

/// Claims many and settles many (distinct ids) in one statement, so one commit serves both:
/// the CTEs of [`INSERT_CLAIMS`] and of [`SETTLE_MANY`] (or [`SETTLE_MANY_PLAIN`]), the
/// settles' parameters after the claims'; its rows are the claim rows (`claim_rows!`) and the
/// ids of the claims settled (`settled`), side by side in one result (`FULL JOIN … ON false`).
/// Each part is as fenced and as complete as alone (I2; each settle's history line and outcome
/// event in the same statement); a failure fails both, and nothing is committed.
pub(super) async fn insert_settle_batch(
    pool: &SqlPool<Postgres>,
    new: &[&NewClaim],
    items: &[SettleItem<'_>],
    outcomes: &OutcomeConsumers,
) -> StoreResult<ClaimsAndSettles> {
    static JOINT: LazyLock<String> = LazyLock::new(|| joint_sql(SETTLE_MANY));
    static JOINT_PLAIN: LazyLock<String> = LazyLock::new(|| joint_sql(SETTLE_MANY_PLAIN));
    let first = first_of_keys(new);
    let writes = outcome_writes(items, outcomes);
    let sql: &'static str = if writes.is_none() {
        &JOINT_PLAIN
    } else {
        &JOINT
    };
    let query = bind_settles(
        bind_claims(sqlx::query(sql), new, first.clone()),
        items,
        writes,
    );
    let rows = pool.all(query).await.map_err(err("insert_settle_many"))?;
    let mut settled = HashSet::new();
    let mut claimed = Vec::new();
    for r in &rows {
        match r
            .try_get::<Option<i64>, _>("settled")
            .map_err(err("insert_settle_many"))?
        {
            Some(id) => {
                settled.insert(id);
            }
            None => claimed.push(r),
        }
    }
    Ok((
        claims_from_rows(new, &first, claimed)?,
        items.iter().map(|i| settled.contains(&i.id)).collect(),
    ))
}

/// How many parameters the claims' part of a statement takes (`insert_claims_ctes!`).
const CLAIM_PARAMS: usize = 17;

/// The joint statement of [`insert_settle_batch`] around a settles' statement (`WITH …
/// SELECT id FROM s`).
fn joint_sql(settles: &str) -> String {
    let ctes = settles
        .strip_prefix("WITH ")
        .and_then(|s| s.strip_suffix(" SELECT id FROM s"))
        .expect("a settles' statement is its CTEs and SELECT id FROM s");
    format!(
        "WITH {}, {} SELECT x.*, y.settled FROM ({}) x \
         FULL JOIN (SELECT id AS settled FROM s) y ON false",
        insert_claims_ctes!(),
        shift_params(ctes, CLAIM_PARAMS),
        claim_rows!()
    )
}

/// `sql` with every parameter `$n` numbered `$(n + by)`.
fn shift_params(sql: &str, by: usize) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if let Ok(n) = rest[..digits].parse::<usize>() {
            out.push_str(&(n + by).to_string());
        } else {
            out.push_str(&rest[..digits]);
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

/// The ids (first column) of the rows a statement returned.
fn ids(
    rows: Result<Vec<sqlx::postgres::PgRow>, sqlx::Error>,
    query: &'static str,
) -> StoreResult<HashSet<i64>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every write that names its claims by id keeps its fence out of the planner's index
    /// choice, so it never reads the claims through an index of every started claim.
    #[test]
    fn batched_writes_fence_on_state_in_a_form_no_index_serves() {
        let joint = joint_sql(SETTLE_MANY);
        for sql in [
            SETTLE_MANY,
            SETTLE_MANY_PLAIN,
            MARK_CALLED_MANY,
            joint.as_str(),
        ] {
            assert!(sql.contains(pg_still_started!()), "{sql}");
            assert!(!sql.contains("c.state = 'started'"), "{sql}");
        }
        // The fair take walks its tenants through the waiting claims' index on purpose; only
        // the lock of the ids it chose is fenced so.
        let fair = super::super::sql::STATEMENTS.take_fair;
        assert!(
            fair.contains(concat!(
                pg_still_started!(),
                " AND c.lease_owner IS NULL FOR UPDATE"
            )),
            "{fair}"
        );
    }

    #[test]
    fn a_settles_statement_is_numbered_after_the_claims() {
        assert_eq!(
            shift_params(
                "unnest($1::bigint[], $15::text[]) WHERE x = $2 AND y = '$'",
                17
            ),
            "unnest($18::bigint[], $32::text[]) WHERE x = $19 AND y = '$'"
        );
    }

    /// Every parameter of the joint statements is one that `insert_settle_batch` binds: the
    /// claims' seventeen, then the settles' fifteen (and the outcome events' consumers).
    #[test]
    fn the_joint_statements_take_the_claims_then_the_settles_parameters() {
        let params = |sql: &str| -> std::collections::BTreeSet<usize> {
            sql.split('$')
                .skip(1)
                .filter_map(|s| {
                    let d: String = s.chars().take_while(char::is_ascii_digit).collect();
                    d.parse().ok()
                })
                .collect()
        };
        assert_eq!(
            params(&joint_sql(SETTLE_MANY)),
            (1..=CLAIM_PARAMS + 16).collect()
        );
        assert_eq!(
            params(&joint_sql(SETTLE_MANY_PLAIN)),
            (1..=CLAIM_PARAMS + 15).collect()
        );
        assert_eq!(params(INSERT_CLAIMS), (1..=CLAIM_PARAMS).collect());
    }
}
