//! SQLite's group commit: the claims (or settles) the `batch` module gathered, written in one
//! `BEGIN IMMEDIATE` transaction and made durable by one commit (`synchronous = FULL`: the
//! WAL is synced before the commit returns, so every caller's answer follows its row onto
//! disk). SQLite has one writer, and the dialect's writer lock queues the writes of this
//! process before they reach it.
//!
//! Within the transaction the rows go in multi-row statements, made from the one-row
//! statements of [`sql`] (the same columns and rules, the parameters repeated per row): each
//! statement is a round trip to SQLite's worker thread, and with one statement per row those
//! hand-offs, not SQLite, were most of a batch's time. A batch is cut into chunks of
//! [`CHUNKS`] sizes, so a handful of statement texts serve every batch and stay prepared.
//!
//! Unlike PostgreSQL's multi-row insert, a claim whose key is already taken is counted here,
//! in the same transaction, with the same rule as the one-row path.

use super::{SqliteDialect, sql};
use crate::domain::claim::ClaimState;
use crate::domain::claim::NewClaim;
use crate::store::args::{
    INSERT_PARAMS, SETTLE_PARAMS, created, insert_args, repeat_args, repeat_outcome, settle_args,
};
use crate::store::dialect::{Arg, LoggedWrite, SqlPool, SqlRow, event_args};
use crate::store::outbox::{OutcomeConsumers, emits};
use crate::store::rows::claim_from_row;
use crate::store::{ClaimOutcome, NewEvent, SettleItem, StoreError, StoreResult};
use sqlx::sqlite::SqliteRow;
use sqlx::{Sqlite, SqliteConnection};
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

/// The sizes a batch is cut into, largest first (a batch of 100: 64, 32, 4).
const CHUNKS: [usize; 7] = [64, 32, 16, 8, 4, 2, 1];

// The largest statement (64 claims of INSERT_PARAMS parameters) stays within SQLite's parameter limit.
const _: () = assert!(CHUNKS[0] * INSERT_PARAMS <= 32_766);

/// `items` cut into [`CHUNKS`]-sized runs, in order.
fn chunks<T>(items: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        let size = CHUNKS.into_iter().find(|&c| c <= rest.len())?;
        let (head, tail) = rest.split_at(size);
        rest = tail;
        Some(head)
    })
}

/// `sql` with every parameter `?N` replaced by `to(N)`.
fn map_params(sql: &str, to: impl Fn(usize) -> String) -> String {
    let mut out = String::with_capacity(sql.len() * 2);
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '?' {
            out.push(c);
            continue;
        }
        let mut n = String::new();
        while let Some(d) = chars.next_if(char::is_ascii_digit) {
            n.push(d);
        }
        match n.parse() {
            Ok(n) => out.push_str(&to(n)),
            Err(_) => {
                out.push('?');
                out.push_str(&n);
            }
        }
    }
    out
}

/// A one-row `INSERT ... VALUES (...) ...` of `params` parameters as `rows` rows: the
/// parenthesised row repeated, row r's parameters moved up by r × `params`.
fn insert_rows(sql: &str, params: usize, rows: usize) -> String {
    let open = sql.find("VALUES (").expect("a VALUES row") + "VALUES ".len();
    let mut depth = 0;
    let close = open
        + sql[open..]
            .find(|c| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .expect("the VALUES row closes");
    let values = repeat_row(&sql[open..=close], params, rows);
    format!("{}{values}{}", &sql[..open], &sql[close + 1..])
}

/// `row` (a parenthesised list naming `?1`..`?params`) `rows` times, comma-separated, row r's
/// parameters moved up by r × `params`.
fn repeat_row(row: &str, params: usize, rows: usize) -> String {
    let rows: Vec<String> = (0..rows)
        .map(|r| map_params(row, |k| format!("?{}", k + r * params)))
        .collect();
    rows.join(", ")
}

/// A one-row `UPDATE … WHERE id = ?1 …` of `params` parameters for `rows` rows: its
/// parameters read from a `VALUES` list `v` (one row of `params` per claim), joined on the
/// claim's id; each row keeps the statement's fence (attempt, state).
fn update_rows(sql: &str, params: usize, rows: usize) -> String {
    let names = |f: fn(usize) -> String| (1..=params).map(f).collect::<Vec<_>>().join(", ");
    let values = repeat_row(&format!("({})", names(|k| format!("?{k}"))), params, rows);
    assert!(sql.contains(" WHERE id = ?1 "), "an update by id: {sql}");
    let update =
        map_params(sql, |k| format!("v.p{k}")).replacen(" WHERE id = ", " FROM v WHERE id = ", 1);
    format!(
        "WITH v({}) AS (VALUES {values}) {update}",
        names(|k| format!("p{k}"))
    )
}

/// The one-row `settle` (twelve parameters, `RETURNING id, attempt`) for `rows` rows.
fn settle_rows(rows: usize) -> String {
    update_rows(sql::STATEMENTS.settle, SETTLE_PARAMS, rows)
}

/// The one-row `mark_called` (two parameters) for `rows` rows, saying which rows it changed.
fn mark_called_rows(rows: usize) -> String {
    format!(
        "{} RETURNING id",
        update_rows(sql::STATEMENTS.mark_called, 2, rows)
    )
}

/// The text `make` gives for a chunk of `rows` (one of [`CHUNKS`]), made once per process.
fn text(
    cell: &'static OnceLock<Vec<String>>,
    make: fn(usize) -> String,
    rows: usize,
) -> &'static str {
    let texts = cell.get_or_init(|| CHUNKS.into_iter().map(make).collect());
    let at = CHUNKS
        .iter()
        .position(|&c| c == rows)
        .expect("a chunk size");
    &texts[at]
}

