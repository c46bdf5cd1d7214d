//! The archive of finished claims on PostgreSQL (`[retention] archive_after`, migration 0027),
//! run as the runtime role of docs/postgresql.md (no `CREATE` anywhere): finished claims past
//! `archive_after` leave `claims` with their history; reads, listings and erasure still find
//! them; a month of the archive is dropped whole once its claims' retention is over; open claims
//! never move; producers cannot call the partition functions.

use super::*;
use claimd::store::{ClaimFilter, RetentionWindows};
use common::pg_roles::{TwoRoles, exec};
use sqlx::{Connection, PgConnection, Row};

const DAY: Duration = Duration::from_secs(86_400);

async fn count(c: &mut PgConnection, sql: &str) -> i64 {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(c)
        .await
        .unwrap()
        .get::<i64, _>(0)
}

#[tokio::test]
async fn finished_claims_move_to_the_archive_and_leave_a_month_at_a_time_postgres() {
    let Some(t) = PgDb::create().await else {
        return;
    };
    let roles = TwoRoles::migrated(&t).await;
    let s = claimd::store::open(&roles.app_url, 4).await.unwrap();
    let states = [
        ClaimState::Completed,
        ClaimState::Failed,
        ClaimState::NeedsAttention,
        ClaimState::Started,
    ];
    for i in 0..12 {
        let ClaimOutcome::Created(c) = s
            .claim(&new_claim(&format!("a{i}"), Duration::from_secs(60)))
            .await
            .unwrap()
        else {
            panic!("a{i} not created")
        };
        let st = states[i % 4];
        if st != ClaimState::Started {
            let set = Settlement {
                state: Some(st),
                error: Some("card declined".into()),
                ..Default::default()
            };
            assert!(s.settle(c.id, 1, &set, &ev()).await.unwrap());
        }
    }
    let mut su = PgConnection::connect(&roles.admin_url).await.unwrap();
    exec(
        &mut su,
        "UPDATE claims SET updated_utc = updated_utc - interval '2 days'",
    )
    .await
    .unwrap();
    let w = RetentionWindows {
        completed: 7 * DAY,
        failed: 30 * DAY,
        dead_letters: 7 * DAY,
        records: 7 * DAY,
        archive_after: Some(DAY),
    };
    let dry = s.prune(&w, 2, true).await.unwrap();
    assert_eq!((dry.archived, dry.deleted), (6, 0), "{dry:?}");
    let r = s.prune(&w, 2, false).await.unwrap();
    assert_eq!((r.archived, r.deleted), (6, 0), "{r:?}");
    assert!(r.batches >= 3, "moved in batches of 2: {r:?}");
    assert_eq!(count(&mut su, "SELECT COUNT(*) FROM claims").await, 6);
    assert_eq!(
        count(
            &mut su,
            "SELECT COUNT(*) FROM claims WHERE state IN ('completed', 'failed')"
        )
        .await,
        0,
        "no finished claim is left in claims"
    );
    assert_eq!(
        count(&mut su, "SELECT COUNT(*) FROM claims_archive").await,
        6
    );
    let parts = "SELECT COUNT(*) FROM pg_inherits WHERE inhparent = 'claims_archive'::regclass";
    let months = count(&mut su, parts).await;
    assert!(
        (1..=2).contains(&months),
        "a partition per month of retain_until: {months}"
    );

    // An operator reads it as before: by message, with the history, in listings (open states
    // only list open); the paths that claim and settle (`get`) do not look in the archive.
    assert!(s.get("payments", "", "a0").await.unwrap().is_none());
    let c = s
        .find("payments", "", "a0")
        .await
        .unwrap()
        .expect("archived a0");
    assert_eq!(c.state, ClaimState::Completed);
    let history = s.events(c.id).await.unwrap();
    assert!(
        history.iter().any(|e| e.action == "perform"),
        "the history moved with it: {history:?}"
    );
    let all = ClaimFilter {
        limit: 100,
        ..Default::default()
    };
    assert_eq!(s.list(&all).await.unwrap().len(), 12);
    let started = ClaimFilter {
        state: Some(ClaimState::Started),
        ..all.clone()
    };
    assert_eq!(s.list(&started).await.unwrap().len(), 3);
    let failed = ClaimFilter {
        state: Some(ClaimState::Failed),
        ..all.clone()
    };
    assert_eq!(s.list(&failed).await.unwrap().len(), 3);

    // A data-subject erasure reaches the archive, with its history line.
    let erased = s
        .erase(c.id, "dpo", "DSR-1")
        .await
        .unwrap()
        .expect("erased");
    assert!(erased.erased_utc.is_some());
    let again = s.find("payments", "", "a0").await.unwrap().unwrap();
    assert!(again.erased_utc.is_some());
    assert_eq!(
        s.events(c.id)
            .await
            .unwrap()
            .last()
            .map(|e| e.action.clone()),
        Some("erase".to_string())
    );
    assert!(
        s.erase(c.id, "dpo", "DSR-1").await.unwrap().is_none(),
        "once"
    );

    // The failed claims' retention ended last month: their month is dropped whole.
    exec(
        &mut su,
        "SELECT claimd.claims_archive_months(ARRAY[current_date - 31]);
         UPDATE claims_archive
         SET retain_until = date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
           - interval '15 days'
         WHERE state = 'failed'",
    )
    .await
    .unwrap();
    let r = s.prune(&w, 100, false).await.unwrap();
    assert!(r.archive_months_dropped >= 1, "{r:?}");
    assert_eq!(
        count(
            &mut su,
            "SELECT COUNT(*) FROM claims_archive WHERE state = 'failed'"
        )
        .await,
        0
    );
    assert_eq!(
        count(&mut su, "SELECT COUNT(*) FROM claims_archive").await,
        3
    );
    assert_eq!(s.list(&failed).await.unwrap().len(), 0);

    // Least privilege: the runtime role creates nothing itself, producers (PUBLIC) may not run
    // the partition functions, the runtime role may.
    let mut app = PgConnection::connect(&roles.app_url).await.unwrap();
    let e = exec(&mut app, "CREATE TABLE planted (i int)")
        .await
        .expect_err("no CREATE");
    assert!(e.to_string().contains("permission denied"), "{e}");
    for f in [
        "claimd.claims_archive_months(date[])",
        "claimd.drop_claims_archive_months()",
    ] {
        let can = |who: &str| {
            format!("SELECT has_function_privilege('{who}', '{f}', 'EXECUTE')::int::bigint")
        };
        assert_eq!(count(&mut su, &can("public")).await, 0, "{f} for PUBLIC");
        assert_eq!(
            count(&mut su, &can(&roles.app)).await,
            1,
            "{f} for the runtime role"
        );
    }
    let e = exec(
        &mut app,
        "SELECT claimd.claims_archive_months(ARRAY[current_date + 40000])",
    )
    .await
    .expect_err("a hundred years at most");
    assert!(e.to_string().contains("hundred years"), "{e}");
}

/// Every column of `claims` is in `claims_archive`, in the same order after its own three:
/// the move copies `claims.*` (a migration adding a column to `claims` adds it there too).
#[tokio::test]
async fn the_archive_keeps_every_column_of_claims_postgres() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let _s = open(&store).await;
    let mut c = PgConnection::connect(&store.url()).await.unwrap();
    let cols = |t: &str| {
        format!(
            "SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute \
             WHERE attrelid = '{t}'::regclass AND attnum > 0 AND NOT attisdropped"
        )
    };
    let mut of = async |t: &str| {
        sqlx::query(sqlx::AssertSqlSafe(cols(t)))
            .fetch_one(&mut c)
            .await
            .unwrap()
            .get::<String, _>(0)
    };
    let claims = of("claims").await;
    let archive = of("claims_archive").await;
    assert_eq!(
        archive,
        format!("retain_until,archived_utc,history,{claims}")
    );
}
