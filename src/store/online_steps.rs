//! What of a pending PostgreSQL migration claimd does *before* the migration, outside its
//! transaction, so the migration itself only changes the catalog: intake does not wait while
//! an index is built over a large `claims`. Pure: the statements come from the migration's SQL
//! ([`split_statements`]); the caller checks which tables exist and runs the steps.
//!
//! Two kinds of statement qualify, both idempotent, so the migration's own copy is a no-op
//! once the step ran:
//! - `CREATE [UNIQUE] INDEX IF NOT EXISTS …` is run as `CREATE … INDEX CONCURRENTLY IF NOT
//!   EXISTS …`: writes go on while it reads the table;
//! - `ALTER TABLE t ADD COLUMN IF NOT EXISTS …` with no default or a constant one, no
//!   constraint, is run on its own first (a catalog change under a brief lock), so an index of
//!   the same migration over the new column can be built concurrently too.

use crate::store::migration_plan::split_statements;

/// One statement run before its migration, outside any transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnlineStep {
    /// A column added ahead of its migration.
    AddColumn {
        /// The table, lower case, without schema.
        table: String,
        /// The statement, as the migration has it.
        sql: String,
    },
    /// An index built concurrently ahead of its migration.
    BuildIndex {
        /// The index's name, lower case.
        name: String,
        /// The table, lower case, without schema.
        table: String,
        /// The statement with `CONCURRENTLY` added.
        sql: String,
    },
}

impl OnlineStep {
    /// The table the step changes.
    pub fn table(&self) -> &str {
        match self {
            OnlineStep::AddColumn { table, .. } | OnlineStep::BuildIndex { table, .. } => table,
        }
    }

    /// The statement to run.
    pub fn sql(&self) -> &str {
        match self {
            OnlineStep::AddColumn { sql, .. } | OnlineStep::BuildIndex { sql, .. } => sql,
        }
    }
}

/// The steps of a migration, in its order. A migration that runs outside a transaction
/// (`-- no-transaction`) has none: its statements already end their own locks.
pub fn online_steps(sql: &str) -> Vec<OnlineStep> {
    if crate::store::migration_plan::runs_outside_a_transaction(sql) {
        return Vec::new();
    }
    split_statements(sql)
        .iter()
        .filter_map(|s| index_step(s).or_else(|| column_step(s)))
        .collect()
}

/// The statement that runs instead of `statement`, ahead of its migration and outside its
/// transaction: an idempotent index build, made concurrent (`claimd migrate --plan` shows
/// its locks). Column additions also run ahead but stay in the migration too, locks and all.
pub fn concurrent_form(statement: &str) -> Option<String> {
    match index_step(statement)? {
        OnlineStep::BuildIndex { sql, .. } => Some(sql),
        OnlineStep::AddColumn { .. } => None,
    }
}

fn upper_words(statement: &str) -> Vec<String> {
    statement
        .split_whitespace()
        .map(|w| w.to_ascii_uppercase())
        .collect()
}

fn bare_name(word: &str) -> String {
    let w = word.split('(').next().unwrap_or(word);
    let w = w.rsplit('.').next().unwrap_or(w);
    w.trim_matches('"').to_ascii_lowercase()
}

fn index_step(statement: &str) -> Option<OnlineStep> {
    let words = upper_words(statement);
    let at = match words.as_slice() {
        [c, i, ..] if c == "CREATE" && i == "INDEX" => 1,
        [c, u, i, ..] if c == "CREATE" && u == "UNIQUE" && i == "INDEX" => 2,
        _ => return None,
    };
    // Only an idempotent build: the migration's own statement must find the index there.
    let rest = &words[at + 1..];
    if rest.len() < 6 || rest[0] != "IF" || rest[1] != "NOT" || rest[2] != "EXISTS" {
        return None;
    }
    let name = bare_name(statement.split_whitespace().nth(at + 4)?);
    let on = rest.iter().position(|w| w == "ON")?;
    let mut table_word = rest.get(on + 1)?.as_str();
    if table_word == "ONLY" {
        table_word = rest.get(on + 2)?;
    }
    let table = bare_name(table_word);
    // Insert CONCURRENTLY after the statement's own INDEX word, keeping its text.
    let mut cut = 0;
    for (n, word) in statement.split_whitespace().enumerate() {
        let found = statement[cut..].find(word)? + cut;
        cut = found + word.len();
        if n == at {
            break;
        }
    }
    let sql = format!("{} CONCURRENTLY{}", &statement[..cut], &statement[cut..]);
    Some(OnlineStep::BuildIndex { name, table, sql })
}

