//! `kind = "sql"`: a statement with named parameters, run in the transaction that settles its
//! claim ([`DatabaseEffect`]). The statement is parsed once, at start: `:name` placeholders
//! become PostgreSQL's `$n` and SQLite's `?n`; each message's values come from its payload's
//! top-level JSON fields, or its ids.

use crate::domain::claim::Claim;
use crate::provider::effect::settings::SqlEffectConfig;
use crate::provider::effect::{Effect, Lookup, Outcome};
use crate::store::db_effect::{DatabaseEffect, DbTx};
use async_trait::async_trait;

/// Parameters every message has, besides its payload's fields.
const IDS: [&str; 4] = ["message_id", "tenant", "idem_key", "consumer"];

/// A statement with its named parameters, in both dialects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedStatement {
    /// With `$1`, `$2`, … (PostgreSQL).
    pub postgres: String,
    /// With `?1`, `?2`, … (SQLite).
    pub sqlite: String,
    /// The parameters' names, in the order of their numbers.
    pub names: Vec<String>,
}

/// Why a statement cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatementError {
    /// Nothing to run.
    #[error("effect.statement is empty")]
    Empty,
    /// A quote or a quoted name never ends.
    #[error("effect.statement: a quoted string or name starting at byte {0} never ends")]
    Unterminated(usize),
}

/// Parses `:name` placeholders (a letter or `_`, then letters, digits, `_`), leaving quoted
/// strings and names, `::` casts and `$n` alone. A name used twice is one parameter.
pub fn parse_statement(text: &str) -> Result<NamedStatement, StatementError> {
    if text.trim().is_empty() {
        return Err(StatementError::Empty);
    }
    let b = text.as_bytes();
    let (mut pg, mut lite) = (String::new(), String::new());
    let mut names: Vec<String> = Vec::new();
    let mut i = 0;
    let mut plain = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => {
                let end = b[i + 1..]
                    .iter()
                    .position(|&c| c == q)
                    .ok_or(StatementError::Unterminated(i))?;
                i += end + 2;
            }
            b':' if b.get(i + 1) == Some(&b':') => i += 2,
            b':' if b
                .get(i + 1)
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_') =>
            {
                let start = i + 1;
                let mut end = start;
                while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
                    end += 1;
                }
                let name = &text[start..end];
                let n = match names.iter().position(|x| x == name) {
                    Some(k) => k + 1,
                    None => {
                        names.push(name.to_string());
                        names.len()
                    }
                };
                pg.push_str(&text[plain..i]);
                lite.push_str(&text[plain..i]);
                pg.push_str(&format!("${n}"));
                lite.push_str(&format!("?{n}"));
                i = end;
                plain = end;
            }
            _ => i += 1,
        }
    }
    pg.push_str(&text[plain..]);
    lite.push_str(&text[plain..]);
    Ok(NamedStatement {
        postgres: pg,
        sqlite: lite,
        names,
    })
}

/// One parameter's value for one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Text (a JSON string, or an id).
    Text(String),
    /// A JSON integer.
    Int(i64),
    /// A JSON number that is not an integer.
    Float(f64),
    /// A JSON boolean.
    Bool(bool),
    /// JSON `null`.
    Null,
    /// A JSON object or array, as its JSON text.
    Json(String),
}

/// The values of `names` for one message: ids by name, the rest from the payload's
/// top-level fields. `Err` names the first field the payload lacks.
pub fn values_of(names: &[String], payload: &[u8], ids: [&str; 4]) -> Result<Vec<Value>, String> {
    let needs_payload = names.iter().any(|n| !IDS.contains(&n.as_str()));
    let fields =
        if needs_payload {
            match serde_json::from_slice::<serde_json::Value>(payload) {
                Ok(serde_json::Value::Object(m)) => m,
                Ok(_) => return Err(
                    "the payload must be a JSON object: the effect's statement takes its fields"
                        .into(),
                ),
                Err(e) => {
                    return Err(format!(
                        "the payload is not JSON ({e}): the effect's statement takes its fields"
                    ));
                }
            }
        } else {
            serde_json::Map::new()
        };
    names
        .iter()
        .map(|name| {
            if let Some(k) = IDS.iter().position(|x| x == name) {
                return Ok(Value::Text(ids[k].to_string()));
            }
            let v = fields.get(name).ok_or_else(|| {
                format!("the payload has no field {name:?}, which the effect's statement takes as :{name}")
            })?;
            Ok(match v {
                serde_json::Value::String(s) => Value::Text(s.clone()),
                serde_json::Value::Number(n) => match n.as_i64() {
                    Some(i) => Value::Int(i),
                    None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
                },
                serde_json::Value::Bool(b) => Value::Bool(*b),
                serde_json::Value::Null => Value::Null,
                other => Value::Json(other.to_string()),
            })
        })
        .collect()
}

/// The `kind = "sql"` effect.
#[derive(Debug)]
pub struct SqlEffect {
    statement: NamedStatement,
}

impl SqlEffect {
    /// The effect `config` describes.
    pub fn new(config: &SqlEffectConfig) -> Result<Self, StatementError> {
        Ok(SqlEffect {
            statement: parse_statement(&config.statement)?,
        })
    }