fn insert_claims_text(rows: usize) -> &'static str {
    static TEXTS: OnceLock<Vec<String>> = OnceLock::new();
    text(
        &TEXTS,
        |n| insert_rows(sql::STATEMENTS.insert_claim, INSERT_PARAMS, n),
        rows,
    )
}

fn settle_text(rows: usize) -> &'static str {
    static TEXTS: OnceLock<Vec<String>> = OnceLock::new();
    text(&TEXTS, settle_rows, rows)
}

/// The outcome events of `rows` claims in one statement: four parameters a claim (id, actor,
/// action, reason), then the consumers' JSON array.
fn insert_outcomes_rows(rows: usize) -> String {
    let values = repeat_row("(?1, ?2, ?3, ?4)", 4, rows);
    let insert = sql::INSERT_OUTCOMES_FROM_V.replace("?{last}", &format!("?{}", rows * 4 + 1));
    format!("WITH v(p1, p2, p3, p4) AS (VALUES {values}) {insert}")
}

fn insert_outcomes_text(rows: usize) -> &'static str {
    static TEXTS: OnceLock<Vec<String>> = OnceLock::new();
    text(&TEXTS, insert_outcomes_rows, rows)
}

fn mark_called_text(rows: usize) -> &'static str {
    static TEXTS: OnceLock<Vec<String>> = OnceLock::new();
    text(&TEXTS, mark_called_rows, rows)
}

fn insert_events_text(rows: usize) -> &'static str {
    static TEXTS: OnceLock<Vec<String>> = OnceLock::new();
    text(
        &TEXTS,
        |n| insert_rows(sql::STATEMENTS.insert_event, 7, n),
        rows,
    )
}

fn err(query: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::from_sqlx(query, e)
}

/// Runs `w`'s update on `conn` (inside a transaction) and, when it changed a row, writes the
/// history line of that row.
pub(super) async fn logged(
    conn: &mut SqliteConnection,
    w: LoggedWrite<'_>,
) -> StoreResult<Option<SqliteRow>> {
    let Some(row) = SqlPool::<Sqlite>::query(w.sql, w.args)
        .fetch_optional(&mut *conn)
        .await
        .map_err(err(w.name))?
    else {
        return Ok(None);
    };
    let (id, attempt) = (row.i64("id")?, row.i32("attempt")?);
    SqlPool::<Sqlite>::query(
        sql::STATEMENTS.insert_event,
        &event_args(id, attempt, w.event),
    )
    .execute(&mut *conn)
    .await
    .map_err(err("insert_event"))?;
    if let Some(outcomes) = w.outcomes {
        insert_outcome(conn, id, w.event, outcomes).await?;
    }
    for child in w.follow_ups {
        SqlPool::<Sqlite>::query(
            sql::STATEMENTS.insert_follow_up,
            &crate::store::dialect::follow_up_args(child, id),
        )
        .execute(&mut *conn)
        .await
        .map_err(err("insert_follow_up"))?;
    }
    Ok(Some(row))
}

/// Writes the outcome event of claim `id` as it is now, when `outcomes` (a JSON array) names
/// its consumer: in the change's transaction.
async fn insert_outcome(
    conn: &mut SqliteConnection,
    id: i64,
    event: &NewEvent<'_>,
    outcomes: &str,
) -> StoreResult<()> {
    if outcomes == "[]" {
        return Ok(());
    }
    SqlPool::<Sqlite>::query(
        sql::INSERT_OUTCOME,
        &[
            Arg::I64(id),
            Arg::Text(event.actor),
            Arg::Text(event.action),
            Arg::SealedText(event.detail),
            Arg::Text(outcomes),
        ],
    )
    .execute(&mut *conn)
    .await
    .map_err(err("insert_outcome"))?;
    Ok(())
}

