//! What a pending PostgreSQL migration will lock, read from its SQL before it runs
//! (`claimd migrate --plan`). Pure: the statements are split and classified by their
//! leading words, after PostgreSQL's documented lock levels ("Explicit Locking", and each
//! command's page). A migration runs in one transaction (unless its first line is
//! `-- no-transaction`), so every lock it takes is held until the whole migration commits:
//! a brief `ALTER TABLE` before a long index build blocks for the build's length too.

use serde::Serialize;

/// The table locks of PostgreSQL that a migration's statements take, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LockLevel {
    /// Catalog changes only (functions, grants, comments, a new table or schema).
    None,
    /// `ROW EXCLUSIVE`: what `INSERT`/`UPDATE`/`DELETE` take; blocks no intake, but the rows it
    /// changes stay locked until the migration commits.
    RowExclusive,
    /// `SHARE UPDATE EXCLUSIVE`: `CREATE INDEX CONCURRENTLY`; reads and writes go on.
    ShareUpdateExclusive,
    /// `SHARE`: `CREATE INDEX`; reads go on, writes (intake, settles) wait.
    Share,
    /// `SHARE ROW EXCLUSIVE`: a trigger or a foreign key; writes wait.
    ShareRowExclusive,
    /// `ACCESS EXCLUSIVE`: most `ALTER TABLE`, `DROP`; everything waits, reads too.
    AccessExclusive,
}

impl LockLevel {
    /// Whether intake (inserts and updates of the table) waits while the lock is held.
    pub fn blocks_writes(self) -> bool {
        self >= LockLevel::Share
    }

    /// PostgreSQL's name of the lock.
    pub fn name(self) -> &'static str {
        match self {
            LockLevel::None => "none",
            LockLevel::RowExclusive => "ROW EXCLUSIVE",
            LockLevel::ShareUpdateExclusive => "SHARE UPDATE EXCLUSIVE",
            LockLevel::Share => "SHARE",
            LockLevel::ShareRowExclusive => "SHARE ROW EXCLUSIVE",
            LockLevel::AccessExclusive => "ACCESS EXCLUSIVE",
        }
    }
}

/// One statement of a migration and what it locks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatementLock {
    /// The statement's first line, for the listing.
    pub statement: String,
    /// The existing table it locks, when it locks one.
    pub table: Option<String>,
    /// The lock it takes on that table.
    pub lock: LockLevel,
    /// Whether its time grows with the table's rows (an index build, a scan, a rewrite, an
    /// update of every row) rather than being a catalog change.
    pub scales_with_rows: bool,
    /// Set when the words were not recognised: read the statement yourself.
    pub unclassified: bool,
}

/// Splits SQL into statements at `;`, outside quotes, dollar-quoted bodies and comments.
/// Comments are dropped; empty statements are left out.
pub fn split_statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let b = sql.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let rest = &sql[i..];
        if rest.starts_with("--") {
            i += rest.find('\n').unwrap_or(rest.len());
            continue;
        }
        if rest.starts_with("/*") {
            i += rest.find("*/").map(|e| e + 2).unwrap_or(rest.len());
            continue;
        }
        let c = b[i];
        if c == b'\'' || c == b'"' {
            let end = rest[1..]
                .find(c as char)
                .map(|e| e + 2)
                .unwrap_or(rest.len());
            cur.push_str(&rest[..end]);
            i += end;
            continue;
        }
        if c == b'$'
            && let Some(tag_end) = rest[1..].find('$')
            && rest[1..1 + tag_end]
                .bytes()
                .all(|t| t.is_ascii_alphanumeric() || t == b'_')
        {
            let tag = &rest[..tag_end + 2];
            let body_end = rest[tag.len()..]
                .find(tag)
                .map(|e| e + 2 * tag.len())
                .unwrap_or(rest.len());
            cur.push_str(&rest[..body_end]);
            i += body_end;
            continue;
        }
        if c == b';' {
            push_statement(&mut out, &mut cur);
        } else {
            // Multi-byte characters pass whole: only ASCII bytes are ever matched above.
            let len = rest.chars().next().map_or(1, char::len_utf8);
            cur.push_str(&rest[..len]);
            i += len;
            continue;
        }
        i += 1;
    }
    push_statement(&mut out, &mut cur);
    out
}