    fn values(&self, claim: &Claim) -> Result<Vec<Value>, String> {
        values_of(
            &self.statement.names,
            &claim.payload,
            [
                &claim.message_id,
                &claim.tenant,
                &claim.idem_key,
                &claim.consumer,
            ],
        )
    }
}

/// Binds `values` to `sql` for database `DB` (a macro: sqlx's `bind` is generic over each
/// value's type).
macro_rules! bound {
    ($db:ty, $sql:expr, $values:expr) => {{
        let mut q = sqlx::query::<$db>(sqlx::AssertSqlSafe($sql));
        for v in $values {
            q = match v {
                Value::Text(s) | Value::Json(s) => q.bind(s),
                Value::Int(i) => q.bind(i),
                Value::Float(f) => q.bind(f),
                Value::Bool(b) => q.bind(b),
                Value::Null => q.bind(None::<String>),
            };
        }
        q
    }};
}

#[async_trait]
impl DatabaseEffect for SqlEffect {
    fn validate(&self, payload: &[u8]) -> Result<(), String> {
        values_of(&self.statement.names, payload, ["", "", "", ""]).map(drop)
    }

    async fn apply(&self, tx: DbTx<'_>, claim: &Claim) -> Result<(), sqlx::Error> {
        // Checked at intake, but a claim enqueued or stored before the statement changed may
        // still lack a field: it can never be applied as it is, so it fails at once.
        let values = self.values(claim).map_err(sqlx::Error::InvalidArgument)?;
        match tx {
            #[cfg(feature = "postgres")]
            DbTx::Postgres(conn) => {
                // Unnamed: the store may be reached through a pooler in transaction mode,
                // where a named statement meets other clients' (inside the settle's
                // transaction an unnamed one is safe).
                bound!(sqlx::Postgres, self.statement.postgres.clone(), values)
                    .persistent(false)
                    .execute(conn)
                    .await?;
            }
            #[cfg(feature = "sqlite")]
            DbTx::Sqlite(conn) => {
                bound!(sqlx::Sqlite, self.statement.sqlite.clone(), values)
                    .execute(conn)
                    .await?;
            }
        }
        Ok(())
    }
}

/// Wraps a [`DatabaseEffect`] as the consumer's [`Effect`]: the claimer sees
/// [`Effect::database`] and runs it in the settle's transaction; it is never performed as a
/// call.
pub struct InTransaction<E>(pub E);

#[async_trait]
impl<E: DatabaseEffect + 'static> Effect for InTransaction<E> {
    async fn perform(&self, _claim: &Claim) -> Outcome {
        // Never called: the claimer runs database effects through `Effect::database`.
        Outcome::NotApplied {
            status: None,
            retry_after: None,
            error: "a database effect runs in the settle's transaction, not as a call".into(),
        }
    }

    async fn lookup(&self, _claim: &Claim) -> Option<Lookup> {
        None
    }

    fn can_reconcile(&self) -> bool {
        false
    }

    fn validate(&self, payload: &[u8], _content_type: &str) -> Result<(), String> {
        self.0.validate(payload)
    }

    fn database(&self) -> Option<&dyn DatabaseEffect> {
        Some(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_parameters_become_numbered_ones_in_each_dialect() {
        let s = parse_statement(
            "INSERT INTO t (a, b, c) VALUES (:order_id, ':not_one', :amount::bigint) \
             ON CONFLICT DO UPDATE SET a = :order_id",
        )
        .unwrap();
        assert_eq!(s.names, ["order_id", "amount"]);
        assert_eq!(
            s.postgres,
            "INSERT INTO t (a, b, c) VALUES ($1, ':not_one', $2::bigint) \
             ON CONFLICT DO UPDATE SET a = $1"
        );
        assert!(s.sqlite.contains("VALUES (?1, ':not_one', ?2::bigint)"));
        assert_eq!(parse_statement("  "), Err(StatementError::Empty));
        assert_eq!(
            parse_statement("SELECT 'open"),
            Err(StatementError::Unterminated(7))
        );
    }

    #[test]
    fn values_come_from_ids_and_payload_fields_with_their_json_types() {
        let names: Vec<String> = ["message_id", "n", "x", "ok", "none", "obj", "s"]
            .map(String::from)
            .to_vec();
        let payload = br#"{"n": 5, "x": 1.5, "ok": true, "none": null, "obj": {"a": 1}, "s": "t"}"#;
        let v = values_of(&names, payload, ["m-1", "", "k", "c"]).unwrap();
        assert_eq!(
            v,
            [
                Value::Text("m-1".into()),
                Value::Int(5),
                Value::Float(1.5),
                Value::Bool(true),
                Value::Null,
                Value::Json(r#"{"a":1}"#.into()),
                Value::Text("t".into()),
            ]
        );
        let missing = values_of(&["amount".to_string()], b"{}", ["", "", "", ""]).unwrap_err();
        assert!(missing.contains("no field \"amount\""), "{missing}");
        assert!(values_of(&["a".to_string()], b"[1]", ["", "", "", ""]).is_err());
    }
}
