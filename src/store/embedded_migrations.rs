//! The migrations compiled into the binary, as sqlx's migrator takes them: the files under
//! `migrations/<dialect>/`, listed by `build.rs`, each read as sqlx's `migrate!` macro reads it
//! (version and description from the file name `NNNN_what_it_does.sql`, `-- no-transaction`
//! on the first line, the checksum of the text), so a database migrated by an earlier build
//! that used the macro validates against them.

use sqlx::migrate::{Migration, MigrationType, Migrator};

/// PostgreSQL's migrations: (file name, SQL).
const POSTGRES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations_postgres.rs"));

/// SQLite's migrations: (file name, SQL).
const SQLITE: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations_sqlite.rs"));

fn migration(file: &str, sql: &'static str) -> Migration {
    let (version, rest) = file.split_once('_').expect("NNNN_description.sql");
    let version: i64 = version.parse().expect("a numeric migration version");
    let description = rest.trim_end_matches(".sql").replace('_', " ");
    Migration::new(
        version,
        description.into(),
        MigrationType::Simple,
        sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(sql)),
        sql.starts_with("-- no-transaction"),
    )
}

fn migrator(files: &[(&str, &'static str)]) -> Migrator {
    Migrator::with_migrations(files.iter().map(|(f, sql)| migration(f, sql)).collect())
}

/// The PostgreSQL store's migrator.
pub fn postgres() -> Migrator {
    migrator(POSTGRES)
}

/// The SQLite store's migrator.
pub fn sqlite() -> Migrator {
    migrator(SQLITE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_embedded_in_version_order_with_its_description() {
        for (dir, m) in [("postgres", postgres()), ("sqlite", sqlite())] {
            let on_disk =
                std::fs::read_dir(format!("{}/migrations/{dir}", env!("CARGO_MANIFEST_DIR")))
                    .unwrap()
                    .filter(|e| {
                        e.as_ref()
                            .unwrap()
                            .file_name()
                            .to_string_lossy()
                            .ends_with(".sql")
                    })
                    .count();
            assert_eq!(m.iter().count(), on_disk, "{dir}");
            let versions: Vec<i64> = m.iter().map(|m| m.version).collect();
            let mut sorted = versions.clone();
            sorted.sort();
            assert_eq!(versions, sorted);
        }
        let first = postgres().iter().next().unwrap().clone();
        assert_eq!((first.version, first.description.as_ref()), (1, "claims"));
        assert!(!first.no_tx);
    }
}
