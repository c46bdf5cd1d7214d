//! The functions claimd installs in a producer's database run only claimd's code (I12): a
//! function another role planted under a built-in's name never runs in the producer's
//! transaction, and the runtime role the docs describe can create nothing where they look.
//! And enqueue refuses a URL field HTTP intake refuses (`..`), so nothing is claimed.

use crate::common;

use claimd::store::ClaimStore;
use claimd::{Enqueue, EnqueueError, enqueue};
use common::*;
use sqlx::{Connection, Executor, PgConnection};
use std::time::Duration;

/// The test database's URL as another role.
fn as_role(url: &str, role: &str) -> String {
    url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1)
}

async fn connect(url: &str) -> PgConnection {
    PgConnection::connect(url).await.unwrap()
}

/// Runs `sql` (several statements) as the connection's role.
async fn exec(conn: &mut PgConnection, sql: &str) -> Result<(), String> {
    conn.execute(sqlx::AssertSqlSafe(sql.to_string()))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Built-ins the functions call, each shadowed in `public` by one that copies the producer's
/// secret into a table the runtime role reads, then answers as the built-in would: with the
/// built-in's argument types, and with types a call with a literal matches better than the
/// built-in's (`'UTF8'` is taken as `text` before `name`), which `pg_catalog` first in the path
/// does not stop.
const PLANTED: &[(&str, &str, &str)] = &[
    (
        "convert_to(text, text)",
        "bytea",
        "pg_catalog.convert_to($1, $2::name)",
    ),
    (
        "convert_from(bytea, text)",
        "text",
        "pg_catalog.convert_from($1, $2::name)",
    ),
    ("json_step(jsonb, text)", "text", "$1 #>> ARRAY[$2]"),
    ("sha256(bytea)", "bytea", "pg_catalog.sha256($1)"),
    ("lower(text)", "text", "pg_catalog.lower($1)"),
    ("upper(text)", "text", "pg_catalog.upper($1)"),
    (
        "replace(text, text, text)",
        "text",
        "pg_catalog.replace($1, $2, $3)",
    ),
    ("now()", "timestamptz", "pg_catalog.now()"),
    ("length(bytea)", "integer", "pg_catalog.length($1)"),
    (
        "octet_length(text)",
        "integer",
        "pg_catalog.octet_length($1)",
    ),
    ("encode(bytea, text)", "text", "pg_catalog.encode($1, $2)"),
    (
        "convert_to(text, name)",
        "bytea",
        "pg_catalog.convert_to($1, $2)",
    ),
    (
        "get_byte(bytea, integer)",
        "integer",
        "pg_catalog.get_byte($1, $2)",
    ),
    (
        "quote_literal(text)",
        "text",
        "pg_catalog.quote_literal($1)",
    ),
    (
        "pg_notify(text, text)",
        "void",
        "pg_catalog.pg_notify($1, $2)",
    ),
];

/// The least-privilege roles of docs/postgresql.md and docs/producers.md on the test
/// database, migrated before the grants: the runtime role and the producer's role, and a
/// table only the producer may read. Dropped with the guard, also when the test fails.
async fn roles(admin: &mut PgConnection, url: &str) -> Roles {
    let db = url.rsplit('/').next().unwrap().to_string();
    let roles = Roles {
        url: url.to_string(),
        app: format!("{db}_app"),
        producer: format!("{db}_producer"),
    };
    let (app, producer) = (&roles.app, &roles.producer);
    exec(
        admin,
        &format!(
            "CREATE ROLE {app} LOGIN; CREATE ROLE {producer} LOGIN;
             GRANT USAGE ON SCHEMA public TO {app};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {app};
             GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {app};
             GRANT USAGE ON SCHEMA claimd TO {producer};
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA claimd TO {producer};
             GRANT SELECT ON claimd_consumers TO {producer};
             GRANT SELECT, INSERT, UPDATE ON claims TO {producer};
             GRANT USAGE ON SEQUENCE claims_id_seq TO {producer};
             CREATE TABLE secrets (card text);
             INSERT INTO secrets VALUES ('4242 4242 4242 4242');
             REVOKE ALL ON secrets FROM PUBLIC;
             GRANT SELECT ON secrets TO {producer};"
        ),
    )
    .await
    .unwrap();
    roles
}

/// Roles live in the cluster, not in the test's database: dropped before the database is.
struct Roles {
    url: String,
    app: String,
    producer: String,
}

impl Drop for Roles {
    fn drop(&mut self) {
        let (url, app, producer) = (self.url.clone(), self.app.clone(), self.producer.clone());
        // From a plain thread: the test's runtime may be shutting down.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(mut c) = PgConnection::connect(&url).await {
                    let sql = format!(
                        "DROP OWNED BY {app}, {producer} CASCADE; DROP ROLE {app}; DROP ROLE {producer}"
                    );
                    let _ = c.execute(sqlx::AssertSqlSafe(sql)).await;
                }
            });
        })
        .join();
    }
}