fn column_step(statement: &str) -> Option<OnlineStep> {
    let words = upper_words(statement);
    if words.len() < 8 || words[0] != "ALTER" || words[1] != "TABLE" {
        return None;
    }
    let text = words.join(" ");
    let table_at = if words[2] == "IF" { 4 } else { 2 };
    let table = bare_name(statement.split_whitespace().nth(table_at)?);
    // Every action an `ADD COLUMN IF NOT EXISTS`, nothing that scans, rewrites or validates.
    let adds = text.matches(" ADD ").count();
    let idempotent_adds = text.matches(" ADD COLUMN IF NOT EXISTS ").count();
    let forbidden = [
        "REFERENCES",
        "CHECK",
        "UNIQUE",
        "PRIMARY",
        "GENERATED",
        " DROP ",
        " ALTER ",
        " TYPE ",
        // A function call in a default, or a type's parameters: kept in the migration
        // rather than told apart.
        "(",
    ];
    let has_default = words.iter().any(|w| w == "DEFAULT");
    let not_null_without_default = text.contains("NOT NULL") && !has_default;
    let after_table = text
        .split_once(words[table_at].as_str())
        .map_or("", |x| x.1);
    if adds == 0
        || adds != idempotent_adds
        || forbidden.iter().any(|f| after_table.contains(f))
        || not_null_without_default
    {
        return None;
    }
    Some(OnlineStep::AddColumn {
        table,
        sql: statement.trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idempotent_index_build_is_taken_out_concurrently() {
        let steps = online_steps(
            "-- why\nCREATE INDEX IF NOT EXISTS claims_open ON claims (consumer, state)\n    \
             INCLUDE (lease_until) WHERE state IN ('started');\n\
             CREATE UNIQUE INDEX IF NOT EXISTS u ON public.claims USING btree (id);",
        );
        assert_eq!(
            steps,
            vec![
                OnlineStep::BuildIndex {
                    name: "claims_open".into(),
                    table: "claims".into(),
                    sql: "CREATE INDEX CONCURRENTLY IF NOT EXISTS claims_open ON claims (consumer, state)\n    \
                          INCLUDE (lease_until) WHERE state IN ('started')"
                        .into(),
                },
                OnlineStep::BuildIndex {
                    name: "u".into(),
                    table: "claims".into(),
                    sql: "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS u ON public.claims USING btree (id)"
                        .into(),
                },
            ]
        );
    }

    #[test]
    fn a_build_that_is_not_idempotent_or_already_concurrent_stays_in_its_migration() {
        assert!(online_steps("CREATE INDEX x ON claims (a);").is_empty());
        assert!(
            online_steps("CREATE INDEX CONCURRENTLY IF NOT EXISTS x ON claims (a);").is_empty()
        );
        assert!(
            online_steps("-- no-transaction\nCREATE INDEX IF NOT EXISTS x ON claims (a);")
                .is_empty()
        );
    }

    #[test]
    fn only_plain_idempotent_column_additions_run_ahead() {
        let ok = online_steps(
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS provider_id text;\n\
             ALTER TABLE claims ADD COLUMN IF NOT EXISTS waits integer NOT NULL DEFAULT 0;",
        );
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].table(), "claims");
        assert_eq!(
            ok[1].sql(),
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS waits integer NOT NULL DEFAULT 0"
        );
        for kept in [
            "ALTER TABLE claims ADD COLUMN trace_parent text;",
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS n integer NOT NULL;",
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS r uuid DEFAULT gen_random_uuid();",
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS o bigint REFERENCES owners;",
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS a int, DROP COLUMN b;",
            "ALTER TABLE claims ALTER COLUMN a TYPE bigint;",
        ] {
            assert!(online_steps(kept).is_empty(), "{kept}");
        }
    }
}
