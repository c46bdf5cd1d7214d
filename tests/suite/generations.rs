//! Rolling upgrades: an instance whose configuration of a consumer is behind the fleet's
//! (a lower `generation`) takes none of its claims. Running, it stops within a few seconds of
//! a newer instance registering (exit 4, naming the consumer and both generations); started,
//! it refuses to run; the registry keeps the newer generation throughout.

use crate::common;

use common::*;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_behind_a_newer_configuration_stops_and_does_not_start() {
    let Some(store) = TestStore::pg().await else {
        return;
    };
    let (_sb, provider) = sandbox(Default::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let old = config_toml(&store.url(), &consumer_toml("payments", &provider, ""));
    let new = config_toml(
        &store.url(),
        &consumer_toml("payments", &provider, "generation = 1"),
    );
    let mut running_old = ready_worker(&old, dir.path(), "old").await;
    let _running_new = ready_worker(&new, dir.path(), "new").await;

    // The old instance stops by itself, gracefully, with exit 4.
    let since = Instant::now();
    let status = loop {
        if let Some(status) = running_old.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            since.elapsed() < Duration::from_secs(15),
            "the instance behind kept running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(4), "exit 4: superseded");
    let log = std::fs::read_to_string(dir.path().join("old.log")).unwrap();
    assert!(
        log.contains("consumer payments: another instance runs its configuration generation 1; this one has generation 0"),
        "{log}"
    );

    // Started again with the old configuration, it refuses at once.
    let (code, _, err) = cli_with_env(
        &[
            "run",
            "--config",
            dir.path().join("old.toml").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("deploy the newer configuration"), "{err}");

    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&store.url()).await.unwrap();
    let (generation, kind): (i64, String) = sqlx::query_as(
        "SELECT generation, effect_kind FROM claimd_consumers WHERE name = 'payments'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (generation, kind.as_str()),
        (1, "http"),
        "the newer registration stands"
    );
}