fn push_statement(out: &mut Vec<String>, cur: &mut String) {
    let s = cur.trim();
    if !s.is_empty() {
        out.push(s.to_string());
    }
    cur.clear();
}

/// The table name after `word` (`ON`, `TABLE`, …), without `ONLY`, `IF EXISTS` or a schema.
fn name_after(words: &[String], word: &str) -> Option<String> {
    let at = words.iter().position(|w| w == word)?;
    words[at + 1..]
        .iter()
        .find(|w| !matches!(w.as_str(), "ONLY" | "IF" | "NOT" | "EXISTS"))
        .map(|w| {
            let w = w.split('(').next().unwrap_or(w);
            w.rsplit('.').next().unwrap_or(w).to_ascii_lowercase()
        })
}

/// Classifies one statement (as [`split_statements`] gives it).
pub fn classify(statement: &str) -> StatementLock {
    let words: Vec<String> = statement
        .split_whitespace()
        .map(|w| w.to_ascii_uppercase())
        .collect();
    let has = |w: &str| words.iter().any(|x| x == w);
    let starts = |prefix: &[&str]| {
        words.len() >= prefix.len() && words.iter().zip(prefix).all(|(a, b)| a == b)
    };
    let first_line = statement.lines().next().unwrap_or("").trim().to_string();
    let mut r = StatementLock {
        statement: first_line,
        table: None,
        lock: LockLevel::None,
        scales_with_rows: false,
        unclassified: false,
    };
    let text = words.join(" ");
    if starts(&["CREATE", "INDEX"]) || starts(&["CREATE", "UNIQUE", "INDEX"]) {
        r.table = name_after(&words, "ON");
        r.scales_with_rows = true;
        r.lock = if has("CONCURRENTLY") {
            LockLevel::ShareUpdateExclusive
        } else {
            LockLevel::Share
        };
    } else if starts(&["DROP", "INDEX"]) {
        r.lock = if has("CONCURRENTLY") {
            LockLevel::ShareUpdateExclusive
        } else {
            LockLevel::AccessExclusive
        };
        r.table = statement
            .split_whitespace()
            .last()
            .map(|w| format!("index {}", w.rsplit('.').next().unwrap_or(w)));
    } else if starts(&["ALTER", "TABLE"]) {
        r.table = name_after(&words, "TABLE");
        r.lock = LockLevel::AccessExclusive;
        let validates = (text.contains("ADD CONSTRAINT") || text.contains("ADD CHECK"))
            && !text.contains("NOT VALID");
        let rewrites = text.contains(" TYPE ")
            || text.contains("SET NOT NULL")
            || (has("DEFAULT") && volatile_default(&text));
        r.scales_with_rows = validates || rewrites;
        if text.contains("VALIDATE CONSTRAINT") {
            r.lock = LockLevel::ShareUpdateExclusive;
            r.scales_with_rows = true;
        }
    } else if starts(&["DROP", "TABLE"]) {
        r.table = name_after(&words, "TABLE");
        r.lock = LockLevel::AccessExclusive;
    } else if starts(&["DROP", "TRIGGER"]) {
        r.table = name_after(&words, "ON");
        r.lock = LockLevel::AccessExclusive;
    } else if starts(&["CREATE", "TRIGGER"])
        || starts(&["CREATE", "OR", "REPLACE", "TRIGGER"])
        || starts(&["CREATE", "CONSTRAINT", "TRIGGER"])
    {
        r.table = name_after(&words, "ON");
        r.lock = LockLevel::ShareRowExclusive;
    } else if starts(&["CREATE", "TABLE"]) {
        // A new table; a foreign key locks the table it references.
        if let Some(referenced) = name_after(&words, "REFERENCES") {
            r.table = Some(referenced);
            r.lock = LockLevel::ShareRowExclusive;
        }
    } else if starts(&["UPDATE"]) {
        r.table = words.get(1).map(|w| w.to_ascii_lowercase());
        r.lock = LockLevel::RowExclusive;
        r.scales_with_rows = true;
    } else if starts(&["DELETE", "FROM"]) || starts(&["INSERT", "INTO"]) {
        r.table = words.get(2).map(|w| {
            let w = w.split('(').next().unwrap_or(w);
            w.to_ascii_lowercase()
        });
        r.lock = LockLevel::RowExclusive;
        r.scales_with_rows = starts(&["DELETE"]) || has("SELECT");
    } else {
        let catalog_only = [
            "CREATE FUNCTION",
            "CREATE OR REPLACE FUNCTION",
            "CREATE SCHEMA",
            "CREATE ROLE",
            "CREATE TYPE",
            "CREATE SEQUENCE",
            "CREATE VIEW",
            "CREATE OR REPLACE VIEW",
            "CREATE EXTENSION",
            "DROP FUNCTION",
            "ALTER FUNCTION",
            "ALTER ROLE",
            "ALTER DEFAULT PRIVILEGES",
            "ALTER SCHEMA",
            "GRANT",
            "REVOKE",
            "COMMENT",
            "DO",
            "SELECT",
            "SET",
        ];
        r.unclassified = !catalog_only.iter().any(|p| {
            text == *p || text.starts_with(&format!("{p} ")) || text.starts_with(&format!("{p}("))
        });
    }
    r
}