/// `claimd run` checks the migrations at every start; the runtime role needs no `CREATE` on
/// the schema for that when every migration is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_role_starts_without_create_on_the_schema_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let url = store.url();
    let owner = claimd::store::postgres::PgStore::connect(&url, 2)
        .await
        .unwrap();
    owner.migrate().await.unwrap();
    let mut admin = connect(&url).await;
    let roles = roles(&mut admin, &url).await;
    let as_app = claimd::store::postgres::PgStore::connect(&as_role(&url, &roles.app), 2)
        .await
        .unwrap();
    let checked = as_app.migrate().await;
    as_app.pool().close().await;
    checked.expect("the runtime role, without CREATE on the schema, passes the migration check");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_planted_by_the_runtime_role_never_runs_in_a_producers_enqueue_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let url = store.url();
    let (sandbox, provider) = sandbox(claimd::provider::sandbox::SandboxOptions::default()).await;
    let consumers = format!(
        "{}{}",
        consumer_toml("payments", &provider, ""),
        r#"
[[consumers]]
name = "tenanted"
source = "http"
key = "{consumer}:{tenant}:{message_id}"
redrive_within = "1h"
[consumers.effect]
kind = "http"
url = "PROVIDER/v1/tenanted/acct_{a}"
"#
        .replace("PROVIDER", &provider)
    );
    // Migrated and registered by the owner (here the superuser).
    let running = start(&config_toml(&url, &consumers)).await;
    let mut admin = connect(&url).await;
    let roles = roles(&mut admin, &url).await;
    let (app, producer) = (roles.app.clone(), roles.producer.clone());
    let as_app = as_role(&url, &app);
    let mut attacker = connect(&as_app).await;
    for schema in ["public", "claimd"] {
        let planted = exec(
            &mut attacker,
            &format!(
                "CREATE FUNCTION {schema}.sha256(bytea) RETURNS bytea LANGUAGE sql AS 'SELECT $1'"
            ),
        )
        .await;
        assert!(
            planted
                .as_ref()
                .is_err_and(|e| e.contains("permission denied")),
            "the runtime role created a function in {schema}: {planted:?}"
        );
    }

    // A database that still gives it CREATE on public (the grant older docs asked for; every
    // role has it before PostgreSQL 15): the functions must not look there before pg_catalog.
    exec(
        &mut admin,
        &format!("GRANT CREATE ON SCHEMA public TO {app}"),
    )
    .await
    .unwrap();
    exec(
        &mut attacker,
        "CREATE TABLE public.loot (via text, card text); GRANT INSERT ON public.loot TO PUBLIC",
    )
    .await
    .unwrap();
    for (signature, returns, builtin) in PLANTED {
        let name = signature.split('(').next().unwrap();
        exec(
            &mut attacker,
            &format!(
                "CREATE FUNCTION public.{signature} RETURNS {returns} LANGUAGE sql AS $f$
                     INSERT INTO public.loot SELECT '{name}', card FROM public.secrets;
                     SELECT {builtin}
                 $f$"
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("planting {signature}: {e}"));
    }

    // An operator the URL check uses, for a right-hand literal ('{}') as text.
    exec(
        &mut attacker,
        "CREATE OPERATOR public.#>> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = public.json_step)",
    )
    .await
    .unwrap();

    // The producer enqueues as docs/producers.md shows, with its session's search_path as
    // PostgreSQL sets it and as an application may set it (public before pg_catalog).
    let as_producer = as_role(&url, &producer);
    let mut shop = connect(&as_producer).await;
    for (i, path) in ["DEFAULT", "public, pg_catalog"].iter().enumerate() {
        exec(&mut shop, &format!("SET search_path TO {path}"))
            .await
            .unwrap();
        let mut tx = shop.begin().await.unwrap();
        let sql = format!(
            "SELECT * FROM claimd.enqueue('payments', 'planted-{i}', '{{\"amount\":500}}')"
        );
        let (_, created): (i64, bool) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert!(created);
        let sql = format!(
            "SELECT * FROM claimd.enqueue('tenanted', 'planted-{i}', '{{\"a\":\"x\"}}', tenant => 'Acme:EU')"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .unwrap();
        let rust_id = format!("planted-rust-{i}");
        enqueue(&mut tx, &Enqueue::new("payments", &rust_id, b"{}"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }

    let ran: Vec<(String, String)> = sqlx::query_as("SELECT via, card FROM public.loot")
        .fetch_all(&mut attacker)
        .await
        .unwrap();
    assert!(
        ran.is_empty(),
        "functions the runtime role planted ran in the producer's transaction: {ran:?}"
    );
    let read = exec(&mut attacker, "SELECT * FROM public.secrets").await;
    assert!(
        read.as_ref()
            .is_err_and(|e| e.contains("permission denied")),
        "{read:?}"
    );
    // Every function claimd installs (the trigger's too) has its path pinned.
    let paths: Vec<(String, Option<Vec<String>>)> = sqlx::query_as(
        "SELECT p.oid::regprocedure::text, p.proconfig FROM pg_proc p \
         JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'claimd' ORDER BY 1",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(paths.len() >= 5, "{paths:?}");
    for (function, config) in &paths {
        let config = config.as_deref().unwrap_or_default();
        assert!(
            config.contains(&"search_path=pg_catalog, public, pg_temp".to_string()),
            "{function}: {config:?}"
        );
        // Besides its path, a function may only bound how long it waits for a lock (the
        // archive's partition functions, migration 0027).
        assert!(
            config
                .iter()
                .all(|c| c.starts_with("search_path=") || c == "lock_timeout=500ms"),
            "{function}: {config:?}"
        );
    }
    // And the claims are performed.
    assert!(
        eventually(Duration::from_secs(20), || async {
            sandbox.effects().len() == 6
        })
        .await,
        "{:?}",
        sandbox.effects()
    );
    running.shutdown(Duration::from_secs(5)).await;
    drop((attacker, shop, roles));
}

const URL_FIELDS: &str = r#"
[[consumers]]
name = "payouts"
source = "http"
key = "{message_id}"
redrive_within = "1h"
[consumers.effect]
kind = "http"
url = "PROVIDER/v1/accounts/{account.id}/payouts/{message_id}"
"#;

/// HTTP intake refuses a message whose values make a path segment of the provider's URL `.`,
/// `..` (also percent-encoded) or empty; an enqueue of it raises, and nothing is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_refuses_a_dot_segment_url_field_as_http_intake_does_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (sandbox, provider) = sandbox(claimd::provider::sandbox::SandboxOptions::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &URL_FIELDS.replace("PROVIDER", &provider),
    ))
    .await;
    let mut shop = connect(&store.url()).await;
    let refused = [
        (r#"{"account": {"id": ".."}}"#, "m-1", "account.id"),
        (r#"{"account": {"id": "%2e%2E"}}"#, "m-2", "account.id"),
        (r#"{"account": {"id": "x/../y"}}"#, "m-3", "account.id"),
        (r#"{"account": {"id": "1"}}"#, "..", "message_id"),
        (r#"{"account": {"id": "1"}}"#, "%252e", "message_id"),
    ];
    for (payload, id, field) in refused {
        let mut tx = shop.begin().await.unwrap();
        let err = sqlx::query("SELECT * FROM claimd.enqueue('payouts', $1, $2::jsonb)")
            .bind(id)
            .bind(payload)
            .execute(&mut *tx)
            .await
            .expect_err(&format!("{id} {payload} was enqueued"));
        let db = err.as_database_error().unwrap();
        let message = db.message().to_string();
        assert_eq!(db.code().as_deref(), Some("CD011"), "{message}");
        assert!(
            message.starts_with(&format!("URL field {field} is "))
                && message.contains("dot segment"),
            "{message}"
        );
        tx.rollback().await.unwrap();
    }
    // The Rust enqueue gets the same refusal.
    let mut tx = shop.begin().await.unwrap();
    let answer = enqueue(
        &mut tx,
        &Enqueue::new("payouts", "m-4", br#"{"account":{"id":"."}}"#),
    )
    .await;
    assert!(
        matches!(&answer, Err(EnqueueError::Refused { code, .. }) if code == "CD011"),
        "{answer:?}"
    );
    drop(tx);
    // HTTP intake refuses the same message.
    let http = reqwest::Client::new()
        .post(format!("http://{}/v1/messages/payouts", running.http_addr))
        .header("Content-Type", "application/json")
        .header("Idempotency-Key", "m-5")
        .body(r#"{"account":{"id":".."}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(http.status().as_u16(), 400);
    // Values that stay inside their segment pass: ".." inside a longer segment, a number.
    for (payload, id) in [
        (r#"{"account": {"id": ".."}}"#.replace("..", "a.."), "ok-1"),
        (r#"{"account": {"id": 7}}"#.to_string(), "ok-2"),
    ] {
        let mut tx = shop.begin().await.unwrap();
        sqlx::query("SELECT * FROM claimd.enqueue('payouts', $1, $2::jsonb)")
            .bind(id)
            .bind(payload)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let claimed: Vec<String> =
        sqlx::query_scalar("SELECT message_id FROM claims WHERE consumer = 'payouts' ORDER BY 1")
            .fetch_all(&mut shop)
            .await
            .unwrap();
    assert_eq!(claimed, ["ok-1", "ok-2"]);
    assert!(
        eventually(Duration::from_secs(20), || async {
            sandbox.effects().len() == 2
        })
        .await
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// The same refusal from the Rust enqueue on SQLite (no SQL function there): the registry
/// keeps the URL's segments, and `enqueue` checks them as PostgreSQL's function does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_refuses_a_dot_segment_url_field_as_http_intake_does_sqlite() {
    use std::str::FromStr;
    let store = TestStore::sqlite();
    let (sandbox, provider) = sandbox(claimd::provider::sandbox::SandboxOptions::default()).await;
    let running = start(&config_toml(
        &store.url(),
        &URL_FIELDS.replace("PROVIDER", &provider),
    ))
    .await;
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&store.url())
        .unwrap()
        .busy_timeout(Duration::from_secs(30));
    let mut shop = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    let refused = [
        (r#"{"account": {"id": ".."}}"#, "m-1", "account.id"),
        (r#"{"account": {"id": "%2e%2E"}}"#, "m-2", "account.id"),
        (r#"{"account": {"id": "x/../y"}}"#, "m-3", "account.id"),
        (r#"{"account": {"id": "1"}}"#, "..", "message_id"),
        (r#"{"account": {"id": "1"}}"#, "%252e", "message_id"),
    ];
    for (payload, id, field) in refused {
        let mut tx = shop.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let answer = enqueue(&mut tx, &Enqueue::new("payouts", id, payload.as_bytes())).await;
        match &answer {
            Err(EnqueueError::Refused { code, message })
                if code == "CD011"
                    && message.starts_with(&format!("URL field {field} is "))
                    && message.contains("dot segment") => {}
            other => panic!("{id} {payload}: {other:?}"),
        }
        tx.rollback().await.unwrap();
    }
    for (payload, id) in [
        (r#"{"account": {"id": "a.."}}"#, "ok-1"),
        (r#"{"account": {"id": 7}}"#, "ok-2"),
    ] {
        let mut tx = shop.begin_with("BEGIN IMMEDIATE").await.unwrap();
        enqueue(&mut tx, &Enqueue::new("payouts", id, payload.as_bytes()))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let claimed: Vec<String> =
        sqlx::query_scalar("SELECT message_id FROM claims WHERE consumer = 'payouts' ORDER BY 1")
            .fetch_all(&mut shop)
            .await
            .unwrap();
    assert_eq!(claimed, ["ok-1", "ok-2"]);
    assert!(
        eventually(Duration::from_secs(20), || async {
            sandbox.effects().len() == 2
        })
        .await
    );
    running.shutdown(Duration::from_secs(5)).await;
}
