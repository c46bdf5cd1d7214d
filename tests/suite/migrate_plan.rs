//! `claimd migrate --plan` on a real PostgreSQL: every migration pending on an empty database
//! (locking nothing that has rows), none after `claimd migrate`; an index build left pending
//! on a table with rows is built concurrently ahead of its migration, and a backfill under an
//! exclusive lock is named as stopping intake (exit 3).

use crate::common;

use common::*;

#[tokio::test]
async fn the_plan_builds_indexes_concurrently_and_names_a_locked_backfill_as_stopping_intake() {
    let Some(db) = PgDb::create().await else {
        return;
    };
    let env = [("CLAIMD__STORE__URL", db.url.as_str())];
    let (code, out, err) = cli_with_env(&["migrate", "--plan"], &env);
    assert_eq!(
        code, 0,
        "an empty database: nothing with rows is locked\n{out}{err}"
    );
    assert!(out.contains("migration(s) pending"), "{out}");
    assert!(out.contains("0001 claims"), "{out}");
    assert!(!out.contains("STOPS INTAKE"), "{out}");

    let (code, _, err) = cli_with_env(&["migrate"], &env);
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = cli_with_env(&["migrate", "--plan"], &env);
    assert_eq!(code, 0);
    assert_eq!(out, "no migration pending: the store is up to date\n");

    // 20,000 claims, and migration 12 (an index on claims, IF NOT EXISTS) pending again.
    let mut conn = {
        use sqlx::Connection;
        sqlx::PgConnection::connect(&db.url).await.unwrap()
    };
    sqlx::query(
        "INSERT INTO claims (consumer, message_id, idem_key, fingerprint, payload)
         SELECT 'payments', 'm' || n, 'payments::m' || n, 'f', '\\x7b7d'::bytea
         FROM generate_series(1, 20000) n",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("ANALYZE claims")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 12")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("DROP INDEX claims_started_received")
        .execute(&mut conn)
        .await
        .unwrap();
    // Its index is built concurrently ahead of the migration: writes go on.
    let (code, out, err) = cli_with_env(&["migrate", "--plan"], &env);
    assert_eq!(code, 0, "a concurrent build stops nothing\n{out}{err}");
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("claims "))
        .unwrap_or_else(|| panic!("claims is listed: {out}"));
    assert!(line.contains("SHARE UPDATE EXCLUSIVE"), "{line}");
    assert!(line.contains("~20000 rows"), "{line}");
    assert!(!line.contains("STOPS INTAKE"), "{line}");
    let (code, _, err) = cli_with_env(&["migrate"], &env);
    assert_eq!(code, 0, "{err}");
    let valid: bool = sqlx::query_scalar(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE c.relname = 'claims_started_received'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(valid, "the index built ahead is there and valid");

    // Migration 11 adds a column and updates rows in one transaction: the table's strongest
    // lock is held while rows are read.
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 11")
        .execute(&mut conn)
        .await
        .unwrap();
    let (code, out, err) = cli_with_env(&["migrate", "--plan"], &env);
    assert_eq!(
        code, 3,
        "a backfill under an exclusive lock on a full table stops intake\n{out}{err}"
    );
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("claims "))
        .unwrap_or_else(|| panic!("claims is listed: {out}"));
    assert!(line.contains("ACCESS EXCLUSIVE"), "{line}");
    assert!(line.contains("STOPS INTAKE"), "{line}");
    let (code, json, _) = cli_with_env(&["migrate", "--plan", "--format", "json"], &env);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["stops_intake_while_reading_rows"], true);
    assert_eq!(v["pending"][0]["version"], 11);
    assert_eq!(v["pending"][0]["held"][0]["lock"], "ACCESS_EXCLUSIVE");
}

/// Rolling upgrades: a build runs on a schema a newer build expanded (migrations it does not
/// know that only add), and refuses one a newer build contracted, naming the migration.
async fn an_older_build_runs_beside_expand_and_refuses_contract(url: &str, pg: bool) {
    let env = [("CLAIMD__STORE__URL", url)];
    let (code, _, err) = cli_with_env(&["migrate"], &env);
    assert_eq!(code, 0, "{err}");
    // What a newer release would have applied, as sqlx records it.
    let insert = |version: i64, description: &str| {
        if pg {
            format!(
                "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                 VALUES ({version}, '{description}', true, '\\x00'::bytea, 1)"
            )
        } else {
            format!(
                "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                 VALUES ({version}, '{description}', 1, x'00', 1)"
            )
        }
    };
    let exec = |sql: String| {
        let url = url.to_string();
        async move {
            use sqlx::Connection;
            if pg {
                let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                    .execute(&mut c)
                    .await
                    .unwrap();
            } else {
                let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
        }
    };
    exec(insert(9000, "expand add column")).await;
    let (code, out, err) = cli_with_env(&["migrate"], &env);
    assert_eq!(code, 0, "an expand-only newer schema: {out}{err}");
    let (code, _, err) = cli_with_env(&["claims", "list"], &env);
    assert_eq!(code, 0, "{err}");
    exec(insert(9001, "contract drop handoff")).await;
    let (code, out, err) = cli_with_env(&["migrate"], &env);
    assert_ne!(code, 0, "a contracted newer schema is refused: {out}");
    assert!(
        err.contains("migration 9001 (contract drop handoff)")
            && err.contains("deploy claimd built with migration 9001 or newer"),
        "{err}"
    );
}

#[tokio::test]
async fn an_older_build_runs_beside_expand_and_refuses_contract_on_postgres() {
    let Some(db) = PgDb::create().await else {
        return;
    };
    an_older_build_runs_beside_expand_and_refuses_contract(&db.url, true).await;
}

#[tokio::test]
async fn an_older_build_runs_beside_expand_and_refuses_contract_on_sqlite() {
    let store = TestStore::sqlite();
    an_older_build_runs_beside_expand_and_refuses_contract(&store.url(), false).await;
}