/// Whether an `ADD COLUMN … DEFAULT` uses a volatile function: then PostgreSQL writes the
/// value into every row (a rewrite); other defaults are stored once in the catalog.
fn volatile_default(text: &str) -> bool {
    [
        "CLOCK_TIMESTAMP(",
        "RANDOM(",
        "GEN_RANDOM_UUID(",
        "NEXTVAL(",
    ]
    .iter()
    .any(|f| text.contains(f))
}

/// Every statement of a migration's SQL, classified.
pub fn analyze(sql: &str) -> Vec<StatementLock> {
    analyze_after(sql, |_| None)
}

/// As [`analyze`], for a migration some of whose statements run ahead of it, outside its
/// transaction: `ahead` gives the statement that runs instead (an index built
/// `CONCURRENTLY`), or `None`.
pub fn analyze_after(sql: &str, ahead: impl Fn(&str) -> Option<String>) -> Vec<StatementLock> {
    split_statements(sql)
        .iter()
        .map(|s| classify(&ahead(s).unwrap_or_else(|| s.clone())))
        .collect()
}

/// Whether the migration runs outside a transaction (sqlx's `-- no-transaction` first line):
/// then each statement's lock ends with the statement.
pub fn runs_outside_a_transaction(sql: &str) -> bool {
    sql.lines()
        .next()
        .is_some_and(|l| l.trim() == "-- no-transaction")
}

/// The strongest lock a migration holds on each table, and whether it is held while something
/// scales with rows: in one transaction, every lock lasts until the commit.
pub fn held(sql: &str) -> Vec<(String, LockLevel, bool)> {
    held_after(sql, |_| None)
}

