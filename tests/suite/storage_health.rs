//! The store's tables on `/metrics` and in `claimd report`: sizes and rows of `claims`, and a
//! transaction left open in claimd's database named as what holds back vacuum, for as long as
//! it stays open.

use crate::common;

use common::*;
use std::time::Duration;

fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_is_shown_holding_back_vacuum_until_it_ends() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (_sb, provider) = sandbox(Default::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = config_toml(&store.url(), &consumer_toml("payments", &provider, ""));
    let worker = ready_worker(&toml, dir.path(), "storage").await;
    let c = client();
    for i in 0..20 {
        let r = c
            .post(format!("{}/v1/messages/payments", worker.base))
            .header("Idempotency-Key", format!("s{i}"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    let metrics = || async {
        c.get(format!("{}/metrics", worker.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let m = metrics().await;
    assert!(
        sample(&m, "claimd_store_table_bytes{table=\"claims\"}").is_some_and(|b| b > 0.0),
        "{m}"
    );
    assert!(sample(&m, "claimd_store_index_bytes{table=\"claims\"}").is_some_and(|b| b > 0.0));
    assert!(sample(&m, "claimd_store_dead_rows{table=\"claims\"}").is_some());

    // Someone's forgotten transaction in claimd's database.
    use sqlx::Connection;
    let mut forgotten = sqlx::PgConnection::connect(&store.url()).await.unwrap();
    sqlx::raw_sql("SET application_name = 'forgotten'; BEGIN; SELECT txid_current();")
        .execute(&mut forgotten)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // A younger transaction shares its horizon (every snapshot taken meanwhile does, claimd's
    // own too): the older one is still the one named.
    let mut younger = sqlx::PgConnection::connect(&store.url()).await.unwrap();
    sqlx::raw_sql(
        "SET application_name = 'younger'; BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;",
    )
    .execute(&mut younger)
    .await
    .unwrap();
    let m = metrics().await;
    let held = sample(&m, "claimd_store_oldest_transaction_seconds").unwrap();
    assert!(held >= 2.0, "held back for {held} s\n{m}");
    let url = store.url();
    let (code, out, err) = cli_with_env(&["report"], &[("CLAIMD__STORE__URL", url.as_str())]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\nStorage\n"), "{out}");
    assert!(out.contains("  claims: "), "{out}");
    assert!(
        out.contains("oldest open transaction: ")
            && out.contains("(forgotten, idle in transaction)"),
        "{out}"
    );

    // The operator page shows the same, in its "Storage" section.
    let page = c.get(format!("{}/", worker.base)).send().await.unwrap();
    assert!(page.status().is_success(), "{}", page.status());
    let page = page.text().await.unwrap();
    assert!(
        page.contains("<h2>Storage</h2>") && page.contains("(forgotten, idle in transaction)"),
        "{page}"
    );

    sqlx::raw_sql("COMMIT")
        .execute(&mut forgotten)
        .await
        .unwrap();
    drop(forgotten);
    // claimd's own transactions are short: the reading falls back within a moment.
    let cleared = eventually(Duration::from_secs(10), || async {
        let m = metrics().await;
        sample(&m, "claimd_store_oldest_transaction_seconds").is_some_and(|s| s < 1.0)
    })
    .await;
    assert!(cleared, "nothing holds vacuum back once it ended");
}