impl SqliteDialect {
    /// The writer lock of this process, then a `BEGIN IMMEDIATE` transaction: SQLite's write
    /// lock taken at the start, so the batch never fails half-way on a busy upgrade.
    async fn write_transaction(
        &self,
    ) -> StoreResult<(
        tokio::sync::MutexGuard<'_, ()>,
        sqlx::Transaction<'static, Sqlite>,
    )> {
        let writer = self.writer.lock().await;
        let tx = self
            .sql
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(err("begin"))?;
        Ok((writer, tx))
    }

    /// Claims `new` in one transaction: inserted in multi-row statements, then each whose key
    /// was taken (earlier, or by an earlier row of this batch) counted as a repeat in turn.
    pub(super) async fn claim_together(
        &self,
        new: &[&NewClaim],
    ) -> StoreResult<Vec<Option<ClaimOutcome>>> {
        let (_writer, mut tx) = self.write_transaction().await?;
        // The rows this batch inserted, by key; each belongs to the caller whose claim token
        // it carries (of two callers with one key, the one whose row went in).
        let mut inserted: HashMap<(String, String, String), SqliteRow> = HashMap::new();
        for chunk in chunks(new) {
            let args: Vec<Arg<'_>> = chunk.iter().flat_map(|n| insert_args(n)).collect();
            let rows = SqlPool::<Sqlite>::query(insert_claims_text(chunk.len()), &args)
                .fetch_all(&mut *tx)
                .await
                .map_err(err("insert_claims"))?;
            for row in rows {
                let key = (
                    row.text("consumer")?,
                    row.text("tenant")?,
                    row.text("message_id")?,
                );
                inserted.insert(key, row);
            }
        }
        let mut out = Vec::with_capacity(new.len());
        for n in new {
            let key = (n.consumer.clone(), n.tenant.clone(), n.message_id.clone());
            if let Some(row) = inserted.get(&key) {
                let claim = claim_from_row(row)?;
                if n.claim_token.is_empty() || n.inserted(&claim) {
                    inserted.remove(&key);
                    out.push(Some(created(n, claim)));
                    continue;
                }
            }
            // The key is taken: the same rule as the one-row path. No row: left to that path
            // (it cannot happen while this transaction holds the only write lock).
            let existing = SqlPool::<Sqlite>::query(sql::STATEMENTS.count_repeat, &repeat_args(n))
                .fetch_optional(&mut *tx)
                .await
                .map_err(err("count_repeat"))?;
            out.push(
                existing
                    .map(|row| claim_from_row(&row).map(|c| repeat_outcome(n, c)))
                    .transpose()?,
            );
        }
        tx.commit().await.map_err(err("commit"))?;
        Ok(out)
    }