/// As [`held`], for a migration some of whose statements run ahead of it (see
/// [`analyze_after`]): those hold their lock for their own length only.
pub fn held_after(
    sql: &str,
    ahead: impl Fn(&str) -> Option<String>,
) -> Vec<(String, LockLevel, bool)> {
    let split = split_statements(sql);
    // A table this migration creates has no rows and no readers yet: its locks stop nothing.
    let created: Vec<String> = split
        .iter()
        .filter_map(|s| {
            let words: Vec<String> = s
                .split_whitespace()
                .map(|w| w.to_ascii_uppercase())
                .collect();
            (words.len() > 2 && words[0] == "CREATE" && words[1] == "TABLE")
                .then(|| name_after(&words, "TABLE"))
                .flatten()
        })
        .collect();
    let statements: Vec<(StatementLock, bool)> = split
        .iter()
        .map(|s| match ahead(s) {
            Some(instead) => (classify(&instead), true),
            None => (classify(s), false),
        })
        .filter(|(s, _)| s.table.as_ref().is_none_or(|t| !created.contains(t)))
        .collect();
    let whole_tx = !runs_outside_a_transaction(sql);
    let any_scales = statements
        .iter()
        .any(|(s, ran_ahead)| s.scales_with_rows && !ran_ahead);
    let mut held: Vec<(String, LockLevel, bool)> = Vec::new();
    for (s, ran_ahead) in &statements {
        let Some(table) = &s.table else { continue };
        let long = s.scales_with_rows || (whole_tx && any_scales && !ran_ahead);
        match held.iter_mut().find(|(t, _, _)| t == table) {
            Some(h) => {
                h.1 = h.1.max(s.lock);
                h.2 |= long;
            }
            None => held.push((table.clone(), s.lock, long)),
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_outside_quotes_bodies_and_comments() {
        let sql = "-- a; comment\nCREATE TABLE t (a TEXT DEFAULT ';');\n\
                   CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $fn$ SELECT 1; $fn$;\n\
                   /* b; */ GRANT SELECT ON t TO r";
        let s = split_statements(sql);
        assert_eq!(s.len(), 3, "{s:?}");
        assert!(s[1].contains("SELECT 1; $fn$"));
        assert_eq!(s[2], "GRANT SELECT ON t TO r");
    }

    #[test]
    fn an_index_build_blocks_writes_unless_concurrent() {
        let plain = classify("CREATE INDEX IF NOT EXISTS claims_x ON claims (consumer, id)");
        assert_eq!(plain.table.as_deref(), Some("claims"));
        assert_eq!(plain.lock, LockLevel::Share);
        assert!(plain.lock.blocks_writes() && plain.scales_with_rows);
        let concurrent =
            classify("CREATE INDEX CONCURRENTLY IF NOT EXISTS x ON ONLY public.claims(id)");
        assert_eq!(concurrent.table.as_deref(), Some("claims"));
        assert!(!concurrent.lock.blocks_writes());
    }

    #[test]
    fn alter_table_is_brief_unless_it_scans_or_rewrites() {
        let add = classify("ALTER TABLE claims ADD COLUMN IF NOT EXISTS erased_utc TIMESTAMPTZ");
        assert_eq!(add.lock, LockLevel::AccessExclusive);
        assert!(!add.scales_with_rows);
        assert!(
            !classify("ALTER TABLE claims ADD COLUMN n BIGINT NOT NULL DEFAULT 0").scales_with_rows
        );
        assert!(
            classify("ALTER TABLE claims ADD COLUMN u UUID DEFAULT gen_random_uuid()")
                .scales_with_rows
        );
        assert!(
            classify("ALTER TABLE claims ADD CONSTRAINT c CHECK (attempt > 0)").scales_with_rows
        );
        assert!(
            !classify("ALTER TABLE claims ADD CONSTRAINT c CHECK (attempt > 0) NOT VALID")
                .scales_with_rows
        );
        assert!(classify("ALTER TABLE claims ALTER COLUMN x SET NOT NULL").scales_with_rows);
    }

    #[test]
    fn catalog_changes_lock_no_table_and_the_unknown_is_flagged() {
        for s in [
            "CREATE OR REPLACE FUNCTION claimd.f() RETURNS void AS $$ $$ LANGUAGE sql",
            "GRANT USAGE ON SCHEMA claimd TO claimd_producer",
            "CREATE SCHEMA IF NOT EXISTS claimd",
            "CREATE TABLE IF NOT EXISTS operators (name TEXT PRIMARY KEY)",
        ] {
            let c = classify(s);
            assert_eq!(c.lock, LockLevel::None, "{s}");
            assert!(!c.unclassified, "{s}");
        }
        assert!(classify("VACUUM claims").unclassified);
        let fk = classify("CREATE TABLE a (id BIGINT REFERENCES claims(id))");
        assert_eq!(fk.table.as_deref(), Some("claims"));
        assert_eq!(fk.lock, LockLevel::ShareRowExclusive);
    }

    #[test]
    fn in_one_transaction_a_brief_lock_lasts_as_long_as_the_build_after_it() {
        let sql = "ALTER TABLE claims ADD COLUMN a TEXT;\nCREATE INDEX i ON outcome_events (id);";
        let h = held(sql);
        assert_eq!(h[0], ("claims".into(), LockLevel::AccessExclusive, true));
        assert_eq!(h[1], ("outcome_events".into(), LockLevel::Share, true));
        let created =
            "CREATE TABLE t (id BIGINT REFERENCES claims(id));\nCREATE INDEX ti ON t (id);";
        assert_eq!(
            held(created),
            vec![("claims".into(), LockLevel::ShareRowExclusive, false)]
        );
        let apart = format!("-- no-transaction\n{sql}");
        assert!(
            !held(&apart)[0].2,
            "outside a transaction it ends with its statement"
        );
    }

    #[test]
    fn every_shipped_migration_is_classified() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
        let mut unknown = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let sql = std::fs::read_to_string(&path).unwrap();
            for s in analyze(&sql).into_iter().filter(|s| s.unclassified) {
                unknown.push(format!("{}: {}", path.display(), s.statement));
            }
        }
        assert!(unknown.is_empty(), "{unknown:#?}");
    }
}
