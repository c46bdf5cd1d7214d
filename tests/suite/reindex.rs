//! `claimd reindex`: after churn, the indexes of `claims` are many times what their rows need
//! and stay so after vacuum; the command names them, refuses to rebuild them as the runtime
//! role, rebuilds them as the owner while the table stays writable, drops the invalid copy a
//! cut rebuild left, and then finds nothing more to do.

use crate::common;

use common::pg_roles::{TwoRoles, exec};
use common::*;
use sqlx::{Connection, PgConnection};
use std::time::Duration;

async fn scalar(c: &mut PgConnection, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(c)
        .await
        .unwrap()
}

const FILL: &str = "\
    INSERT INTO claims (consumer, tenant, message_id, idem_key, fingerprint, payload, content_type, \
      state, attempt, received_utc, started_utc, processed_utc, updated_utc, provider_status) \
    SELECT 'payments', '', 'order-' || i, 'payments::order-' || i, md5(i::text), \
      convert_to('{\"amount\":' || i || '}', 'UTF8'), 'application/json', 'completed', 1, \
      now() - interval '1 hour', now() - interval '1 hour', now(), now(), 200 \
    FROM generate_series(1, 40000) AS i";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bloated_indexes_are_rebuilt_by_the_owner_only_and_a_cut_rebuild_is_cleaned_up() {
    let Some(t) = PgDb::create().await else {
        return;
    };
    let roles = TwoRoles::migrated(&t).await;
    let mut su = PgConnection::connect(&roles.admin_url).await.unwrap();
    // Churn: every row written three times more, then nine in ten deleted, then vacuumed.
    exec(&mut su, FILL).await.unwrap();
    for _ in 0..3 {
        exec(
            &mut su,
            "UPDATE claims SET updated_utc = updated_utc + interval '1 s', attempt = attempt + 1",
        )
        .await
        .unwrap();
    }
    exec(&mut su, "DELETE FROM claims WHERE id % 10 <> 0")
        .await
        .unwrap();
    exec(&mut su, "VACUUM ANALYZE claims").await.unwrap();
    let bloated = scalar(&mut su, "SELECT pg_indexes_size('claims')").await;

    // A rebuild cut while it waits for a writer: its invalid copy stays behind.
    let mut writer = PgConnection::connect(&roles.admin_url).await.unwrap();
    exec(
        &mut writer,
        "BEGIN; UPDATE claims SET attempt = attempt WHERE id = (SELECT min(id) FROM claims)",
    )
    .await
    .unwrap();
    let admin_url = roles.admin_url.clone();
    let cut = tokio::spawn(async move {
        let mut c = PgConnection::connect(&admin_url).await.unwrap();
        exec(&mut c, "SET application_name = 'cut_rebuild'")
            .await
            .unwrap();
        exec(&mut c, "REINDEX INDEX CONCURRENTLY claims_received").await
    });
    let mut waited = 0;
    while scalar(
        &mut su,
        "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'cut_rebuild' \
         AND wait_event_type = 'Lock'",
    )
    .await
        == 0
    {
        waited += 1;
        assert!(waited < 200, "the rebuild never waited for the writer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    exec(
        &mut su,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'cut_rebuild'",
    )
    .await
    .unwrap();
    assert!(cut.await.unwrap().is_err(), "the rebuild was cut");
    exec(&mut writer, "ROLLBACK").await.unwrap();
    let invalid = "SELECT COUNT(*) FROM pg_index WHERE NOT indisvalid \
                   AND indexrelid::regclass::text LIKE 'claims_received_ccnew%'";
    assert_eq!(scalar(&mut su, invalid).await, 1);

    // The runtime role may look, not rebuild; the report says what to do.
    let app = [("CLAIMD__STORE__URL", roles.app_url.as_str())];
    let (code, out, err) = cli_with_env(&["report"], &app);
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|l| l.trim_start().starts_with("claims:"));
    assert!(
        line.is_some_and(|l| l.contains("INDEXES") && l.contains("run `claimd reindex`")),
        "{out}"
    );
    let (code, out, err) = cli_with_env(&["reindex", "--dry-run", "--min-mib", "0"], &app);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("claims_received"), "{out}");
    assert!(
        out.contains("would drop public.claims_received_ccnew"),
        "{out}"
    );
    assert!(out.contains("would rebuild"), "{out}");
    assert!(out.contains("nothing was changed"), "{out}");
    let (code, _, err) = cli_with_env(&["reindex", "--min-mib", "0"], &app);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("only the owner of claimd's tables"), "{err}");

    // The owner rebuilds while a writer goes on.
    let app_url = roles.app_url.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let writes = tokio::spawn(async move {
        let mut c = PgConnection::connect(&app_url).await.unwrap();
        let mut n = 0u32;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            exec(
                &mut c,
                "UPDATE claims SET attempt = attempt + 1 WHERE id = (SELECT max(id) FROM claims)",
            )
            .await
            .unwrap();
            n += 1;
        }
        n
    });
    let owner = [("CLAIMD__STORE__URL", roles.owner_url.as_str())];
    let oid = "SELECT 'claims_pkey'::regclass::oid::bigint";
    let pkey_before = scalar(&mut su, oid).await;
    let (code, out, err) = cli_with_env(&["reindex", "--min-mib", "0"], &owner);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("dropped public.claims_received_ccnew"),
        "{out}"
    );
    assert!(out.contains("rebuilt: "), "{out}");
    assert!(
        writes.await.unwrap() > 0,
        "writes went on during the rebuild"
    );
    // A concurrent rebuild builds a new index and swaps it in (a new oid); a plain REINDEX,
    // which would stop the writes, keeps the oid.
    assert_ne!(
        scalar(&mut su, oid).await,
        pkey_before,
        "rebuilt concurrently"
    );
    let (_, report, _) = cli_with_env(&["report"], &app);
    assert!(!report.contains("INDEXES"), "{report}");
    assert_eq!(scalar(&mut su, invalid).await, 0, "{out}");
    let rebuilt = scalar(&mut su, "SELECT pg_indexes_size('claims')").await;
    assert!(
        rebuilt * 3 < bloated,
        "indexes {bloated} bytes before, {rebuilt} after\n{out}"
    );

    // The runtime role is refused the rebuild itself too (no leftover to drop this time).
    let (code, _, err) = cli_with_env(&["reindex", "--all", "--min-mib", "0"], &app);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("only the owner of claimd's tables"), "{err}");

    // Nothing left beyond twice a fresh build: the estimate is not below what a build takes.
    exec(&mut su, "ANALYZE claims").await.unwrap();
    let (code, out, err) = cli_with_env(
        &["reindex", "--dry-run", "--min-mib", "0", "--format", "json"],
        &owner,
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let indexes = v["indexes"].as_array().unwrap();
    assert!(indexes.len() >= 15, "{out}");
    for i in indexes {
        assert_ne!(i["verdict"], "rebuild", "{i}");
        if i["table"] == "claims" {
            assert_ne!(i["verdict"], "unknown", "{i}");
        }
    }
}

#[tokio::test]
async fn sqlite_has_nothing_to_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/c.db?mode=rwc", dir.path().display());
    let (code, _, err) = cli_with_env(&["migrate"], &[("CLAIMD__STORE__URL", url.as_str())]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli_with_env(&["reindex"], &[("CLAIMD__STORE__URL", url.as_str())]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("SQLite: nothing to rebuild"), "{out}");
}