    /// Settles `items` (distinct ids) in one transaction, each fenced on its own attempt (I2),
    /// then writes the history lines of those that changed.
    pub(super) async fn settle_together(
        &self,
        items: &[SettleItem<'_>],
        outcomes: &OutcomeConsumers,
    ) -> StoreResult<Vec<bool>> {
        let (_writer, mut tx) = self.write_transaction().await?;
        let mut settled: HashSet<(i64, i32)> = HashSet::with_capacity(items.len());
        for chunk in chunks(items) {
            let args: Vec<Arg<'_>> = chunk
                .iter()
                .flat_map(|i| settle_args(i.id, i.attempt, &i.settlement))
                .collect();
            let rows = SqlPool::<Sqlite>::query(settle_text(chunk.len()), &args)
                .fetch_all(&mut *tx)
                .await
                .map_err(err("settle"))?;
            for row in rows {
                settled.insert((row.i64("id")?, row.i32("attempt")?));
            }
        }
        let changed: Vec<&SettleItem<'_>> = items
            .iter()
            .filter(|i| settled.contains(&(i.id, i.attempt)))
            .collect();
        for chunk in chunks(&changed) {
            let args: Vec<Arg<'_>> = chunk
                .iter()
                .flat_map(|i| event_args(i.id, i.attempt, &i.event))
                .collect();
            SqlPool::<Sqlite>::query(insert_events_text(chunk.len()), &args)
                .execute(&mut *tx)
                .await
                .map_err(err("insert_events"))?;
        }
        if !outcomes.is_empty() {
            let emitting: Vec<&&SettleItem<'_>> = changed
                .iter()
                .filter(|i| emits(ClaimState::Started, i.settlement.state))
                .collect();
            for chunk in chunks(&emitting) {
                let mut args: Vec<Arg<'_>> = Vec::with_capacity(chunk.len() * 4 + 1);
                for i in chunk {
                    args.extend([
                        Arg::I64(i.id),
                        Arg::Text(i.event.actor),
                        Arg::Text(i.event.action),
                        Arg::SealedText(i.event.detail),
                    ]);
                }
                args.push(Arg::Text(outcomes.bound(true)));
                SqlPool::<Sqlite>::query(insert_outcomes_text(chunk.len()), &args)
                    .execute(&mut *tx)
                    .await
                    .map_err(err("insert_outcomes"))?;
            }
        }
        tx.commit().await.map_err(err("commit"))?;
        Ok(items
            .iter()
            .map(|i| settled.contains(&(i.id, i.attempt)))
            .collect())
    }

    /// Clears the "not called yet" markers of `marks` (distinct ids) in one transaction, each
    /// fenced on its own attempt.
    pub(super) async fn mark_called_together(
        &self,
        marks: &[(i64, i32)],
    ) -> StoreResult<Vec<bool>> {
        let (_writer, mut tx) = self.write_transaction().await?;
        let mut changed: HashSet<i64> = HashSet::with_capacity(marks.len());
        for chunk in chunks(marks) {
            let args: Vec<Arg<'_>> = chunk
                .iter()
                .flat_map(|&(id, attempt)| [Arg::I64(id), Arg::I32(attempt)])
                .collect();
            let rows = SqlPool::<Sqlite>::query(mark_called_text(chunk.len()), &args)
                .fetch_all(&mut *tx)
                .await
                .map_err(err("mark_called"))?;
            for row in rows {
                changed.insert(row.i64("id")?);
            }
        }
        tx.commit().await.map_err(err("commit"))?;
        Ok(marks.iter().map(|m| changed.contains(&m.0)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_cut_into_few_statement_sizes_in_order() {
        let items: Vec<usize> = (0..100).collect();
        let sizes: Vec<usize> = chunks(&items).map(<[usize]>::len).collect();
        assert_eq!(sizes, [64, 32, 4]);
        let again: Vec<usize> = chunks(&items).flatten().copied().collect();
        assert_eq!(again, items);
        assert_eq!(chunks::<u8>(&[]).count(), 0);
    }

    #[test]
    fn a_one_row_insert_becomes_a_multi_row_insert_with_renumbered_parameters() {
        let one = "INSERT INTO t (a, b, c) VALUES (?1, NULLIF(?2, ''), CAST(x AS INTEGER) + ?1) \
                   ON CONFLICT DO NOTHING RETURNING a";
        assert_eq!(
            insert_rows(one, 2, 3),
            "INSERT INTO t (a, b, c) VALUES (?1, NULLIF(?2, ''), CAST(x AS INTEGER) + ?1), \
             (?3, NULLIF(?4, ''), CAST(x AS INTEGER) + ?3), \
             (?5, NULLIF(?6, ''), CAST(x AS INTEGER) + ?5) ON CONFLICT DO NOTHING RETURNING a"
        );
        // Two-digit parameters are one parameter, not ?1 followed by a digit.
        assert_eq!(map_params("?1 ?11 ?", |k| format!("<{k}>")), "<1> <11> ?");
    }

    #[test]
    fn the_outcome_events_of_a_batch_go_in_one_statement_with_the_consumers_last() {
        let two = insert_outcomes_rows(2);
        assert!(
            two.starts_with(
                "WITH v(p1, p2, p3, p4) AS (VALUES (?1, ?2, ?3, ?4), (?5, ?6, ?7, ?8)) \
                 INSERT INTO outcome_events"
            ),
            "{two}"
        );
        assert!(
            two.ends_with("JOIN json_each(?9) d ON json_extract(d.value, '$[0]') = c.consumer"),
            "{two}"
        );
    }

    #[test]
    fn the_multi_row_settle_is_the_one_row_settle_reading_its_parameters_from_v() {
        let two = settle_rows(2);
        assert!(two.starts_with("WITH v(p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12) AS (VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12), (?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)) UPDATE claims SET "), "{two}");
        // The from-state is a parameter (`started` for the batched settles of a worker).
        assert!(
            two.contains(
                " FROM v WHERE id = v.p1 AND attempt = v.p2 AND state = v.p11 \
                 AND (v.p12 IS NULL OR version = v.p12)"
            ),
            "{two}"
        );
        let update = &two[two.find("UPDATE").unwrap()..];
        assert!(!update.contains('?'), "{update}");
        let marks = mark_called_rows(2);
        assert!(
            marks.starts_with("WITH v(p1, p2) AS (VALUES (?1, ?2), (?3, ?4)) UPDATE claims SET "),
            "{marks}"
        );
        assert!(
            marks.ends_with(
                " FROM v WHERE id = v.p1 AND attempt = v.p2 AND state = 'started' RETURNING id"
            ),
            "{marks}"
        );
    }
}
